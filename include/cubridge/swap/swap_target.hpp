#pragma once
// One face for what a new version is applied to: a hot module (one device) or a hot module
// group (every device of a machine at once). Both implement it, so that what serves pushed
// versions (the update layer's hot_module_sink) holds its modules by this face and never
// branches on which one it has.
//
// Its one call, stage_and_promote(), is the compare-and-apply between an update and a swap: the
// new version's label is compared with the serving version's inside the promote's own lock, so
// two promoters racing (a push, a fleet apply, a hot reloader) can never make a lower label
// serve after a higher one did. The refusal names the label that kept serving.
//
//   const auto r = filters.stage_and_promote(cubin, nullptr, {.label = 7});
//   if (r.outcome == cubridge::apply_outcome::not_newer) ... // r.serving_label serves, >= 7

#include <cubridge/core/compute_capability.hpp>
#include <cubridge/core/image.hpp>
#include <cubridge/swap/version_chain.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace cubridge {

struct stage_options;

/// When stage_and_promote() may switch.
enum class promote_condition {
  /// Only if the staged version's label is above the serving version's, compared under the
  /// lock the switch is made in.
  label_above_serving,
  /// Whatever serves: an operator's explicit word to go back (a rollback or halt by a signed
  /// desired state), or a tool that labels nothing.
  always,
};

/// How stage_and_promote() ended when it did not throw.
enum class apply_outcome {
  promoted,   ///< the new version serves
  not_newer,  ///< refused: its label is not above the serving one; nothing switched
};

/// "label_above_serving", "always" / "promoted", "not_newer".
[[nodiscard]] std::string_view to_string(promote_condition condition) noexcept;
[[nodiscard]] std::string_view to_string(apply_outcome outcome) noexcept;

/// What stage_and_promote() did, and what serves now.
struct apply_result {
  apply_outcome outcome = apply_outcome::promoted;
  /// The serving version's label when the call returned: the new one's, or for not_newer the
  /// one that kept serving.
  std::uint64_t serving_label = 0;
  /// The serving version's chain id (a group's generation id) at that moment.
  std::uint64_t serving_id = 0;
};

/// What a swap target counted since it was loaded (a group: summed over its members).
struct swap_counters {
  std::uint64_t promotions = 0;  ///< switches to another version, rollbacks included
  std::uint64_t rollbacks = 0;
  std::uint64_t rejected = 0;  ///< versions refused by stage or promote (not_newer not counted)
  std::uint64_t unloaded = 0;  ///< retired versions unloaded
  std::uint64_t reclaim_failures = 0;
  /// The serving version's launches and launch failures since it was promoted, the driver's
  /// name of the last failure and whether it poisons the context (hot_module::launches()).
  std::uint64_t launches = 0;
  std::uint64_t launch_failures = 0;
  std::string last_launch_failure{};
  bool sticky_error = false;
};

/// A hot module or a hot module group, as what applies versions to it sees it. Thread-safe as
/// the two are.
class swap_target {
 public:
  virtual ~swap_target() = default;

  [[nodiscard]] virtual const std::string& name() const = 0;
  /// The compute capability of the device(s) it loads into (a group's members share one where
  /// a sink serves it).
  [[nodiscard]] virtual compute_capability device_capability() const = 0;
  /// Stages `image` (inspected already as `*info`, or parsed here when null) with `options`,
  /// and promotes it if `condition` holds at the moment of the switch. A version refused as
  /// not_newer is unloaded and nothing switched.
  /// @throws version_rejected_error, image_error, error as stage() and promote() (nothing
  ///         switched).
  virtual apply_result stage_and_promote(std::span<const std::byte> image, const image_info* info,
                                         const stage_options& options,
                                         promote_condition condition) = 0;
  /// Makes the previous version serve again; returns its chain id. @throws as
  /// hot_module::rollback (nothing switched).
  virtual std::uint64_t rollback() = 0;
  /// The serving version, the rollback target and the retired versions, with their labels.
  [[nodiscard]] virtual held_versions versions() const = 0;
  [[nodiscard]] virtual swap_counters counters() const = 0;

 protected:
  // Only the handles copy themselves (no slicing through this face).
  swap_target() = default;
  swap_target(const swap_target&) = default;
  swap_target& operator=(const swap_target&) = default;
  swap_target(swap_target&&) = default;
  swap_target& operator=(swap_target&&) = default;
};

}  // namespace cubridge
