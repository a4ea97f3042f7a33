// The update endpoint's policy: routes and answers over the HTTP transport (http_reception.hpp),
// refusals and the per-module bookkeeping, start and stop; the handlers of each route are in
// update_routes.cpp. See update_endpoint.hpp.
#include "update_endpoint_impl.hpp"

#include <cubridge/bundle/detail/signing.hpp>
#include <cubridge/core/detail/printable.hpp>

#include <algorithm>
#include <exception>
#include <map>

namespace cubridge {

using update_internal::bounded_detail;
namespace {

using endpoint_internal::answer;
using endpoint_internal::modules_prefix;
using endpoint_internal::parse_module_path;
using endpoint_internal::rollback_suffix;

// The largest body of a request to `path` (percent-decoded, as httplib routes it): what the
// route reads, 0 for the routes that take none.
std::size_t body_limit(std::string_view method, std::string_view path, std::size_t max_body) {
  if (!path.starts_with(modules_prefix)) return 0;
  if (method == "PUT") return max_body;
  if (method == "POST" && path.ends_with(rollback_suffix)) return max_rollback_request_bytes;
  return 0;
}

}  // namespace

// --- answers ----------------------------------------------------------------------------------

namespace endpoint_internal {

int status_of(gate_reason reason) {
  switch (reason) {
    case gate_reason::none:
      return 200;
    case gate_reason::unsigned_bundle:
      return 401;
    case gate_reason::unknown_key:
    case gate_reason::bad_signature:
    case gate_reason::expired_bundle:
    case gate_reason::payload_mismatch:
    case gate_reason::expired_request:
      return 403;
    case gate_reason::unknown_module:
      return 404;
    case gate_reason::replayed_version:
    case gate_reason::older_version:
    case gate_reason::replayed_request:
    case gate_reason::version_mismatch:
    case gate_reason::no_previous_version:
      return 409;
    case gate_reason::too_large:
      return 413;
    case gate_reason::payload_kind_mismatch:
    case gate_reason::target_mismatch:
    case gate_reason::wrong_device:
    case gate_reason::stage_refused:
    case gate_reason::faulted_in_probation:
    case gate_reason::mismatch_in_probation:
    case gate_reason::probation_incomplete:
    case gate_reason::known_bad:
    case gate_reason::sticky_error:
      return 422;
    case gate_reason::apply_failed:
    case gate_reason::state_failed:
      return 500;
    case gate_reason::busy:
    case gate_reason::not_started:
      return 503;  // a shared gate never started: start() starts it
    // The request's fault.
    case gate_reason::bad_magic:
    case gate_reason::unsupported_version:
    case gate_reason::malformed:
    case gate_reason::malformed_manifest:
    case gate_reason::invalid_manifest:
    case gate_reason::bad_key:
    case gate_reason::name_mismatch:
    case gate_reason::bad_request:
      return 400;
  }
  return 400;
}

refusal refusal_for(gate_reason reason, std::string detail) {
  return {status_of(reason), std::string(to_string(reason)), std::move(detail)};
}

void answer(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace) + "\n",
                  "application/json");
}

void answer(httplib::Response& res, const refusal& r) {
  json body = r.extra;
  body["error"] = r.error;
  body["detail"] = r.detail;
  answer(res, r.status, body);
}

std::optional<module_path> parse_module_path(const std::string& method, std::string_view path) {
  if (!path.starts_with(modules_prefix)) return std::nullopt;
  module_path out;
  path.remove_prefix(modules_prefix.size());
  if (method == "POST" && path.ends_with(rollback_suffix)) {
    path.remove_suffix(rollback_suffix.size());
    out.rollback = true;
  }
  out.name = std::string(path);
  return out;
}

}  // namespace endpoint_internal

// --- bookkeeping and refusals -----------------------------------------------------------------

update_endpoint::impl::module_entry& update_endpoint::impl::entry(const std::string& name) {
  std::lock_guard lock(entries_mutex);
  auto& slot = entries[name];
  if (!slot) slot = std::make_unique<module_entry>();
  return *slot;
}

