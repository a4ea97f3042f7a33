// hot_module_group: hot modules on several devices staged, promoted and rolled back as one
// (hot_module_group.hpp); the switch order and the pins are generation_gate's.
#include "hot_module_state.hpp"

#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/swap/detail/stream_listeners.hpp>
#include <cubridge/swap/hot_module_group.hpp>

#include <atomic>
#include <exception>
#include <optional>
#include <thread>

namespace cubridge {

namespace {

std::uint64_t next_group_serial() noexcept {
  static std::atomic<std::uint64_t> counter{1};
  return counter.fetch_add(1, std::memory_order_relaxed);
}

std::string member_name(const std::string& name, std::size_t i, context_ref ctx) {
  return name + " [member " + std::to_string(i) + ", device " +
         std::to_string(ctx.device().ordinal()) + "]";
}

/// Runs `work(i)` for every member, each on a thread of its own (one member: on this thread),
/// and rethrows the first member's failure, in member order, once all are done.
template <class Work>
void on_every_member(std::size_t members, const Work& work) {
  std::vector<std::exception_ptr> failures(members);
  auto guarded = [&](std::size_t i) {
    try {
      work(i);
    } catch (...) {
      failures[i] = std::current_exception();
    }
  };
  if (members == 1) {
    guarded(0);
  } else {
    std::vector<std::jthread> threads;
    threads.reserve(members);
    for (std::size_t i = 0; i < members; ++i) threads.emplace_back(guarded, i);
  }
  for (const auto& failure : failures)
    if (failure) std::rethrow_exception(failure);
}

}  // namespace

struct hot_module_group::state {
  state(std::string n, std::vector<hot_module> m, std::vector<CUcontext> c)
      : name(std::move(n)),
        members(std::move(m)),
        contexts(std::move(c)),
        gate(std::vector<std::uint64_t>(members.size(), 1)) {}

  [[nodiscard]] std::size_t member_of(CUcontext ctx) const {
    for (std::size_t i = 0; i < contexts.size(); ++i)
      if (contexts[i] == ctx) return i;
    std::string known;
    for (const auto c : contexts)
      known += (known.empty() ? "" : ", ") + context_ref::from_native(c).describe();
    detail::throw_errc(errc::precondition, "hot_module_group",
                       "group '" + name + "' has no member in " +
                           (ctx ? context_ref::from_native(ctx).describe()
                                : std::string("no context (none is current)")) +
                           "; its members are in " + known);
  }
  [[nodiscard]] std::size_t checked_member(std::size_t i, const char* who) const {
    if (i >= members.size())
      detail::throw_errc(errc::precondition, who,
                         "group '" + name + "' has " + std::to_string(members.size()) +
                             " members, not a member " + std::to_string(i));
    return i;
  }

