// Publishing, the canary policy and rollback (controller.hpp, docs/fleet.md): each a change of a
// module's desired state by compare-and-set. Nodes act on the state, not on these calls: a
// publish that stored its bundle and wrote its record is done whatever happens to this process.
#include "fleet/controller_impl.hpp"
#include "fleet/rollout_steps.hpp"

#include <cubridge/bundle/detail/signing.hpp>
#include <cubridge/core/detail/printable.hpp>
#include <cubridge/fleet/signed_record.hpp>
#include <cubridge/fleet/subjects.hpp>

#include <nats/nats.h>

#include <algorithm>
#include <set>
#include <span>

namespace cubridge::fleet {
using namespace rollout_steps;

rollout_report controller::publish(std::span<const std::byte> bytes,
                                   const secret_key& operator_key) {
  auto& d = *impl_;
  const auto keys = d.keys_with(operator_key);
  const auto p = prepare(bytes, keys);
  const auto& module = p.module();
  rollout_report report;
  report.version = p.ref.version;
  // The same payload signed again: nothing stored, nothing written.
  if (const auto current = d.read_desired(module, keys))
    if (same_payload_desired(d.js.get(), current->state, p, keys)) {
      report.already_desired = report.completed = true;
      report.desired = current->state;
      return report;
    }
  d.store_bundle(module, p.ref, bytes);
  d.write_desired(module, [&](const auto& current) {
    auto s = parse_current(current, module, keys);
    report.already_desired = desired_everywhere(s, p.ref);
    if (report.already_desired) {
      report.desired = s;
      return current->value;  // the same value: a retried publish writes nothing new
    }
    if (!(s.phase == rollout_phase::canary && s.candidate == p.ref)) require_newer(s, p.ref);
    make_stable(s, p.ref);
    auto value = sign_next_revision(s, d.bucket.get(), keys, operator_key);
    report.desired = s;
    return value;
  });
  report.completed = true;
  return report;
}

rollout_report controller::rollout(std::span<const std::byte> bytes, const canary_policy& policy,
                                   const secret_key& operator_key) {
  auto& d = *impl_;
  const std::size_t wanted = policy.successes == 0 ? policy.canaries : policy.successes;
  CUBRIDGE_EXPECTS(
      policy.canaries > 0 && wanted <= policy.canaries && policy.canaries <= max_desired_canaries,
      "canary policy: 1 to 10,000 canaries, K successes 1 to N");
  CUBRIDGE_EXPECTS(policy.window.count() > 0, "canary policy: the window must be positive");
  const auto keys = d.keys_with(operator_key);
  const auto p = prepare(bytes, keys);
  const auto& module = p.module();
  rollout_report report;
  report.version = p.ref.version;
  const auto registry = this->registry();
  const auto eligible = eligible_canaries(nodes(), p, policy.cohort);

  result_watch watch(d.connection.get(), module, registry);  // first: no result is missed
  d.store_bundle(module, p.ref, bytes);
  d.write_desired(module, [&](const auto& current) {
    auto s = parse_current(current, module, keys);
    if (s.phase == rollout_phase::canary && s.candidate == p.ref) {  // resumed
      report.canaries = s.canaries;
      report.desired = s;
      return current->value;
    }
    if (desired_everywhere(s, p.ref)) {
      report.already_desired = true;
      report.desired = s;
      return current->value;
    }
    require_newer(s, p.ref);
    require_enough(eligible, policy, p);
    report.canaries.assign(eligible.begin(),
                           eligible.begin() + static_cast<std::ptrdiff_t>(policy.canaries));
    enter_canary_phase(s, p.ref, report.canaries);
    auto value = sign_next_revision(s, d.bucket.get(), keys, operator_key);
    report.desired = s;
    return value;
  });
  if (report.already_desired) {
    report.completed = true;
    return report;
  }

  const auto deadline = steady::now() + policy.window;
  canary_tally tally{report, p.ref.digest};
  collect_canary_results(d.js.get(), watch, module, registry, tally, wanted, deadline,
                         policy.window, [] { return true; });
  if (report.halt_reason.empty() && tally.applied.size() < wanted)
    report.halt_reason = std::to_string(tally.applied.size()) + " of " + std::to_string(wanted) +
                         " canary results `applied` within " + seconds_text(policy.window);

  // Promoted or halted, only if the state is still this rollout's (another writer may have
  // gone further meanwhile: then that writer's word stands).
  const auto revision = report.desired.revision;
  d.write_desired(module, [&](const auto& current) {
    auto s = parse_current(current, module, keys);
    if (s.revision != revision)
      detail::fail(fleet_errc::conflict,
                   "changed by another writer during the rollout (revision " +
                       std::to_string(revision) + " is now " + std::to_string(s.revision) +
                       "): this rollout's outcome is not written",
                   "rollout", "desired state of module '" + module + "'");
    if (report.halt_reason.empty())
      make_stable(s, p.ref);
    else
      halt(s, p.ref, report.halt_reason);
    auto value = sign_next_revision(s, d.bucket.get(), keys, operator_key);
    report.desired = s;
    return value;
  });
  report.completed = report.halt_reason.empty();
  return report;
}

desired_state controller::rollback(std::string_view module, std::uint64_t to_version,
                                   const secret_key& operator_key) {
  auto& d = *impl_;
  impl::require_name(module, "module name");
  const auto keys = d.keys_with(operator_key);
  desired_state written;
  d.write_desired(module, [&](const auto& current) {
    auto s = parse_current(current, module, keys);
    const auto from = highest_desired(s);
    auto target = s.history.end();
    if (to_version == 0 && !s.history.empty()) target = std::prev(s.history.end());
    if (to_version != 0)
      target = std::find_if(s.history.begin(), s.history.end(),
                            [&](const bundle_ref& r) { return r.version == to_version; });
    if (target == s.history.end())
      detail::fail(fleet_errc::invalid_state,
                   to_version == 0 ? "has no earlier stable version to go back to"
                                   : "has no v" + std::to_string(to_version) +
                                         " among its earlier stable versions (the last " +
                                         std::to_string(max_desired_history) + " are kept)",
                   "rollback", "desired state of module '" + std::string(module) + "'");
    const bundle_ref back = *target;
    s.history.erase(target, s.history.end());
    s.stable = back;
    s.candidate.reset();
    s.canaries.clear();
    s.phase = rollout_phase::rolled_back;
    s.waves.reset();
    s.reason =
        "operator rollback from v" + std::to_string(from) + " to v" + std::to_string(back.version);
    s.reason_version = from;
    auto value = sign_next_revision(s, d.bucket.get(), keys, operator_key);
    written = s;
    return value;
  });
  return written;
}

std::vector<result_record> controller::wait_for_results(std::string_view module,
                                                        std::uint64_t revision,
                                                        std::string_view digest,
                                                        std::span<const std::string> nodes,
                                                        std::chrono::milliseconds timeout) {
  const auto registry = this->registry();
  impl_->ensure_results_of(module);  // another operator's stream update may have dropped it
  result_watch watch(impl_->connection.get(), module, registry);  // first: nothing falls between
  std::set<std::string> waiting(nodes.begin(), nodes.end());
  std::vector<result_record> seen;
  const auto take = [&](result_record record) {
    if (record.revision == revision && record.digest == digest && waiting.erase(record.node) > 0)
      seen.push_back(std::move(record));
  };
  const auto deadline = steady::now() + timeout;
  take_stored_results(impl_->js.get(), module, nodes, registry, deadline, take);
  while (!waiting.empty())
    if (auto record = watch.next(deadline))
      take(std::move(*record));
    else
      break;
  return seen;
}

}  // namespace cubridge::fleet