update_endpoint::impl::module_entry* update_endpoint::impl::find_entry(std::string_view name) {
  std::lock_guard lock(entries_mutex);
  const auto it = entries.find(name);
  return it == entries.end() ? nullptr : it->second.get();
}

// What the status keeps of a refusal: printable ASCII, with '\' as "\\" and every other
// byte (control characters, terminal escapes, UTF-8) as "\xnn", at most max_summary_bytes
// with the "..." of a cut.
std::string update_endpoint::impl::status_summary(std::string_view text) {
  return detail::printable(text, {.max_bytes = max_summary_bytes - 3,
                                  .quoted = false,
                                  .escape = detail::printable_escape::c_string,
                                  .cut = detail::printable_cut::ellipsis});
}

// Answers a refusal, its detail bounded. With `e`, also the module's last_refusal: pass it only
// for requests that passed signature verification (else anyone could write there).
void update_endpoint::impl::refuse(httplib::Response& res, refusal r, module_entry* e) {
  ++refused;
  count_refusal(r.error);
  r.detail = bounded_detail(std::move(r.detail));
  if (e) {
    auto summary = status_summary(std::to_string(r.status) + " " + r.error + ": " + r.detail);
    std::lock_guard lock(e->text);
    e->last_refusal = std::move(summary);
  }
  answer(res, r);
}

void update_endpoint::impl::count_refusal(std::string_view reason) noexcept {
  try {
    std::lock_guard lock(reasons_mutex);
    auto it = refused_by_reason.find(reason);
    if (it == refused_by_reason.end())
      it = refused_by_reason
               .try_emplace(refused_by_reason.size() < max_refusal_reasons ? std::string(reason)
                                                                           : "other")
               .first;
    ++it->second;
  } catch (...) {
    // Out of memory: the total in `refused` still counts it.
  }
}

// --- set-up -----------------------------------------------------------------------------------

// Refuses what may not name a module before anything else looks at the request.
httplib::Server::HandlerResponse update_endpoint::impl::pre_route(const httplib::Request& req,
                                                                  httplib::Response& res) {
  const auto path = parse_module_path(req.method, req.path);
  if (!path) return httplib::Server::HandlerResponse::Unhandled;
  if (auto problem = check_module_name(path->name); !problem.empty()) {
    http_internal::close_after_response();  // the body is not read
    refuse(res, {400, "bad_name", "module name refused: " + problem});
    return httplib::Server::HandlerResponse::Handled;
  }
  return httplib::Server::HandlerResponse::Unhandled;
}

// Answers httplib produces itself (404, 400 unparsable, 414; 413 cannot happen behind the
// reception thread's checks) get a JSON body like ours; answers that have one keep it.
httplib::Server::HandlerResponse update_endpoint::impl::answer_error(httplib::Response& res) {
  if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
  std::string error = "bad_request";
  if (res.status == 404) error = "not_found";
  if (res.status == 413) error = "too_large";
  if (res.status == 414) error = "uri_too_long";
  if (res.status == 413) http_internal::close_after_response();
  answer(res, {res.status, error, "HTTP " + std::to_string(res.status) + " for this request"});
  if (res.status != 404) {
    ++refused;
    count_refusal(error);
  }
  return httplib::Server::HandlerResponse::Handled;
}

void update_endpoint::impl::answer_exception(httplib::Response& res, const std::exception_ptr& ep) {
  std::string what = "unknown exception";
  try {
    if (ep) std::rethrow_exception(ep);
  } catch (const std::exception& x) {
    what = x.what();
  } catch (...) {
  }
  ++refused;
  count_refusal("internal_error");
  answer(res, {500, "internal_error", bounded_detail(std::move(what))});
}

