#pragma once
// A module_sink over cubridge::hot_module (or a hot_module_group: every device of a machine at
// once): what the update endpoint (update_endpoint.hpp) and the fleet agent use in a real service.
// A pushed cubin or fatbin is staged (loaded and validated against the module's interface) and
// promoted; CUDA C++ source is first compiled with NVRTC for the exact architecture of the module's
// device (build_machine_code, machine_code.hpp), so the driver never JITs in the service.
//
// The sink keeps no versions of its own: each pushed version is staged with the bundle's version
// as its label and the signing key's id as its signer (stage_options::label, signer: the swap
// layer's words for them), and which bundle version serves, and which one a rollback returns
// to, is read from the module's chain (hot_module::versions()). A version promoted some other
// way (a hot_reloader, a direct promote() or rollback()) is seen as it is, with label 0 (no
// bundle version) unless its promoter gave one.
//
// The sink holds a handle of every module it serves, by the swap layer's one face for a module
// and a group (swap_target.hpp; both are shared handles), and the gate and endpoint over it hold
// the sink by shared pointer: no destruction order can leave one pointing at something gone.
//
//   auto filters = cubridge::hot_module::load(ctx, "filters", v1_cubin,
//                                             {.origin = {.label = 1}});
//   auto sink = std::make_shared<cubridge::hot_module_sink>();
//   sink->add(filters);                              // serves bundle version 1
//   cubridge::update_endpoint endpoint(sink, options);
//   endpoint.start();

#include <cubridge/compile/compile.hpp>
#include <cubridge/compile/machine_code.hpp>
#include <cubridge/core/compute_capability.hpp>
#include <cubridge/core/context_ref.hpp>
#include <cubridge/swap/hot_module.hpp>
#include <cubridge/swap/hot_module_group.hpp>
#include <cubridge/update/module_sink.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace cubridge {

/// The source kind (machine_code.hpp) of a bundle's payload kind: cubin, fatbin, cuda_source.
[[nodiscard]] source_kind source_kind_of(payload_kind kind) noexcept;

/// Loads pushed versions into hot modules. Thread-safe. Lives in cubridge::update.
class hot_module_sink final : public module_sink {
 public:
  /// `compile` is used for CUDA source payloads; its architecture is replaced by the device's.
  explicit hot_module_sink(compile_options compile = {});
  ~hot_module_sink() override;

  /// Serves updates for `module`, keeping a handle of it. Its serving version's bundle version
  /// is the label its chain records (hot_module_options::origin at load; 0: none, any version
  /// is accepted). `stage` is used for each new version (smoke test, carried globals; its label
  /// and signer are set per bundle). All modules must be on devices of one
  /// compute capability. @throws error (errc::precondition) for a name already added or a
  /// module on a device of another compute capability; error when the device cannot be queried.
  void add(hot_module module, stage_options stage = {});
  /// Serves updates for `group`, keeping a handle of it, under the group's name: a pushed
  /// version is staged on every member and promoted on all at once, or refused on all
  /// (hot_module_group::stage, promote); a rollback returns every member. Its members must be
  /// on devices of one compute capability, that of the sink's other modules. @throws as
  /// add(module, stage); error (errc::precondition) for members on devices of several compute
  /// capabilities.
  void add(hot_module_group group, stage_options stage = {});

  /// The compute capability of the modules' device; nullopt before add().
  [[nodiscard]] std::optional<compute_capability> device_capability() const override;
  /// The serving version's origin().label (its bundle version), from the module's chain.
  [[nodiscard]] std::uint64_t current_version(std::string_view name) const override;
  /// Compiles (cuda_source), stages with the bundle's version and key, and promotes through
  /// swap_target::stage_and_promote: for apply_rule::above_serving only if the version is
  /// still above the serving one inside the promote's lock. Reasons: none; unknown_module for
  /// a name not added; stage_refused with the compiler's log or the validation failure;
  /// older_version / replayed_version naming the version that kept serving; apply_failed for
  /// anything else. Whatever is refused, the serving version keeps serving.
  sink_result apply(const verified_bundle& bundle, apply_rule rule) override;
  /// swap_target::rollback, to whatever the chain holds as the rollback target; the result's
  /// version is that target's bundle version. Reasons: none, unknown_module,
  /// no_previous_version, apply_failed.
  sink_result rollback(std::string_view name) override;
  /// From each module's chain: current_version and versions_held (rollback target, serving)
  /// as bundle versions (0 for a version not from a bundle), in_flight = retired versions;
  /// counters from hot_module::stats() (promotions, rollbacks, rejected, unloaded, reclaim
  /// failures), which the endpoint's /metrics exports.
  [[nodiscard]] std::vector<module_report> status() const override;
  /// Asks the driver about the context of every module and group member added
  /// (probe_process_health: a stream query each, waiting for no work), so that a sticky error
  /// no call has returned yet marks the process poisoned. Returns process_poisoned().
  [[nodiscard]] bool probe_health() const noexcept override;

 private:
  struct entry;
  compile_options compile_;
  mutable std::mutex mutex_;
  std::optional<compute_capability> device_;
  std::map<std::string, std::unique_ptr<entry>, std::less<>> modules_;
  // Each context of the modules added, once; alive as long as the modules the entries hold.
  std::vector<context_ref> contexts_;
  entry* find(std::string_view name) const;
  void add_entry(std::unique_ptr<swap_target> target, stage_options stage,
                 const std::vector<context_ref>& contexts);
};

}  // namespace cubridge
