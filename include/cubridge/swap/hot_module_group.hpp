#pragma once
// One hot module over several devices (a context on each), promoted as one: every device
// switches to a new version together, or none does.
//
//   std::vector<cubridge::context_arg> contexts = {ctx0, ctx1};        // one per device
//   auto filters = cubridge::hot_module_group::load("filters", contexts, {v1_sm90, v1_sm90});
//   auto blur = filters.get_kernel("blur");
//   blur.launch({.grid = g, .block = b, .stream = on_device_1}, in, out, n);  // device 1's version
//   filters.promote(filters.stage({v2_sm90, v2_sm90}));   // stage fails as a whole; promote too
//   filters.rollback();                                    // every device back together
//   const auto step = filters.pin();                       // one generation for a multi-GPU step
//   blur.launch(step, on_0, ...); blur.launch(step, on_1, ...);
//
// Each member is a hot_module of its own (its version chain, its reclaimer: a retired version is
// unloaded once that device's work on it completed). The group switches them through a
// generation_gate (generation_gate.hpp): all members' checks, carried variables and graph
// retargets first, then the switches, microseconds apart. A launch without a pin takes the
// serving version of its stream's member; in those microseconds of a promote two devices may
// serve different generations. A launch through a pinned_generation never does: pin() takes
// every member's version of one generation.
//
// Members are found by the context of the launch's stream (cuStreamGetCtx; for the legacy
// default stream, the thread's current context). Several contexts of one device are allowed (a
// device split between services, and how the group is tested on one GPU); a context twice is not.

#include <cubridge/core/context_ref.hpp>
#include <cubridge/core/image.hpp>
#include <cubridge/core/launch_config.hpp>
#include <cubridge/swap/generation_gate.hpp>
#include <cubridge/swap/hot_module.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cubridge {

/// A version staged on every member of a group, not yet serving. Promote it into the group that
/// staged it, or drop it (which unloads it everywhere). Move-only.
class staged_group {
 public:
  staged_group(staged_group&&) noexcept = default;
  staged_group& operator=(staged_group&&) noexcept = default;
  /// The member count (0 once moved from).
  [[nodiscard]] std::size_t size() const noexcept { return members_.size(); }
  /// Member `i`'s staged version. @throws error (errc::precondition) for `i` out of range.
  [[nodiscard]] const staged_version& member(std::size_t i) const;

 private:
  friend class hot_module_group;
  staged_group(std::vector<staged_version> members, std::uint64_t owner) noexcept
      : members_(std::move(members)), owner_(owner) {}
  std::vector<staged_version> members_;
  std::uint64_t owner_;  // the group's serial
};

/// One generation of a group, pinned on every member (see hot_module_group::pin()). Copyable.
class pinned_generation {
 public:
  /// The generation's id (hot_module_group::serving().id when it was pinned).
  [[nodiscard]] std::uint64_t id() const noexcept { return id_; }
  /// Member `i`'s pinned version. @throws error (errc::precondition) for `i` out of range.
  [[nodiscard]] const pinned_version& member(std::size_t i) const;
  [[nodiscard]] std::size_t size() const noexcept { return members_.size(); }

 private:
  friend class hot_module_group;
  friend class group_kernel;
  pinned_generation(std::vector<pinned_version> members, std::uint64_t id,
                    std::uint64_t group) noexcept
      : members_(std::move(members)), id_(id), group_(group) {}
  std::vector<pinned_version> members_;
  std::uint64_t id_;
  std::uint64_t group_;  // the group's serial
};

/// Counters of a group, and each member's own.
struct hot_module_group_stats {
  generation serving;            ///< the serving generation (its id and each member's version)
  std::uint64_t promotions = 0;  ///< group switches: promote() and rollback() calls that switched
  std::uint64_t rollbacks = 0;   ///< rollback() calls that switched
  /// Group versions refused: by stage() on any member (counted once), or by promote().
  std::uint64_t rejected = 0;
  std::vector<hot_module_stats> members{};  ///< in member order
};

