#pragma once
// The truth of a fleet (docs/fleet.md, "Desired state"): per module one record in the bucket
// `cubridge_fleet` under `desired.<m>`, signed by the operator, written only by compare-and-set
// on the bucket's revision. Nodes reconcile to it: each node runs the bundle the record names for
// it (the candidate while it is a canary of a rollout, else the stable one), whatever messages it
// saw or missed. A lower version becomes desired only through an explicit rollback (phase
// rolled_back) or a halted rollout (phase halted), each with its reason.

#include <cubridge/bundle/bundle.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cubridge::fleet {

/// One bundle as the desired state names it: fetched by subject (subjects.hpp, bundle_subject),
/// checked against `digest` before it is verified.
struct bundle_ref {
  std::uint64_t version = 0;
  /// Lower-case hex SHA-256 of the whole bundle (64 characters).
  std::string digest{};
  std::uint64_t size = 0;
  /// The signed target GPU ("sm_90").
  std::string target{};
  friend bool operator==(const bundle_ref&, const bundle_ref&) = default;
};

/// Where a module's rollout stands.
enum class rollout_phase {
  complete,     ///< every node runs `stable`
  canary,       ///< the canaries run `candidate`, every other node `stable`
  halted,       ///< a canary rollout failed: `candidate` is gone, every node runs `stable`
  rolled_back,  ///< the operator went back: `stable` is an earlier version
};

/// "complete", "canary", "halted", "rolled_back".
[[nodiscard]] std::string_view to_string(rollout_phase phase) noexcept;
[[nodiscard]] std::optional<rollout_phase> parse_rollout_phase(std::string_view name) noexcept;

/// Most earlier stable versions a record remembers (the rollback targets).
inline constexpr std::size_t max_desired_history = 8;
/// Most canaries a record names.
inline constexpr std::size_t max_desired_canaries = 10000;

/// Most waves a plan holds.
inline constexpr std::size_t max_waves = 16;
/// The most heartbeat intervals a plan lets a canary stay silent: 1 to this.
inline constexpr std::uint32_t max_missed_heartbeats_limit = 100;

/// A wave rollout (`fleet publish --waves`), kept in the desired state so that a controller
/// started again carries on from where the last one was: which nodes each wave adds, which wave
/// runs since when, and the gates a wave must pass (bake time, progress deadline, health
/// limits). The canaries of the record are the nodes of the waves so far; after the last wave
/// the candidate becomes stable for every node.
struct wave_plan {
  /// The bundle the waves carry (also the record's candidate while they run).
  bundle_ref candidate{};
  /// The waves as asked ("1", "10%", "50%"), and the nodes each one adds, in order; the last wave
  /// is every node (the candidate becomes stable), listed with no nodes.
  std::vector<std::string> sizes{};
  std::vector<std::vector<std::string>> nodes{};
  /// The running wave, 0-based; when halted, the wave that failed.
  std::size_t wave = 0;
  /// When the running wave started, RFC 3339 UTC.
  std::string started{};
  /// How long a wave's nodes must stay healthy after the last of them applied the candidate
  /// (on the wire: bake_ms).
  std::chrono::milliseconds bake{0};
  /// How long a wave may take from its start to its end; past it, the rollout halts (on the
  /// wire: deadline_ms).
  std::chrono::milliseconds deadline{0};
  /// Launch failures / launches above which a wave fails (negative: no limit).
  double max_failure_rate = -1;
  /// Per probe value, the most a wave's nodes may report on average.
  std::map<std::string, double, std::less<>> max_metrics{};
  /// A baseline that breaches a limit on its own halts the rollout for review (true) or is taken
  /// for a fleet-wide dip, and the wave bakes on (false). Missing in a record: true.
  bool baseline_breach_halts = true;
  /// The most heartbeat intervals a node of the wave may stay silent during its bake (its
  /// heartbeats as the server received them); a canary silent longer is lost and fails the
  /// wave. Missing in a record: default_missed_heartbeats.
  std::uint32_t max_missed_heartbeats = 3;

  friend bool operator==(const wave_plan&, const wave_plan&) = default;
};

/// A module's desired state.
struct desired_state {
  std::string module{};
  /// 1 for the first record, then one more than the highest revision the key's history holds
  /// (so an old record written back is never outnumbered by the next write): a node acts on a
  /// record only if its revision is above every revision it saw, and a result counts only for
  /// the revision it answers.
  std::uint64_t revision = 0;
  rollout_phase phase = rollout_phase::complete;
  /// What every node runs (none: no version desired yet, e.g. during the first canary rollout).
  std::optional<bundle_ref> stable{};
  /// During a canary rollout, what the canaries run.
  std::optional<bundle_ref> candidate{};
  /// The canaries, by node id, sorted.
  std::vector<std::string> canaries{};
  /// Why the rollout halted or was rolled back; the version it was about.
  std::string reason{};
  std::uint64_t reason_version = 0;
  /// Earlier stable bundles, oldest first, at most max_desired_history.
  std::vector<bundle_ref> history{};
  /// When the operator wrote it, RFC 3339 UTC.
  std::string time{};
  /// What wrote it, "cubridge 0.1.0" (software_text()); empty in a record that predates it.
  std::string software{};
  /// The wave rollout in progress or halted; none for a plain publish or canary rollout.
  std::optional<wave_plan> waves{};

  /// The bundle `node` should run: the candidate for a canary during a rollout, else stable.
  [[nodiscard]] const bundle_ref* target_for(std::string_view node) const;
  /// Whether a wave rollout halted: its plan is kept (`fleet resume` runs the wave again) and
  /// the phase is halted, the one place that says so.
  [[nodiscard]] bool waves_halted() const noexcept {
    return waves && phase == rollout_phase::halted;
  }
};

/// The record's JSON body (signed with signed_record.hpp, kind desired_state).
[[nodiscard]] std::string to_json(const desired_state& state);
/// The record in `body`; nullopt (with the reason in `why`, when given) for anything else: a
/// field missing, of another type or out of range, a module or node name check_fleet_name
/// refuses, a digest that is not 64 lower-case hex digits, more than the maximum canaries or
/// history. Never throws but std::bad_alloc.
[[nodiscard]] std::optional<desired_state> parse_desired_state(std::string_view body,
                                                               std::string* why = nullptr);

}  // namespace cubridge::fleet
