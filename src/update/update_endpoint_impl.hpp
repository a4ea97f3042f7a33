#pragma once
// The update endpoint over its policy (update_gate.hpp: verification, the replay floor, the
// sink): the routes and the answers. The set-up, the answers and start/stop are in
// update_endpoint.cpp, the push, rollback, status, metrics, liveness and readiness handlers in
// update_routes.cpp; the HTTP transport under it in http_reception.hpp. Internal to
// cubridge_update; not installed.
#include "http_reception.hpp"
#include "refusal_text.hpp"

#include <cubridge/bundle/bundle.hpp>
#include <cubridge/bundle/rollback_request.hpp>
#include <cubridge/update/module_sink.hpp>
#include <cubridge/update/update_endpoint.hpp>
#include <cubridge/update/update_gate.hpp>
#include <cubridge/update/update_state.hpp>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace cubridge {
namespace endpoint_internal {

using json = nlohmann::json;
constexpr std::string_view modules_prefix = "/v1/modules/";
constexpr std::string_view rollback_suffix = "/rollback";

/// A refusal the endpoint answers: {"error", "detail"} and `extra`, with `status`.
struct refusal {
  int status;
  std::string error;
  std::string detail;
  json extra = json::object();
};

/// The HTTP status of a gate's reason (update_gate.hpp), as update_endpoint.hpp lists them.
int status_of(gate_reason reason);
/// The answer to a refusal for `reason`: its status and its wire spelling, from the one
/// vocabulary (gate_reason.hpp); no token is spelled here.
refusal refusal_for(gate_reason reason, std::string detail);
/// Answers `body` as JSON with `status`.
void answer(httplib::Response& res, int status, const json& body);
void answer(httplib::Response& res, const refusal& r);
// A refusal's bounded detail and the GPU it names, as the gate writes them (refusal_text.hpp).
using update_internal::bounded_detail;
using update_internal::gpu_name;

/// The module name of a /v1/modules/... path (already percent-decoded by httplib); `rollback`
/// tells whether it ended in /rollback.
struct module_path {
  std::string name;
  bool rollback = false;
};
std::optional<module_path> parse_module_path(const std::string& method, std::string_view path);

}  // namespace endpoint_internal

struct update_endpoint::impl {
  using refusal = endpoint_internal::refusal;

  impl(std::shared_ptr<update_gate> g, update_endpoint_options o, bool shared)
      : sink(g->sink()), options(std::move(o)), gate(std::move(g)), shared_gate(shared) {}

  // Per-module notes of the endpoint: the last refusal (the apply lock and the replay memory
  // are the gate's). Created only for modules the sink knows or that got a verified request
  // (module_note), so unauthenticated requests cannot grow it.
  struct module_entry {
    std::mutex text;
    std::string last_refusal;  // status_summary() of the last refusal of a verified request
  };

  module_sink& sink;
  update_endpoint_options options;
  // The policy: verification, replay floor and state, the sink under the module's lock; the
  // endpoint's own, or shared with the node's other doors (shared_gate).
  std::shared_ptr<update_gate> gate;
  bool shared_gate;
  std::unique_ptr<http_internal::http_reception> reception;  // while running
  std::atomic<bool> is_running{false};
  std::atomic<std::uint16_t> bound_port{0};

  std::atomic<std::uint64_t> applied{0}, refused{0}, rolled_back{0}, connections_refused{0},
      open_connections{0};
  // `refused` by reason, for the metrics. Reasons are the code's tokens; past
  // max_refusal_reasons of them (never, unless a new token is added) they count as "other".
  static constexpr std::size_t max_refusal_reasons = 64;
  std::mutex reasons_mutex;
  std::map<std::string, std::uint64_t, std::less<>> refused_by_reason;

  std::mutex entries_mutex;
  std::map<std::string, std::unique_ptr<module_entry>, std::less<>> entries;

  // What a client is told and what the status keeps of a refusal (see refuse()).
  static constexpr std::size_t max_summary_bytes = 256;

  // update_endpoint.cpp: bookkeeping, refusals, set-up, starting.
  module_entry& entry(const std::string& name);
  module_entry* find_entry(std::string_view name);
  static std::string status_summary(std::string_view text);
  void refuse(httplib::Response& res, refusal r, module_entry* e = nullptr);
  void count_refusal(std::string_view reason) noexcept;
  httplib::Server::HandlerResponse pre_route(const httplib::Request& req, httplib::Response& res);
  httplib::Server::HandlerResponse answer_error(httplib::Response& res);
  void answer_exception(httplib::Response& res, const std::exception_ptr& ep);
  void set_up_routes(httplib::Server& s);
  http_internal::reception_options transport_options() const;
  void start_reception();

  // update_routes.cpp: the handlers, each a gate decision answered.
  bool read_body(const httplib::Request& req, httplib::Response& res,
                 const httplib::ContentReader& content, std::size_t limit);
  void put_module(const httplib::Request& req, httplib::Response& res);
  void rollback_module(const httplib::Request& req, httplib::Response& res);
  void refuse_decision(httplib::Response& res, const gate_decision& d, const std::string& name);
  void list_modules(httplib::Response& res);
  void answer_metrics(httplib::Response& res);
  void answer_liveness(httplib::Response& res);
  void answer_readiness(httplib::Response& res);
};

}  // namespace cubridge