class group_kernel;

/// A hot module over several devices, held by shared handle as hot_module is: copies name the
/// same group, which lives while a handle or a group_kernel of it does. Thread-safe as
/// hot_module: launches, stage, promote, rollback and pin may run on any threads at once. Every
/// member of a moved-from group throws error (errc::precondition); its group_kernels and the
/// other copies keep working.
class hot_module_group final : public swap_target {
 public:
  /// Loads the first version on every context: `images[i]` into `contexts[i]` (each built for
  /// that device's architecture). All must export the same kernels. Member i's hot_module is
  /// named "<name> [member i, device d]". @throws error (errc::precondition) for no context, a
  /// context given twice, a count of images that is not the count of contexts, or members whose
  /// kernels differ; image_error, error as hot_module::load (nothing stays loaded).
  [[nodiscard]] static hot_module_group load(std::string name, std::vector<context_arg> contexts,
                                             std::span<const std::span<const std::byte>> images,
                                             const hot_module_options& options = {});
  /// As load(name, contexts, images, options) with one image for every context (a fatbin for
  /// every device's architecture, or a cubin when all devices share one).
  [[nodiscard]] static hot_module_group load(std::string name, std::vector<context_arg> contexts,
                                             std::span<const std::byte> image,
                                             const hot_module_options& options = {});

  hot_module_group(const hot_module_group&) noexcept = default;
  hot_module_group& operator=(const hot_module_group&) noexcept = default;
  hot_module_group(hot_module_group&&) noexcept = default;
  hot_module_group& operator=(hot_module_group&&) noexcept = default;
  ~hot_module_group() override;

  /// Stages `images[i]` on member i (hot_module::stage, every member at once, each on a thread
  /// of its own with the member's context current), with `options` for each (a smoke test gets
  /// each member's module, and may run on several threads at once). All or
  /// nothing: if one member refuses, what the others staged is unloaded and the refusal thrown,
  /// naming the member. @throws error (errc::precondition) for a count of images that is not
  /// the member count; as hot_module::stage.
  [[nodiscard]] staged_group stage(std::span<const std::span<const std::byte>> images,
                                   const stage_options& options = {}) const;
  /// As stage(images, options), with one image for every member.
  [[nodiscard]] staged_group stage(std::span<const std::byte> image,
                                   const stage_options& options = {}) const;
  /// As stage(image, options), for bytes inspected already (`info`, as hot_module::stage).
  [[nodiscard]] staged_group stage(std::span<const std::byte> image, const image_info& info,
                                   const stage_options& options = {}) const;

  /// Makes `version` serve on every member, all or nothing: every member's checks (launch shapes
  /// used so far), carried `__device__` variables and graph retargets are made first; if one
  /// fails, every member keeps serving what it served and what was retargeted is put back.
  /// Then every member switches. Returns the new generation's id.
  /// @throws error (errc::precondition) for a version staged by another group or moved from;
  ///         as hot_module::promote. Whatever it throws, nothing switched anywhere.
  std::uint64_t promote(staged_group version);
  /// Makes the previous generation serve again on every member, all or nothing as promote().
  /// Returns its id. @throws error (errc::precondition) if there is none; as
  /// hot_module::rollback. Whatever it throws, nothing switched anywhere.
  std::uint64_t rollback() override;

  /// stage(image, info or parsed, options) and promote() on every member, if `condition` holds
  /// when the switch is made (the label compared inside the group's switch, as
  /// hot_module::stage_and_promote). @throws as stage() and promote() (nothing switched).
  apply_result stage_and_promote(std::span<const std::byte> image, const image_info* info,
                                 const stage_options& options,
                                 promote_condition condition) override;

  /// Pins the serving generation on every member: launches through it (group_kernel::launch
  /// with a pinned_generation) run that generation's version on whichever member they go to,
  /// whatever is promoted meanwhile. Waits only while a switch is being made (microseconds).
  [[nodiscard]] pinned_generation pin() const;

