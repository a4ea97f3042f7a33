#pragma once
// The steps of a change of desired state, shared by rollout.cpp (publish, the canary policy,
// rollback) and waves.cpp (wave rollouts, resume, abort): verifying a bundle as a node will,
// the rules a new state must keep, signing the next revision, choosing canaries, and counting
// their results. Internal to the fleet layer.

#include "fleet/controller_impl.hpp"

#include <cubridge/fleet/controller.hpp>
#include <cubridge/fleet/subjects.hpp>

#include <chrono>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cubridge::fleet::rollout_steps {

using steady = std::chrono::steady_clock;

/// "30 s", or "1500 ms".
[[nodiscard]] std::string seconds_text(std::chrono::milliseconds window);
/// "canary n2 refused v3: stage_refused: smoke test failed".
[[nodiscard]] std::string failure_reason(const result_record& r);
/// Whether the node runs the version after this result.
[[nodiscard]] bool succeeded(const result_record& r);
/// Now, RFC 3339 UTC.
[[nodiscard]] std::string now_text();

// A bundle about to be published: verified as a node will verify it, and how the desired state
// names it.
struct prepared_bundle {
  verified_bundle bundle;
  bundle_ref ref;
  const std::string& module() const { return bundle.manifest.name; }
};

/// Verifies `bytes` with `keys` as a node will, and names it as the desired state will.
[[nodiscard]] prepared_bundle prepare(std::span<const std::byte> bytes, const trusted_keys& keys);
/// The highest version the state asks any node to run.
[[nodiscard]] std::uint64_t highest_desired(const desired_state& s);
/// Whether `s` already asks every node to run `ref` (a retried publish: nothing to write).
[[nodiscard]] bool desired_everywhere(const desired_state& s, const bundle_ref& ref);
/// The bundle `s` asks every node to run when it is `p` signed again: the same module, version,
/// target, payload, expiry and key, another signing time (a `fleet publish x.cubin --version N` run
/// twice signs twice). Its ref; nullopt for anything else, or when the stored bundle cannot be
/// read.
[[nodiscard]] std::optional<bundle_ref> same_payload_desired(jsCtx* js, const desired_state& s,
                                                             const prepared_bundle& p,
                                                             const trusted_keys& keys);
/// Refuses a version that would take the desired state down (or the same version with another
/// bundle): only rollback() goes down. @throws fleet_errc::older_version.
void require_newer(const desired_state& s, const bundle_ref& ref);
/// `s` with `ref` as its stable bundle: the old stable one joins the history.
void make_stable(desired_state& s, const bundle_ref& ref);
/// The module's desired state as `current` holds it (an empty one for none).
/// @throws fleet_errc::invalid_state for a record that does not verify or parse.
[[nodiscard]] desired_state parse_current(const std::optional<detail::kv_value>& current,
                                          std::string_view module, const trusted_keys& keys);
/// `s` as the next revision, signed: numbered above every revision the key's history in the
/// bucket still holds, not only above the current value's.
[[nodiscard]] std::string sign_next_revision(desired_state& s, kvStore* bucket,
                                             const trusted_keys& keys,
                                             const secret_key& operator_key);
/// The nodes that may run `p`: live, following its module, able to run it, of `cohort` unless
/// that is empty; in node-id order.
[[nodiscard]] std::vector<std::string> eligible_canaries(const std::vector<node_state>& nodes,
                                                         const prepared_bundle& p,
                                                         std::string_view cohort);
/// @throws errc::precondition when fewer than policy.canaries nodes qualify.
void require_enough(const std::vector<std::string>& eligible, const canary_policy& policy,
                    const prepared_bundle& p);
/// `s` asking `canaries` to run `candidate` while the others stay on the stable bundle.
void enter_canary_phase(desired_state& s, const bundle_ref& candidate,
                        std::vector<std::string> canaries);
/// `s` back on its stable bundle everywhere, with why `candidate` went no further.
void halt(desired_state& s, const bundle_ref& candidate, std::string reason);

// The canaries' answers to one rollout's revision and digest, each node counted once: the first
// failure halts the rollout and gives its reason.
struct canary_tally {
  rollout_report& report;
  std::string_view digest;
  std::set<std::string> canaries{report.canaries.begin(), report.canaries.end()};
  std::set<std::string> applied, failed;

  void operator()(result_record record) {
    if (!canaries.contains(record.node) || record.revision != report.desired.revision ||
        record.digest != digest || applied.contains(record.node) || failed.contains(record.node))
      return;
    if (succeeded(record)) {
      applied.insert(record.node);
    } else {
      failed.insert(record.node);
      if (report.halt_reason.empty()) report.halt_reason = failure_reason(record);
    }
    report.results.push_back(std::move(record));
  }
};

// Hands each of `nodes`' stored last result for `module` that verifies to `take`, within
// `deadline`: one read that times out (a server busy sending bundles) loses only that node's
// stored result, which a watch may still bring.
template <class Take>
void take_stored_results(jsCtx* js, std::string_view module, std::span<const std::string> nodes,
                         const node_registry& registry, steady::time_point deadline, Take& take) {
  for (const auto& node : nodes) {
    if (steady::now() >= deadline) return;
    const auto subject = result_subject(module, node);
    try {
      if (const auto m = detail::last_message(js, std::string(result_stream), subject)) {
        std::string why;
        if (auto r = verified_result(subject, detail::message_text(m.get()), module, registry, why))
          take(std::move(*r));
      }
    } catch (const error& e) {
      if (e.is(fleet_errc::unreachable)) throw;
    }
  }
}

// Feeds `tally` its canaries' stored results for `module`, then those `watch` brings, until
// `wanted` of them applied, a failure halted the rollout, or `deadline`: the one wait of a
// canary rollout and of a wave. `between()` runs whenever no result came for `poll`, and ends the
// wait when it returns false (a wave looks at its canaries' heartbeats there).
template <class Between>
void collect_canary_results(jsCtx* js, result_watch& watch, std::string_view module,
                            const node_registry& registry, canary_tally& tally, std::size_t wanted,
                            steady::time_point deadline, std::chrono::milliseconds poll,
                            Between between) {
  take_stored_results(js, module, tally.report.canaries, registry, deadline, tally);
  auto look = steady::now() + poll;
  while (tally.applied.size() < wanted && tally.report.halt_reason.empty()) {
    if (auto record = watch.next(std::min(deadline, look))) {
      tally(std::move(*record));
      continue;
    }
    if (steady::now() >= deadline) return;
    look = steady::now() + poll;
    if (!between()) return;
  }
}

}  // namespace cubridge::fleet::rollout_steps