  const std::uint64_t serial = next_group_serial();
  std::string name;
  std::vector<hot_module> members;
  std::vector<CUcontext> contexts;  // members[i] is in contexts[i]
  generation_gate gate;
  std::atomic<std::uint64_t> rollbacks{0};
  std::atomic<std::uint64_t> rejected{0};
};

const staged_version& staged_group::member(std::size_t i) const {
  CUBRIDGE_EXPECTS(i < members_.size(), "staged_group has " + std::to_string(members_.size()) +
                                            " members, not a member " + std::to_string(i));
  return members_[i];
}

const pinned_version& pinned_generation::member(std::size_t i) const {
  CUBRIDGE_EXPECTS(i < members_.size(), "pinned_generation has " + std::to_string(members_.size()) +
                                            " members, not a member " + std::to_string(i));
  return members_[i];
}

hot_module_group hot_module_group::load(std::string name, std::vector<context_arg> contexts,
                                        std::span<const std::span<const std::byte>> images,
                                        const hot_module_options& options) {
  CUBRIDGE_EXPECTS(!contexts.empty(), "group '" + name + "' needs at least one context");
  CUBRIDGE_EXPECTS(images.size() == contexts.size(),
                   "group '" + name + "': " + std::to_string(images.size()) + " images for " +
                       std::to_string(contexts.size()) + " contexts (one per context)");
  std::vector<CUcontext> handles;
  for (const auto& c : contexts) {
    const CUcontext h = c.ref().get();
    for (const auto seen : handles)
      CUBRIDGE_EXPECTS(seen != h, "group '" + name + "': " + c.ref().describe() +
                                      " is given twice; one member per context");
    handles.push_back(h);
  }
  std::vector<hot_module> members;
  members.reserve(contexts.size());
  for (std::size_t i = 0; i < contexts.size(); ++i) {
    auto member =
        hot_module::load(contexts[i], member_name(name, i, contexts[i].ref()), images[i], options);
    if (i > 0 && member.checked().kernel_names != members[0].checked().kernel_names)
      detail::throw_errc(errc::precondition, "hot_module_group::load",
                         "group '" + name + "': the image of member " + std::to_string(i) +
                             " exports other kernels than member 0's; every member must "
                             "export the same");
    members.push_back(std::move(member));
  }
  return hot_module_group(
      std::make_shared<state>(std::move(name), std::move(members), std::move(handles)));
}

hot_module_group hot_module_group::load(std::string name, std::vector<context_arg> contexts,
                                        std::span<const std::byte> image,
                                        const hot_module_options& options) {
  const std::vector<std::span<const std::byte>> images(contexts.size(), image);
  return load(std::move(name), std::move(contexts), images, options);
}

hot_module_group::~hot_module_group() = default;

hot_module_group::state& hot_module_group::checked() const {
  CUBRIDGE_EXPECTS(state_ != nullptr, "a moved-from hot_module_group: it has no members any more");
  return *state_;
}

staged_group hot_module_group::stage(std::span<const std::span<const std::byte>> images,
                                     const stage_options& options) const {
  auto& s = checked();
  CUBRIDGE_EXPECTS(images.size() == s.members.size(),
                   "group '" + s.name + "': " + std::to_string(images.size()) + " images for " +
                       std::to_string(s.members.size()) + " members (one per member)");
  return stage_each([&](std::size_t i) { return s.members[i].stage(images[i], options); });
}

staged_group hot_module_group::stage(std::span<const std::byte> image,
                                     const stage_options& options) const {
  // The same bytes for every member: inspected once, not once per member.
  auto& s = checked();
  std::optional<image_info> info;
  try {
    info.emplace(inspect_image(image));
  } catch (const image_error&) {
    s.rejected.fetch_add(1);  // the group refused the version, as for a member's refusal
    throw;
  }
  return stage(image, *info, options);
}

staged_group hot_module_group::stage(std::span<const std::byte> image, const image_info& info,
                                     const stage_options& options) const {
  auto& s = checked();
  return stage_each([&](std::size_t i) { return s.members[i].stage(image, info, options); });
}

staged_group hot_module_group::stage_each(
    const std::function<staged_version(std::size_t)>& stage_one) const {
  auto& s = checked();
  std::vector<std::optional<staged_version>> staged(s.members.size());
  try {
    on_every_member(s.members.size(), [&](std::size_t i) {
      // The member's context current on its staging thread, for the smoke test's calls.
      const scoped_current current(s.members[i].context());
      staged[i].emplace(stage_one(i));
    });
  } catch (...) {
    s.rejected.fetch_add(1);
    throw;  // `staged` unloads what the other members staged
  }
  std::vector<staged_version> out;
  out.reserve(staged.size());
  for (auto& v : staged) out.push_back(std::move(*v));
  return {std::move(out), s.serial};
}

std::uint64_t hot_module_group::promote(staged_group version) {
  return promote(std::move(version), promote_condition::always);
}

std::uint64_t hot_module_group::promote(staged_group version, promote_condition condition) {
  auto& s = checked();
  CUBRIDGE_EXPECTS(version.owner_ != 0 && version.members_.size() == s.members.size(),
                   "promoting a moved-from staged_group into group '" + s.name + "'");
  if (version.owner_ != s.serial)
    detail::throw_errc(errc::precondition, "hot_module_group::promote",
                       "a version staged by another group cannot be promoted into group '" +
                           s.name + "'; stage it with this group, which keeps serving");
  try {
    return s.gate
        .promote([&](std::size_t i, const std::function<void()>& inner) {
          // Member 0's switch lock is held across the others' (generation_gate): its compare
          // stands for the group, whose members share their labels.
          return s.members[i].promote(std::move(version.members_[i]), inner, condition);
        })
        .id;
  } catch (const version_rejected_error&) {
    s.rejected.fetch_add(1);
    throw;
  }
}

apply_result hot_module_group::stage_and_promote(std::span<const std::byte> image,
                                                 const image_info* info,
                                                 const stage_options& options,
                                                 promote_condition condition) {
  return hot_module_internal::stage_and_promote(
      *this, image, info, options, condition,
      [&](staged_group staged) { return promote(std::move(staged), condition); });
}

std::uint64_t hot_module_group::rollback() {
  auto& s = checked();
  const auto back = s.gate.rollback([&](std::size_t i, const std::function<void()>& inner) {
    return s.members[i].rollback(inner);
  });
  if (!back)
    detail::throw_errc(errc::precondition, "hot_module_group::rollback",
                       "group '" + s.name + "' has no previous generation to roll back to");
  s.rollbacks.fetch_add(1);
  return back->id;
}

pinned_generation hot_module_group::pin() const {
  auto& s = checked();
  auto [members, id] = s.gate.pin([&] {
    std::vector<pinned_version> pins;
    pins.reserve(s.members.size());
    for (const auto& m : s.members) pins.push_back(m.pin());
    return pins;
  });
  return {std::move(members), id, s.serial};
}

group_kernel hot_module_group::get_kernel(std::string_view name) const {
  auto& s = checked();
  std::vector<hot_kernel> kernels;
  kernels.reserve(s.members.size());
  for (const auto& m : s.members) kernels.push_back(m.get_kernel(name));
  return {state_, std::move(kernels), std::string(name)};
}

generation hot_module_group::serving() const {
  return checked().gate.current();
}
held_versions hot_module_group::versions() const {
  return checked().members.front().versions();
}
const std::string& hot_module_group::name() const {
  return checked().name;
}
std::size_t hot_module_group::size() const {
  return checked().members.size();
}
const hot_module& hot_module_group::member(std::size_t i) const {
  auto& s = checked();
  return s.members[s.checked_member(i, "hot_module_group::member")];
}
std::size_t hot_module_group::member_of(context_ref ctx) const {
  return checked().member_of(ctx.get());
}

hot_module_group_stats hot_module_group::stats() const {
  auto& s = checked();
  hot_module_group_stats out;
  out.serving = s.gate.current();
  out.promotions = s.gate.switches();
  out.rollbacks = s.rollbacks.load();
  out.rejected = s.rejected.load();
  for (const auto& m : s.members) out.members.push_back(m.stats());
  return out;
}

swap_counters hot_module_group::counters() const {
  const auto stats = this->stats();
  swap_counters c;
  c.promotions = stats.promotions;
  c.rollbacks = stats.rollbacks;
  c.rejected = stats.rejected;
  for (std::size_t i = 0; i < stats.members.size(); ++i) {
    c.unloaded += stats.members[i].unloaded;
    c.reclaim_failures += stats.members[i].reclaim_failures;
    const auto tally = member(i).launches();
    c.launches += tally.launches;
    c.launch_failures += tally.failures;
    if (!tally.last_failure.empty()) c.last_launch_failure = tally.last_failure;
    c.sticky_error = c.sticky_error || tally.sticky;
  }
  return c;
}

compute_capability hot_module_group::device_capability() const {
  return checked().members.front().device_capability();
}

std::size_t hot_module_group::reclaim() const {
  std::size_t unloaded = 0;
  for (const auto& m : checked().members) unloaded += m.reclaim();
  return unloaded;
}

const hot_kernel& group_kernel::on(std::size_t i) const {
  return members_[state_->checked_member(i, "group_kernel::on")];
}

std::size_t group_kernel::member_for(const launch_config& config) const {
  // A serving thread launches on the same stream again and again: its member is looked up once
  // (a destroyed stream's handle may come back for another stream: the generation tells).
  thread_local std::uint64_t cached_group = 0;
  thread_local CUstream cached_stream = nullptr;
  thread_local std::uint64_t cached_generation = 0;
  thread_local std::size_t cached_member = 0;
  CUBRIDGE_EXPECTS(state_ != nullptr, "a moved-from group_kernel");
  if (config.stream.is_legacy() || config.stream.is_per_thread()) {
    // The thread's current context owns these; it can change between launches: not cached.
    CUcontext current = nullptr;
    CUBRIDGE_CU(cuCtxGetCurrent, (&current),
                "finding the member of group '" + state_->name + "' for kernel '" + name_ + "'");
    return state_->member_of(current);
  }
  const CUstream stream = config.stream.get();
  const auto stream_generation = detail::stream_generation();
  if (cached_group == state_->serial && cached_stream == stream &&
      cached_generation == stream_generation)
    return cached_member;
  CUcontext owner = nullptr;
  CUBRIDGE_CU(cuStreamGetCtx, (stream, &owner),
              "finding the member of group '" + state_->name + "' for kernel '" + name_ + "'");
  const auto member = state_->member_of(owner);
  cached_group = state_->serial;
  cached_stream = stream;
  cached_generation = stream_generation;
  cached_member = member;
  return member;
}

std::size_t group_kernel::member_for(const pinned_generation& pinned,
                                     const launch_config& config) const {
  if (pinned.group_ != state_->serial)
    detail::throw_errc(errc::precondition, "group_kernel::launch",
                       "kernel '" + name_ + "' of group '" + state_->name +
                           "' launched on a generation pinned from another group");
  return member_for(config);
}

}  // namespace cubridge