void update_endpoint::impl::set_up_routes(httplib::Server& s) {
  s.set_payload_max_length(options.max_body_bytes);
  s.set_pre_routing_handler(
      [this](const httplib::Request& req, httplib::Response& res) { return pre_route(req, res); });
  s.Get("/v1/modules",
        [this](const httplib::Request&, httplib::Response& res) { list_modules(res); });
  if (options.serve_metrics)
    s.Get("/metrics",
          [this](const httplib::Request&, httplib::Response& res) { answer_metrics(res); });
  // Always served, without a key: a load balancer's and Kubernetes' probes
  // (docs/update-endpoint.md, "Liveness and readiness"); bodiless, as body_limit() says for every
  // path outside /v1/modules/.
  s.Get("/healthz",
        [this](const httplib::Request&, httplib::Response& res) { answer_liveness(res); });
  s.Get("/readyz",
        [this](const httplib::Request&, httplib::Response& res) { answer_readiness(res); });
  s.Put("/v1/modules/(.+)", httplib::Server::HandlerWithContentReader(
                                [this](const httplib::Request& req, httplib::Response& res,
                                       const httplib::ContentReader& content) {
                                  if (read_body(req, res, content, options.max_body_bytes))
                                    put_module(req, res);
                                }));
  s.Post("/v1/modules/(.+)/rollback",
         httplib::Server::HandlerWithContentReader([this](const httplib::Request& req,
                                                          httplib::Response& res,
                                                          const httplib::ContentReader& content) {
           if (read_body(req, res, content, max_rollback_request_bytes)) rollback_module(req, res);
         }));
  s.set_error_handler(httplib::Server::HandlerWithResponse(
      [this](const httplib::Request&, httplib::Response& res) { return answer_error(res); }));
  s.set_exception_handler([this](const httplib::Request&, httplib::Response& res,
                                 const std::exception_ptr& ep) { answer_exception(res, ep); });
}

// What the transport needs of the options, and the body each route takes.
http_internal::reception_options update_endpoint::impl::transport_options() const {
  http_internal::reception_options o;
  o.bind_address = options.bind_address;
  o.port = options.port;
  o.listen_backlog = options.listen_backlog;
  o.tls_certificate = options.tls_certificate;
  o.tls_private_key = options.tls_private_key;
  o.threads = options.threads;
  o.max_queued_connections = options.max_queued_connections;
  o.max_connections = options.max_connections;
  o.max_buffered_body_bytes = options.max_buffered_body_bytes;
  o.max_header_bytes = options.max_header_bytes;
  o.max_header_count = options.max_header_count;
  o.read_timeout = options.read_timeout;
  o.write_timeout = options.write_timeout;
  o.request_timeout = options.request_timeout;
  o.keep_alive_timeout = options.keep_alive_timeout;
  o.keep_alive_max_requests = options.keep_alive_max_requests;
  o.body_limit = [max_body = options.max_body_bytes](std::string_view method,
                                                     std::string_view path) {
    return body_limit(method, path, max_body);
  };
  return o;
}

void update_endpoint::impl::start_reception() {
  reception = std::make_unique<http_internal::http_reception>(
      transport_options(), [this](httplib::Server& s) { set_up_routes(s); },
      http_internal::reception_counters{
          refused, connections_refused, open_connections,
          [this](std::string_view reason) { count_refusal(reason); }});
  bound_port = reception->port();
}

// --- the endpoint -----------------------------------------------------------------------------

update_gate_options update_endpoint_options::gate_options() const {
  update_gate_options o;
  o.keys = keys;
  o.max_bundle_bytes = max_body_bytes;
  o.state_file = state_file;
  o.persist_state = persist_state;
  o.version_floor = version_floor;
  o.require_expiry = require_expiry;
  o.max_bundle_age = max_bundle_age;
  o.rollback_window = rollback_window;
  o.clock = clock;
  return o;
}

namespace {

// The gate an endpoint is given, checked before anything dereferences it.
std::shared_ptr<update_gate> given(std::shared_ptr<update_gate> gate) {
  CUBRIDGE_EXPECTS(gate != nullptr, "update_endpoint needs an update_gate");
  return gate;
}

}  // namespace

update_endpoint::update_endpoint(std::shared_ptr<module_sink> sink, update_endpoint_options options)
    : impl_(std::make_unique<impl>(update_gate::create(std::move(sink), options.gate_options()),
                                   std::move(options), false)) {}

