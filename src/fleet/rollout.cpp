// The canary policy of docs/fleet.md: the first N live nodes in node-id order get the bundle;
// K `applied` results and no failure within the window let it go to every node; anything else
// halts the rollout and rolls the canaries back.
#include "fleet/controller_impl.hpp"

#include <cubridge/core/detail/printable.hpp>
#include <cubridge/fleet/subjects.hpp>
#include <cubridge/update/rollback_request.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>

namespace cubridge::fleet {
namespace {

using clock = std::chrono::steady_clock;

std::string seconds_text(std::chrono::milliseconds window) {
  const auto ms = window.count();
  return ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
}

// "canary n2 refused v3: stage_refused: smoke test failed".
std::string failure_reason(const result_record& r) {
  return "canary " + r.node + " " + std::string(to_string(r.outcome)) + " v" +
         std::to_string(r.version) + (r.reason.empty() ? "" : ": " + r.reason) +
         (r.detail.empty() ? "" : ": " + r.detail);
}

// Whether the canary runs the version after this result (a duplicate: it ran it already).
bool succeeded(const result_record& r, std::uint64_t version) {
  return r.outcome == gate_outcome::applied ||
         (r.outcome == gate_outcome::duplicate && r.serving_version == version);
}

}  // namespace

result_watch::result_watch(natsConnection* connection, std::string_view module) : module_(module) {
  natsSubscription* raw = nullptr;
  const std::string subject = result_subject(module, "*");
  detail::check(natsConnection_SubscribeSync(&raw, connection, subject.c_str()),
                "natsConnection_SubscribeSync", "subject " + subject);
  subscription_.reset(raw);
  // Once flushed, the server has the subscription: every later result reaches it.
  detail::check(natsConnection_FlushTimeout(connection, 5000), "natsConnection_FlushTimeout",
                "subject " + subject);
}

std::optional<result_record> result_watch::next(clock::time_point deadline) {
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
    if (left <= 0) return std::nullopt;
    natsMsg* raw = nullptr;
    const auto status = natsSubscription_NextMsg(&raw, subscription_.get(), left);
    const detail::message_ptr message(raw);
    if (status == NATS_TIMEOUT) return std::nullopt;
    detail::check(status, "natsSubscription_NextMsg", "results of module " + module_);
    auto record = parse_result_record(detail::message_text(message.get()));
    // A record must come from its own subject: a node cannot speak for another.
    if (record && record->module == module_ &&
        result_subject(record->module, record->node) == natsMsg_GetSubject(message.get()))
      return record;
  }
}

rollout_report controller::rollout(std::span<const std::byte> bundle, std::string_view module,
                                   std::uint64_t version, const canary_policy& policy,
                                   const secret_key& rollback_key) {
  const std::size_t wanted = policy.successes == 0 ? policy.canaries : policy.successes;
  CUBRIDGE_EXPECTS(policy.canaries > 0 && wanted <= policy.canaries,
                   "canary policy: K successes must be 1 to N canaries");
  rollout_report report;
  report.version = version;
  for (const auto& node : nodes())
    if (node.live && report.canaries.size() < policy.canaries)
      report.canaries.push_back(node.beat.node);
  if (report.canaries.size() < policy.canaries)
    cubridge::detail::throw_errc(
        errc::precondition, "rollout",
        std::to_string(report.canaries.size()) + " live node(s) for " +
            std::to_string(policy.canaries) + " canaries of module '" +
            cubridge::detail::printable(module) +
            "' (a node is live with a heartbeat younger than 3 intervals)");

  result_watch watch(impl_->connection.get(), module);  // before publishing: no result is missed
  publish(bundle, module, report.canaries);
  set_desired(module, "canary", version);

  const std::set<std::string> canaries(report.canaries.begin(), report.canaries.end());
  std::set<std::string> applied, failed;
  const auto deadline = clock::now() + policy.window;
  while (applied.size() < wanted && report.halt_reason.empty()) {
    auto record = watch.next(deadline);
    if (!record) break;
    if (!canaries.contains(record->node) || record->version != version) continue;
    if (succeeded(*record, version)) {
      applied.insert(record->node);
    } else if (record->outcome != gate_outcome::duplicate) {
      failed.insert(record->node);
      report.halt_reason = failure_reason(*record);
    }
    report.results.push_back(std::move(*record));
  }
  if (report.halt_reason.empty() && applied.size() < wanted)
    report.halt_reason = std::to_string(applied.size()) + " of " + std::to_string(wanted) +
                         " canary results `applied` within " + seconds_text(policy.window);

  if (report.halt_reason.empty()) {
    publish(bundle, module);
    set_desired(module, "all", version);
    clear_halt(module);
    report.completed = true;
    return report;
  }
  // Halted: recorded first (status shows why even if the rest fails), then undone.
  impl_->put(desired_key(module, "halted"),
             nlohmann::json{{"version", version}, {"reason", report.halt_reason}}.dump());
  set_desired(module, "canary", desired(module, "all").value_or(0));
  for (const auto& node : report.canaries)
    detail::purge_subject(impl_->js.get(), bundle_stream(module),
                          bundle_subject_node(module, node));
  // Every canary that did not fail may have applied it, or may still (its bundle comes before
  // the request in the stream, and an agent handles them in order): one request for all of
  // them, signed `from_version` = this version, which no other node serves.
  for (const auto& node : report.canaries)
    if (!failed.contains(node)) report.rolled_back.push_back(node);
  if (!report.rolled_back.empty())
    rollback(module, sign_rollback_request(module, version, rollback_key));
  return report;
}

std::vector<result_record> controller::wait_for_results(std::string_view module,
                                                        std::uint64_t version,
                                                        std::span<const std::string> nodes,
                                                        std::chrono::milliseconds timeout) {
  result_watch watch(impl_->connection.get(), module);  // first: nothing falls in between
  std::set<std::string> waiting(nodes.begin(), nodes.end());
  std::vector<result_record> seen;
  const auto take = [&](result_record record) {
    if (record.version == version && waiting.erase(record.node) > 0)
      seen.push_back(std::move(record));
  };
  for (auto& record : last_results(module)) take(std::move(record));
  const auto deadline = clock::now() + timeout;
  while (!waiting.empty())
    if (auto record = watch.next(deadline))
      take(std::move(*record));
    else
      break;
  return seen;
}

}  // namespace cubridge::fleet
