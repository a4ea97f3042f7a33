// The update endpoint's route handlers: push (PUT /v1/modules/{name}), rollback
// (POST /v1/modules/{name}/rollback) and status (GET /v1/modules); see update_endpoint.hpp for
// the checks, their order and the answers.
#include "update_endpoint_impl.hpp"

#include <cubridge/core/image.hpp>

#include <algorithm>
#include <span>
#include <vector>

namespace cubridge {

using endpoint_internal::answer;
using endpoint_internal::gpu_name;
using endpoint_internal::json;
using endpoint_internal::parse_module_path;
using endpoint_internal::refusal_of;

// Reads the body through httplib's content reader, counting it against `limit` (the
// reception thread checked its Content-Length already; this is a second wall), into the
// request's body: httplib hands handlers its own request (a local of process_request) as const.
// Through the content reader, httplib never parses a body as a form (which it refused over
// 8 KiB with a false 413) whatever the Content-Type.
bool update_endpoint::impl::read_body(const httplib::Request& req, httplib::Response& res,
                                      const httplib::ContentReader& content, std::size_t limit) {
  auto& body = const_cast<httplib::Request&>(req).body;
  bool over = false;
  const bool read = content([&](const char* data, std::size_t size) {
    over = size > limit - body.size();
    if (!over) body.append(data, size);
    return !over;
  });
  if (read) return true;
  http_internal::close_after_response();
  refuse(res, over ? refusal{413, "too_large", "body over " + std::to_string(limit) + " bytes"}
                   : refusal{400, "bad_request", "the body could not be read"});
  return false;
}

// --- push -------------------------------------------------------------------------------------

// Whether `bundle`'s payload runs on the sink's device.
std::optional<update_endpoint::impl::refusal> update_endpoint::impl::check_device(
    const verified_bundle& bundle) const {
  const auto device = sink.device_capability();
  if (!device) return std::nullopt;
  const auto& m = bundle.manifest;
  bool runs = false;
  if (m.kind == payload_kind::cuda_source) {
    // Compiled here for exactly this device.
    runs = m.target_capability.numbers() == device->numbers();
  } else if (bundle.image) {  // as verify_bundle inspected it: not parsed again
    try {
      runs = can_run_on(*bundle.image, *device);
    } catch (const std::exception&) {
      runs = false;
    }
  }
  if (runs) return std::nullopt;
  return refusal{422,
                 "wrong_device",
                 "module '" + m.name + "' v" + std::to_string(m.version) + " targets " + m.target +
                     ", this service's GPU is " + gpu_name(device),
                 {{"gpu", gpu_name(device)}}};
}

void update_endpoint::impl::put_module(const httplib::Request& req, httplib::Response& res) {
  const auto path = parse_module_path(req.method, req.path);
  const std::string& name = path->name;
  const auto bundle = verify_push(req, res);
  if (!bundle) return;
  const auto& m = bundle->manifest;
  if (m.name != name)
    return refuse(res,
                  {400, "name_mismatch",
                   "URL names module '" + name + "', the signed manifest '" + m.name + "'"},
                  find_entry(name));
  auto& e = entry(name);  // the bundle is signed by a trusted key: worth remembering
  if (auto r = check_device(*bundle)) return refuse(res, *r, &e);

  std::lock_guard serial(e.apply);
  // The serving version is the module's (the sink reads it from the module's chain, whoever
  // promoted); the replay state is the floor: the highest version ever seen applied.
  const std::uint64_t current = sink.current_version(name);
  const std::uint64_t highest = state.highest_version(name);  // applied before, or a floor
  const std::uint64_t seen = std::max(current, highest);
  if (m.version <= seen) {
    if (current > highest) keep_floor(name, current);
    return refuse(res,
                  {409,
                   m.version == seen ? "replayed_version" : "older_version",
                   "module '" + name + "' v" + std::to_string(m.version) + " is not above v" +
                       std::to_string(seen) +
                       (seen == current ? " (serving)" : " (applied before, or the floor)"),
                   {{"current_version", current}, {"highest_version", seen}}},
                  &e);
  }
  // Recorded (and with a state file written) before the sink sees it: a version that may
  // have been applied is never accepted again, even after a crash between apply and answer.
  try {
    state.store_highest_version(name, m.version);
  } catch (const std::exception& x) {
    return refuse(res, {500, "state_failed", x.what()}, &e);
  }
  answer_push(res, apply_recorded(*bundle, current, seen), m, current, e);
}

// The size check and verify_bundle; nothing when refused (answered in `res`).
std::optional<verified_bundle> update_endpoint::impl::verify_push(const httplib::Request& req,
                                                                  httplib::Response& res) {
  if (req.body.size() > options.max_body_bytes) {
    refuse(res, {413, "too_large",
                 std::to_string(req.body.size()) + " bytes, limit " +
                     std::to_string(options.max_body_bytes)});
    return std::nullopt;
  }
  try {
    verify_limits limits;
    limits.max_bundle_bytes = options.max_body_bytes;
    limits.now = now();
    limits.require_expiry = options.require_expiry;
    limits.max_age = options.max_bundle_age;
    return verify_bundle(std::as_bytes(std::span(req.body.data(), req.body.size())), options.keys,
                         limits);
  } catch (const bundle_error& e) {
    // Not stored under the module's name: the request is not (wholly) verified.
    refuse(res, refusal_of(e));
  } catch (const std::exception& e) {
    refuse(res, {400, "bad_request", e.what()});
  }
  return std::nullopt;
}

// A version promoted past the endpoint (a hot_reloader, a direct promote) is a floor too: kept
// even after a rollback below it. Best effort; the refusal it comes with stands either way.
void update_endpoint::impl::keep_floor(const std::string& name, std::uint64_t current) {
  try {
    state.store_highest_version(name, current);
  } catch (const std::exception&) {
  }
}

// Hands the bundle, its version recorded already, to the sink. Not applied, the same version
// may come again, so the record goes back to `seen` (the serving version if that was higher);
// should that write fail, the version stays refused (the safe side), and the detail says so.
sink_result update_endpoint::impl::apply_recorded(const verified_bundle& bundle,
                                                  std::uint64_t current, std::uint64_t seen) {
  const auto& m = bundle.manifest;
  sink_result result;
  try {
    result = sink.apply(bundle);
  } catch (const std::exception& x) {
    result = {sink_outcome::failed, current, std::string("sink threw: ") + x.what()};
  } catch (...) {
    result = {sink_outcome::failed, current, "sink threw a non-standard exception"};
  }
  if (result.outcome != sink_outcome::done) {
    try {
      state.store_highest_version(m.name, seen);
    } catch (const std::exception& x) {
      result.detail +=
          std::string(" (v") + std::to_string(m.version) + " stays refused: " + x.what() + ")";
    }
  }
  return result;
}

void update_endpoint::impl::answer_push(httplib::Response& res, const sink_result& result,
                                        const bundle_manifest& m, std::uint64_t current,
                                        module_entry& e) {
  switch (result.outcome) {
    case sink_outcome::done:
      ++applied;
      return answer(res, 200,
                    {{"promoted", true},
                     {"module", m.name},
                     {"version", m.version},
                     {"previous_version", current},
                     {"kind", std::string(to_string(m.kind))},
                     {"target", m.target}});
    case sink_outcome::unknown_module:
      return refuse(res, {404, "unknown_module", result.detail}, &e);
    case sink_outcome::rejected:
      return refuse(res, {422, "stage_refused", result.detail}, &e);
    case sink_outcome::no_previous_version:
    case sink_outcome::failed:
      break;
  }
  refuse(res, {500, "apply_failed", result.detail}, &e);
}

// --- rollback ---------------------------------------------------------------------------------

void update_endpoint::impl::rollback_module(const httplib::Request& req, httplib::Response& res) {
  const auto path = parse_module_path(req.method, req.path);
  const std::string& name = path->name;
  const auto request = verify_rollback(req, res, name);
  if (!request) return;
  if (!fresh_rollback(res, *request, std::chrono::floor<std::chrono::seconds>(this->now()))) return;
  const std::uint64_t known = sink.current_version(name);
  module_entry* e = find_entry(name);
  if (!e && known == 0) return refuse(res, {404, "unknown_module", "no module '" + name + "'"});
  if (!e) e = &entry(name);
  std::lock_guard serial(e->apply);
  const std::uint64_t current = sink.current_version(name);
  if (request->from_version != current)
    return refuse(res,
                  {409,
                   "version_mismatch",
                   "request rolls back from v" + std::to_string(request->from_version) + ", v" +
                       std::to_string(current) + " serves",
                   {{"current_version", current}}},
                  e);
  // The version rolled back from was applied, by the endpoint or past it: it is the floor
  // from now on (recorded before the sink is called, as for a push).
  if (current > state.highest_version(name)) {
    try {
      state.store_highest_version(name, current);
    } catch (const std::exception& x) {
      return refuse(res, {500, "state_failed", x.what()}, e);
    }
  }
  sink_result result;
  try {
    result = sink.rollback(name);
  } catch (const std::exception& x) {
    result = {sink_outcome::failed, current, std::string("sink threw: ") + x.what()};
  }
  answer_rollback(res, result, name, current, *e);
}

// verify_rollback_request and the URL's name = the signed name; nothing when refused.
std::optional<rollback_request> update_endpoint::impl::verify_rollback(const httplib::Request& req,
                                                                       httplib::Response& res,
                                                                       const std::string& name) {
  rollback_request request;
  try {
    request = verify_rollback_request(req.body, options.keys);
  } catch (const bundle_error& e) {
    refuse(res, refusal_of(e));  // not verified: not stored under the module's name
    return std::nullopt;
  } catch (const std::exception& e) {
    refuse(res, {400, "bad_request", e.what()});
    return std::nullopt;
  }
  if (request.module != name) {
    refuse(res,
           {400, "name_mismatch",
            "URL names module '" + name + "', the signed request '" + request.module + "'"},
           find_entry(name));
    return std::nullopt;
  }
  return request;
}

// Whether `request` was created within the rollback window of `now` and its nonce is new
// (then remembered); refused otherwise.
bool update_endpoint::impl::fresh_rollback(httplib::Response& res, const rollback_request& request,
                                           std::chrono::sys_seconds now) {
  const std::string& name = request.module;
  const auto skew = request.created > now ? request.created - now : now - request.created;
  if (skew > options.rollback_window) {
    refuse(res,
           {403, "expired_request",
            "request created " + detail::format_time(request.created) + ", endpoint time " +
                detail::format_time(now) + ", window " +
                std::to_string(options.rollback_window.count()) + " s"},
           find_entry(name));
    return false;
  }
  // A nonce is remembered (and with a state file written, before anything is done) while its
  // request could still be fresh; older ones are dropped.
  nonce_outcome fresh = nonce_outcome::full;
  try {
    fresh = state.remember_nonce(request.nonce, request.created, now - 2 * options.rollback_window,
                                 max_nonces);
  } catch (const std::exception& x) {
    refuse(res, {500, "state_failed", x.what()}, find_entry(name));
    return false;
  }
  if (fresh == nonce_outcome::replayed) {
    refuse(res, {409, "replayed_request", "nonce " + request.nonce + " was used before"},
           find_entry(name));
    return false;
  }
  if (fresh == nonce_outcome::full) {
    refuse(res, {503, "busy", "too many rollback requests in the window"});
    return false;
  }
  return true;
}

void update_endpoint::impl::answer_rollback(httplib::Response& res, const sink_result& result,
                                            const std::string& name, std::uint64_t current,
                                            module_entry& e) {
  switch (result.outcome) {
    case sink_outcome::done:
      ++rolled_back;
      return answer(res, 200,
                    {{"rolled_back", true},
                     {"module", name},
                     {"version", result.version},
                     {"from_version", current}});
    case sink_outcome::unknown_module:
      return refuse(res, {404, "unknown_module", result.detail}, &e);
    case sink_outcome::no_previous_version:
      return refuse(res, {409, "no_previous_version", result.detail}, &e);
    case sink_outcome::rejected:
      return refuse(res, {422, "stage_refused", result.detail}, &e);
    case sink_outcome::failed:
      break;
  }
  refuse(res, {500, "apply_failed", result.detail}, &e);
}

// --- status -----------------------------------------------------------------------------------

void update_endpoint::impl::list_modules(httplib::Response& res) {
  std::vector<module_report> reports;
  try {
    reports = sink.status();
  } catch (const std::exception& x) {
    return answer(res, {500, "status_failed", bounded_detail(x.what())});
  }
  json modules = json::array();
  for (const auto& r : reports) {
    json m{{"name", r.name},
           {"current_version", r.current_version},
           {"versions_held", r.versions_held},
           {"in_flight", r.in_flight},
           {"last_error", r.last_error.empty() ? json(nullptr) : json(r.last_error)}};
    m["highest_version"] = std::max(state.highest_version(r.name), r.current_version);
    if (auto* e = find_entry(r.name)) {
      std::lock_guard lock(e->text);
      m["last_refusal"] = e->last_refusal.empty() ? json(nullptr) : json(e->last_refusal);
    } else {
      m["last_refusal"] = nullptr;
    }
    modules.push_back(std::move(m));
  }
  const auto device = sink.device_capability();
  answer(res, 200,
         {{"gpu", device ? json(gpu_name(device)) : json(nullptr)},
          {"modules", std::move(modules)},
          {"endpoint",
           {{"applied", applied.load()},
            {"refused", refused.load()},
            {"rolled_back", rolled_back.load()},
            {"connections_refused", connections_refused.load()}}}});
}

}  // namespace cubridge
