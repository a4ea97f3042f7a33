// The update endpoint's route handlers: push (PUT /v1/modules/{name}), rollback
// (POST /v1/modules/{name}/rollback), each a decision of the gate (update_gate.hpp) answered,
// status (GET /v1/modules), metrics (GET /metrics), liveness and readiness (GET /healthz,
// /readyz); see update_endpoint.hpp for the checks, their order and the answers.
#include "update_endpoint_impl.hpp"

#include <cubridge/core/process_health.hpp>
#include <cubridge/update/metrics_text.hpp>

#include <algorithm>
#include <chrono>
#include <span>
#include <vector>

namespace cubridge {

using endpoint_internal::answer;
using endpoint_internal::bounded_detail;
using endpoint_internal::gpu_name;
using endpoint_internal::json;
using endpoint_internal::parse_module_path;
using endpoint_internal::refusal_for;

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
  refuse(res,
         over ? refusal_for(gate_reason::too_large, "body over " + std::to_string(limit) + " bytes")
              : refusal_for(gate_reason::bad_request, "the body could not be read"));
  return false;
}

// --- push and rollback ------------------------------------------------------------------------

// Answers a gate's refusal with its status and the fields a client may need; noted under the
// module `name` (the URL's) as far as the decision allows (module_note).
void update_endpoint::impl::refuse_decision(httplib::Response& res, const gate_decision& d,
                                            const std::string& name) {
  auto r = refusal_for(d.reason, d.detail);
  switch (d.reason) {
    case gate_reason::wrong_device:
      r.extra = {{"gpu", gpu_name(sink.device_capability())}};
      break;
    case gate_reason::replayed_version:
    case gate_reason::older_version:
      r.extra = {{"current_version", d.serving_version}, {"highest_version", d.highest_version}};
      break;
    case gate_reason::version_mismatch:
      r.extra = {{"current_version", d.serving_version}};
      break;
    default:
      break;
  }
  module_entry* e = nullptr;
  if (d.note == module_note::always) e = &entry(name);
  if (d.note == module_note::if_present) e = find_entry(name);
  refuse(res, std::move(r), e);
}

void update_endpoint::impl::put_module(const httplib::Request& req, httplib::Response& res) {
  const auto path = parse_module_path(req.method, req.path);
  const auto d = gate->push(std::as_bytes(std::span(req.body.data(), req.body.size())), path->name);
  if (d.outcome != gate_outcome::applied) return refuse_decision(res, d, path->name);
  ++applied;
  const auto& m = *d.manifest;
  answer(res, 200,
         {{"promoted", true},
          {"module", m.name},
          {"version", m.version},
          {"previous_version", d.previous_version},
          {"kind", std::string(to_string(m.kind))},
          {"target", m.target}});
}

void update_endpoint::impl::rollback_module(const httplib::Request& req, httplib::Response& res) {
  const auto path = parse_module_path(req.method, req.path);
  const auto d = gate->rollback(req.body, path->name);
  if (d.outcome != gate_outcome::rolled_back) return refuse_decision(res, d, path->name);
  ++rolled_back;
  answer(res, 200,
         {{"rolled_back", true},
          {"module", path->name},
          {"version", d.version},
          {"from_version", d.previous_version}});
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
    m["highest_version"] = std::max(gate->highest_version(r.name), r.current_version);
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

// --- metrics ----------------------------------------------------------------------------------

// Prometheus text: per module a fixed set of lines, then the endpoint's counters (refusals by
// reason: the code's tokens only, so the answer stays bounded whoever asks).
void update_endpoint::impl::answer_metrics(httplib::Response& res) {
  std::vector<module_report> reports;
  try {
    reports = sink.status();
  } catch (const std::exception& x) {
    return answer(res, {500, "status_failed", bounded_detail(x.what())});
  }
  metrics_text_writer out;
  const auto record = process_health();  // nullopt also when poisoned without a record
  write_process_health_metrics(out, process_poisoned(),
                               record ? std::optional(record->at) : std::nullopt);
  write_module_metrics(out, reports);
  out.family("cubridge_update_applied_total", "Pushes applied by the update endpoint.",
             metric_type::counter);
  out.sample(applied.load());
  out.family("cubridge_update_rollbacks_total", "Signed rollbacks done by the update endpoint.",
             metric_type::counter);
  out.sample(rolled_back.load());
  out.family("cubridge_update_refused_total",
             "Requests the update endpoint refused, by reason (the error of the answer).",
             metric_type::counter);
  {
    std::lock_guard lock(reasons_mutex);
    for (const auto& [reason, n] : refused_by_reason) out.sample(n, {{"reason", reason}});
  }
  out.family("cubridge_update_connections_refused_total",
             "Connections and requests answered 503 busy by the transport.", metric_type::counter);
  out.sample(connections_refused.load());
  out.family("cubridge_update_open_connections", "Connections the update endpoint holds now.",
             metric_type::gauge);
  out.sample(open_connections.load());
  res.status = 200;
  res.set_content(std::move(out).str(), std::string(metrics_text_content_type));
}

// --- liveness and readiness -------------------------------------------------------------------

namespace {

// The 503 of GET /readyz: what poisoned the process, when, and what served then (the suspects).
json poisoned_body(const std::optional<poison_record>& record) {
  // Poisoned without a record: the record could not be built (no memory); the flag still holds.
  if (!record)
    return {{"status", "poisoned"},
            {"error", nullptr},
            {"call", nullptr},
            {"since", nullptr},
            {"running", json::array()}};
  json running = json::array();
  for (const auto& v : record->running)
    running.push_back({{"module", v.module},
                       {"label", v.label},
                       {"version_id", v.version_id},
                       {"kernel", v.kernel.empty() ? json(nullptr) : json(v.kernel)}});
  return {{"status", "poisoned"},
          {"error", record->error_name},
          {"call", record->call},
          {"since", detail::format_time(std::chrono::floor<std::chrono::seconds>(record->at))},
          {"running", std::move(running)}};
}

}  // namespace

// Liveness: the process answers. A poisoned process is still live; its supervisor decides by
// /readyz or by the exit policy (exit_when_poisoned), so that a restart loop never starts from
// a probe alone.
void update_endpoint::impl::answer_liveness(httplib::Response& res) {
  answer(res, 200, {{"status", "live"}});
}

// Readiness: the flag (one load), then the driver asked about the sink's contexts, so that the
// first probe after a fault answers 503 even when no call has returned the error yet. Takes no
// gate lock; the sink's only for a copy of its contexts.
void update_endpoint::impl::answer_readiness(httplib::Response& res) {
  if (!process_poisoned() && !sink.probe_health()) return answer(res, 200, {{"status", "ready"}});
  answer(res, 503, poisoned_body(process_health()));
}

}  // namespace cubridge