  /// A kernel of the interface on every member. @throws error (errc::precondition) for a name
  /// the first version did not export.
  [[nodiscard]] group_kernel get_kernel(std::string_view name) const;

  /// The serving generation: its id and each member's version id. In a group the two agree
  /// (members switch only together), so each member's version id is the generation's id.
  [[nodiscard]] generation serving() const;
  /// The serving version, rollback target and retired versions of every member, which agree on
  /// what serves; member 0's, with the bundle versions (origin) the sink reads.
  [[nodiscard]] held_versions versions() const override;
  [[nodiscard]] const std::string& name() const override;
  /// Member 0's device's compute capability.
  [[nodiscard]] compute_capability device_capability() const override;
  [[nodiscard]] std::size_t size() const;
  /// Member `i` (its hot_module: stats, versions, context; read-only: a member switches only
  /// with its group). @throws error (errc::precondition) for `i` out of range.
  [[nodiscard]] const hot_module& member(std::size_t i) const;
  /// The member whose context is `ctx`. @throws error (errc::precondition) naming the context and
  /// the group's contexts when none is.
  [[nodiscard]] std::size_t member_of(context_ref ctx) const;
  [[nodiscard]] hot_module_group_stats stats() const;
  /// stats() and every member's launches() summed, in the words of swap_target.
  [[nodiscard]] swap_counters counters() const override;
  /// hot_module::reclaim() on every member; returns how many versions were unloaded in all.
  std::size_t reclaim() const;

 private:
  friend class group_kernel;
  struct state;
  explicit hot_module_group(std::shared_ptr<state> s) noexcept : state_(std::move(s)) {}
  [[nodiscard]] state& checked() const;
  /// promote(version), switching only if `condition` holds (hot_module::promote's).
  std::uint64_t promote(staged_group version, promote_condition condition);
  /// `stage_one(i)` on every member at once (a thread each), all or nothing: a failure unloads
  /// what the others staged and is rethrown.
  [[nodiscard]] staged_group stage_each(
      const std::function<staged_version(std::size_t)>& stage_one) const;
  std::shared_ptr<state> state_;
};

/// A kernel of a group: each launch goes to the member of its stream's context.
class group_kernel {
 public:
  [[nodiscard]] const std::string& name() const noexcept { return name_; }

  /// Launches the serving version of the member that owns `config.stream` (the thread's current
  /// context for the legacy default stream), as hot_kernel::launch. Returns the version's id.
  /// @throws error (errc::precondition) for a stream of a context outside the group; as
  ///         hot_kernel::launch.
  template <class... Args>
  std::uint64_t launch(const launch_config& config, const Args&... args) const {
    return members_[member_for(config)].launch(config, args...);
  }
  /// As launch(config, args...), on the version `pinned` holds for that member (one generation
  /// across every device). @throws error (errc::precondition) for a generation pinned from
  /// another group; as launch(config, args...).
  template <class... Args>
  std::uint64_t launch(const pinned_generation& pinned, const launch_config& config,
                       const Args&... args) const {
    const auto i = member_for(pinned, config);
    return members_[i].launch(pinned.members_[i], config, args...);
  }
  /// Member `i`'s hot_kernel. @throws error (errc::precondition) for `i` out of range.
  [[nodiscard]] const hot_kernel& on(std::size_t i) const;

 private:
  friend class hot_module_group;
  group_kernel(std::shared_ptr<const hot_module_group::state> s, std::vector<hot_kernel> members,
               std::string name) noexcept
      : state_(std::move(s)), members_(std::move(members)), name_(std::move(name)) {}
  /// The member `config.stream` belongs to. @throws error (errc::precondition) for none.
  [[nodiscard]] std::size_t member_for(const launch_config& config) const;
  /// As member_for(config), for a pinned generation of this group.
  [[nodiscard]] std::size_t member_for(const pinned_generation& pinned,
                                       const launch_config& config) const;
  std::shared_ptr<const hot_module_group::state> state_;
  std::vector<hot_kernel> members_;
  std::string name_;
};

}  // namespace cubridge
