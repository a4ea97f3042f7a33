#pragma once
// The loading side of the update endpoint (update_endpoint.hpp): whatever takes a verified
// bundle and makes it the serving version of a module. The endpoint owns the network, the
// signature and replay checks; a sink only loads. hot_module_sink.hpp adapts cubridge::hot_module;
// tests use a fake, so that the endpoint is tested without a GPU.
//
// Versions here are always bundle versions (the signed manifest's), never a hot module's chain
// ids. A sink keeps no copy of them: it answers from where the module keeps its versions (for a
// hot module, its version chain), so that a version promoted past the endpoint (a hot_reloader,
// a direct promote() or rollback()) is what current_version() and status() report, and what the
// endpoint's replay and rollback checks see.

#include <cubridge/bundle/bundle.hpp>
#include <cubridge/core/compute_capability.hpp>
#include <cubridge/update/gate_reason.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cubridge {

/// Whether a sink may switch to a pushed version only when it is newer than what serves.
enum class apply_rule {
  /// Only if its version is above the serving one, compared where the switch is made (inside
  /// the promote's lock for hot modules): a refusal is older_version or replayed_version, with
  /// the version that kept serving.
  above_serving,
  /// Whatever serves: the operator's explicit word to go below (a fleet rollback or halt).
  operator_word,
};

/// "above_serving", "operator_word".
[[nodiscard]] std::string_view to_string(apply_rule rule) noexcept;

/// A sink's answer: why it refused (gate_reason::none: applied or rolled back, in one
/// vocabulary with the gate, the HTTP status and the fleet's result records), the version
/// serving when it returned, and for a refusal, what went wrong.
struct sink_result {
  /// none; unknown_module; stage_refused (validation, compile, load, smoke test);
  /// faulted_in_probation, mismatch_in_probation or probation_incomplete (the candidate failed
  /// its probation: the gate records its payload as bad on the node, never staged again);
  /// older_version or replayed_version (apply_rule::above_serving refused it at the switch);
  /// no_previous_version (rollback); apply_failed (anything else: nothing switched).
  gate_reason reason = gate_reason::apply_failed;
  /// The bundle version serving when the call returned (for rollback: the version rolled back
  /// to): the answer to "which version serves?" that comes with the apply.
  std::uint64_t serving_version = 0;
  /// For a refusal: what went wrong, in words (a compiler log, a validation failure).
  std::string detail{};
};

/// The refusal for a version `version` that is not above `serving`: replayed_version when equal,
/// older_version when below, with `detail` naming both.
[[nodiscard]] sink_result not_newer_result(std::string_view module, std::uint64_t version,
                                           std::uint64_t serving);

/// What a module counted since it was loaded, for sinks that know (a hot module's
/// hot_module_stats); metrics (metrics_text.hpp) export them.
struct module_counters {
  /// Switches to another version: promotions, rollbacks included.
  std::uint64_t promotions = 0;
  std::uint64_t rollbacks = 0;
  /// Versions refused while staging or promoting.
  std::uint64_t rejected = 0;
  /// Retired versions unloaded.
  std::uint64_t unloaded = 0;
  /// Failures on the way to unloading (each retried).
  std::uint64_t reclaim_failures = 0;
  /// The serving version's launches and launch failures since it was promoted (for a group:
  /// summed over its devices), the driver's name of the last failure, and whether it poisons
  /// the context (a sticky error: hot_module::launches()).
  std::uint64_t launches = 0;
  std::uint64_t launch_failures = 0;
  std::string last_launch_failure{};
  bool sticky_error = false;
};

/// One module as a sink reports it.
struct module_report {
  std::string name{};
  /// The bundle version serving now; 0 when none (e.g. a version not from a bundle).
  std::uint64_t current_version = 0;
  /// Bundle versions a rollback could use: the rollback target (if any), then the serving one;
  /// 0 for a version not from a bundle.
  std::vector<std::uint64_t> versions_held{};
  /// Old versions not yet unloaded: pinned by launches or GPU work in flight.
  std::uint64_t in_flight = 0;
  /// The last refusal or failure of this module, empty when none.
  std::string last_error{};
  /// The module's counters, where the sink has them (hot_module_sink does); else empty.
  std::optional<module_counters> counters{};
};

/// The loading side of the update endpoint. The gate serialises its calls per module (never two
/// apply/rollback calls for one module at once), but other promoters (a hot reloader) may
/// switch meanwhile, calls for different modules, and status(), may come on any threads at
/// once. Implementations must not throw: every failure is a sink_result (the gate turns an
/// escaped exception into gate_reason::apply_failed).
class module_sink {
 public:
  virtual ~module_sink() = default;

  /// The compute capability of the device the sink loads into ({9, 0} for an H200): bundles
  /// whose payload cannot run on it are refused before apply() is called. nullopt while the
  /// sink knows no device (then every bundle reaches apply()).
  [[nodiscard]] virtual std::optional<compute_capability> device_capability() const = 0;
  /// The bundle version of `name` serving now, 0 when none (or no such module). Asked through
  /// the gate (update_gate::serving), once per decision; an apply's answer carries it.
  [[nodiscard]] virtual std::uint64_t current_version(std::string_view name) const = 0;
  /// Stages `bundle` as the new version of its module (bundle.manifest.name) and promotes it,
  /// under `rule` checked at the moment of the switch (a version another promoter made serve
  /// meanwhile counts). Called only for verified bundles.
  virtual sink_result apply(const verified_bundle& bundle, apply_rule rule) = 0;
  /// Makes the previous version of `name` serve again.
  virtual sink_result rollback(std::string_view name) = 0;
  /// Every module the sink holds.
  [[nodiscard]] virtual std::vector<module_report> status() const = 0;
  /// Whether the process is poisoned (core/process_health.hpp), asking the driver about the
  /// contexts the sink loads into where it has any (hot_module_sink does), so that the first
  /// readiness probe after a fault sees it even when no call has returned the error yet. The
  /// default asks no driver: process_poisoned(). Must not throw nor wait for GPU work; called by
  /// every GET /readyz.
  [[nodiscard]] virtual bool probe_health() const noexcept;
};

}  // namespace cubridge