update_endpoint::update_endpoint(std::shared_ptr<update_gate> gate, update_endpoint_options options)
    : impl_(std::make_unique<impl>(given(std::move(gate)), std::move(options), true)) {}

update_endpoint::~update_endpoint() {
  stop();
}

void update_endpoint::start() {
  auto& d = *impl_;
  CUBRIDGE_EXPECTS(!d.is_running, "update endpoint already running");
  CUBRIDGE_EXPECTS(d.options.threads > 0, "update_endpoint_options::threads is 0");
  CUBRIDGE_EXPECTS(d.options.keep_alive_max_requests > 0,
                   "update_endpoint_options::keep_alive_max_requests is 0");
  CUBRIDGE_EXPECTS(d.options.request_timeout.count() > 0 && d.options.read_timeout.count() > 0 &&
                       d.options.write_timeout.count() > 0 &&
                       d.options.keep_alive_timeout.count() > 0,
                   "update_endpoint_options timeouts must be positive");
  CUBRIDGE_EXPECTS(d.options.max_connections > 0, "update_endpoint_options::max_connections is 0");
  CUBRIDGE_EXPECTS(d.options.max_header_bytes > 0 && d.options.max_header_count > 0,
                   "update_endpoint_options::max_header_bytes and max_header_count must be "
                   "positive");
  CUBRIDGE_EXPECTS(d.options.max_buffered_body_bytes >=
                       std::max(d.options.max_body_bytes, max_rollback_request_bytes),
                   "update_endpoint_options::max_buffered_body_bytes (" +
                       std::to_string(d.options.max_buffered_body_bytes) +
                       ") is below max_body_bytes (" + std::to_string(d.options.max_body_bytes) +
                       ") or a rollback request's 4096: such a body could never be received");
  if (d.shared_gate) {
    // The shared gate's policy serves; these would be ignored without a word.
    std::string ignored;
    if (d.options.keys.size() > 0) ignored += " keys";
    if (!d.options.state_file.empty()) ignored += " state_file";
    if (!d.options.version_floor.empty()) ignored += " version_floor";
    CUBRIDGE_EXPECTS(ignored.empty(), "update_endpoint over a shared update_gate: the options set" +
                                          ignored +
                                          ", which are the gate's policy (update_gate_options)");
  }
  for (const auto& [name, floor] : d.options.version_floor)
    CUBRIDGE_EXPECTS(
        check_module_name(name).empty() && detail::check_signed_text(name).empty(),
        "update_endpoint_options::version_floor names no module: " + detail::printable(name));
  d.gate->start();  // the replay state, before anything listens (nothing if started already)
  const bool want_tls = !d.options.tls_certificate.empty() || !d.options.tls_private_key.empty();
  if (want_tls)
    CUBRIDGE_EXPECTS(!d.options.tls_certificate.empty() && !d.options.tls_private_key.empty(),
                     "TLS needs both tls_certificate and tls_private_key");
  d.start_reception();  // TLS context, binding, threads
  d.is_running = true;
}

void update_endpoint::stop() noexcept {
  auto& d = *impl_;
  if (!d.reception) return;
  d.reception.reset();  // closes every connection and joins every thread
  d.is_running = false;
  d.bound_port = 0;
}

bool update_endpoint::running() const noexcept {
  return impl_->is_running;
}

std::uint16_t update_endpoint::port() const noexcept {
  return impl_->bound_port;
}

std::string update_endpoint::url() const {
  if (!impl_->is_running) return {};
  std::string host = impl_->options.bind_address;
  if (host == "0.0.0.0") host = "127.0.0.1";
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  return (impl_->reception->tls() ? "https://" : "http://") + host + ":" + std::to_string(port());
}

update_endpoint_stats update_endpoint::stats() const noexcept {
  return {impl_->applied, impl_->refused, impl_->rolled_back, impl_->connections_refused,
          impl_->open_connections};
}

}  // namespace cubridge
