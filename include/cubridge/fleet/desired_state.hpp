#pragma once
// The truth of a fleet (docs/fleet.md, "Desired state"): per module one record in the bucket
// `cubridge_fleet` under `desired.<m>`, signed by the operator, written only by compare-and-set
// on the bucket's revision. Nodes reconcile to it: each node runs the bundle the record names for
// it (the candidate while it is a canary of a rollout, else the stable one), whatever messages it
// saw or missed. A lower version becomes desired only through an explicit rollback (phase
// rolled_back) or a halted rollout (phase halted), each with its reason.

#include <cubridge/bundle/bundle.hpp>

#include <cstdint>
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
  std::string digest;
  std::uint64_t size = 0;
  /// The signed target GPU ("sm_90").
  std::string target;
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

/// A module's desired state.
struct desired_state {
  std::string module;
  /// 1 for the first record, then one more than the highest revision the key's history holds
  /// (so an old record written back is never outnumbered by the next write): a node acts on a
  /// record only if its revision is above every revision it saw, and a result counts only for
  /// the revision it answers.
  std::uint64_t revision = 0;
  rollout_phase phase = rollout_phase::complete;
  /// What every node runs (none: no version desired yet, e.g. during the first canary rollout).
  std::optional<bundle_ref> stable;
  /// During a canary rollout, what the canaries run.
  std::optional<bundle_ref> candidate;
  /// The canaries, by node id, sorted.
  std::vector<std::string> canaries;
  /// Why the rollout halted or was rolled back; the version it was about.
  std::string reason;
  std::uint64_t reason_version = 0;
  /// Earlier stable bundles, oldest first, at most max_desired_history.
  std::vector<bundle_ref> history;
  /// When the operator wrote it, RFC 3339 UTC.
  std::string time;
  /// What wrote it, "cubridge 0.1.0" (software_text()); empty in a record that predates it.
  std::string software;

  /// The bundle `node` should run: the candidate for a canary during a rollout, else stable.
  [[nodiscard]] const bundle_ref* target_for(std::string_view node) const;
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
