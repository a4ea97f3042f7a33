// hot_module: the first version and the state around it, promote and rollback, and what reads
// the serving version. Staging is in hot_module_stage.cpp, the reclaimer in
// hot_module_reclaim.cpp, tracked graphs in hot_module_graphs.cpp, the launch path in
// hot_kernel_launch.cpp; they share hot_module_state.hpp.
#include "hot_module_state.hpp"
#include "swap_trace.hpp"

#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/image.hpp>
#include <cubridge/core/log.hpp>
#include <cubridge/core/process_health.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/swap/detail/stream_listeners.hpp>
#include <cubridge/swap/hot_module.hpp>

#include <atomic>
#include <chrono>
#include <mutex>

namespace cubridge {

namespace hot_module_internal {

std::uint64_t next_module_serial() noexcept {
  static std::atomic<std::uint64_t> counter{1};
  return counter.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace hot_module_internal

namespace {

std::vector<std::string> interface_of(const image_info& info, const std::string& name) {
  std::vector<std::string> names;
  names.reserve(info.kernels.size());
  for (const auto& k : info.kernels) names.push_back(k.name);
  if (names.empty())
    detail::throw_errc(errc::precondition, "hot_module::load",
                       "module '" + name +
                           "': the first version exports no kernel that the "
                           "image inspector can see (an image of no kernels, or only LTO IR?)");
  return names;
}

/// The loaded version's origin: as given, with "load" and the load time where unset.
version_origin first_origin(version_origin origin) {
  if (origin.source.empty()) origin.source = "load";
  if (origin.staged_at == std::chrono::system_clock::time_point{})
    origin.staged_at = std::chrono::system_clock::now();
  return origin;
}

}  // namespace

hot_module::state::state(context_arg c, std::string n, std::vector<std::string> names,
                         hot_version first, hot_module_options o)
    : ctx(std::move(c)),
      name(std::move(n)),
      kernel_names(std::move(names)),
      usage(kernel_names.size()),
      versions(std::move(first), first_origin(o.origin)),
      options(std::move(o)),
      serving_label(options.origin.label),
      stream_listener(detail::add_stream_listener([this](CUstream s) { seal(s); })),
      reclaimer([this] {
        detail::run_reclaimer(
            signal, [this] { return reclaim_now(); }, std::chrono::milliseconds(1),
            std::chrono::milliseconds(100), [] {});
      }) {
  register_live(this);
}

hot_module::state::~state() {
  unregister_live(this);
  detail::remove_stream_listener(stream_listener);
  signal.stop();
  reclaimer.join();
}

hot_module hot_module::load(context_arg ctx, std::string name, std::span<const std::byte> image,
                            hot_module_options options) {
  const auto info = inspect_image(image);  // once, for the interface and the loader
  auto names = interface_of(info, name);
  auto loaded = module::load(ctx, image, info, {.name = name + " v1"});
  hot_version first{std::move(loaded), {}, {}};
  first.image = std::make_shared<const std::vector<std::byte>>(image.begin(), image.end());
  for (const auto& k : names) {
    first.kernels.push_back(first.loaded.get_kernel(k));
    first.limits.push_back(hot_module_internal::limits_of(first.kernels.back()));
  }
  return hot_module(std::make_shared<state>(std::move(ctx), std::move(name), std::move(names),
                                            std::move(first), std::move(options)));
}

hot_module::~hot_module() = default;

hot_module::state& hot_module::checked() const {
  CUBRIDGE_EXPECTS(state_ != nullptr, "a moved-from hot_module: it has no module any more");
  return *state_;
}
std::uint64_t hot_module::promote(staged_version version) {
  return promote(std::move(version), {});
}

std::uint64_t hot_module::promote(staged_version version, const std::function<void()>& inner,
                                  promote_condition condition) {
  auto& s = checked();
  CUBRIDGE_EXPECTS(version.owner_ != 0,
                   "promoting a moved-from staged_version into module '" + s.name + "'");
  if (version.owner_ != s.serial)
    detail::throw_errc(errc::precondition, "hot_module::promote",
                       "a version staged by " + version.owner_name_ + " cannot be promoted into " +
                           "module '" + s.name + "' in " + s.ctx.ref().describe() +
                           ": its kernels are another module's; stage it with this module, "
                           "which keeps serving");
  const std::string trace = "promote module '" + s.name + "' version from " + version.source_ +
                            swap_trace::label_suffix(version.origin_.label);
  const swap_trace::scoped_range range{trace};
  state::switching lock(s, !version.carry_globals_.empty());
  const std::uint64_t label = version.origin_.label;  // what serves after the switch
  const auto id = s.versions.promote(
      std::move(version.version_), std::move(version.origin_),
      [&](const auto& from, const auto& to) {
        // The compare of compare-and-apply, under the lock the switch is made in.
        if (condition == promote_condition::label_above_serving &&
            to.origin.label <= from.origin.label)
          throw hot_module_internal::not_newer(from.origin.label, from.id);
        // Everything that can fail, before the switch; the staged version is not serving yet.
        if (const auto why = s.misfit(to.payload, "the new version"); !why.empty()) {
          s.rejected.fetch_add(1);
          throw version_rejected_error("hot_module::promote",
                                       "module '" + s.name + "' version from " + version.source_ +
                                           ": " + why + "; the current version keeps serving");
        }
        for (const auto& variable : version.carry_globals_) {
          const auto source = from.payload.loaded.get_global(variable);
          const auto target = to.payload.loaded.get_global(variable);
          CUBRIDGE_CU(cuMemcpy, (target.address(), source.address(), source.size()),
                      "carrying __device__ variable '" + variable + "' of module '" + s.name +
                          "' into the new version");
        }
        s.retarget_all(from.payload, to.payload, to.id);
        s.run_inner(inner, from.payload);
      });
  for (auto& g : s.graphs) g->bound_version = id;
  s.note_serving(id, label);
  s.signal.notify();
  if (log::enabled(log::level::info))
    log::info("module '" + s.name + "' promoted the version from " + version.source_ +
              ": it serves as version " + std::to_string(id));
  return id;
}

std::uint64_t hot_module::rollback() {
  return rollback({});
}

apply_result hot_module::stage_and_promote(std::span<const std::byte> image, const image_info* info,
                                           const stage_options& options,
                                           promote_condition condition) {
  return hot_module_internal::stage_and_promote(
      *this, image, info, options, condition,
      [&](staged_version staged) { return promote(std::move(staged), {}, condition); });
}

std::uint64_t hot_module::rollback(const std::function<void()>& inner) {
  auto& s = checked();
  state::switching lock(s, false);
  // Under the swap lock the target cannot change before the switch.
  const auto target = s.versions.previous_id();
  const std::string trace = "rollback module '" + s.name + "' to version " +
                            (target ? std::to_string(*target) : std::string("(none)"));
  const swap_trace::scoped_range range{trace};
  std::uint64_t label = 0;  // the target's, read in the switch: what serves after it
  const auto id = s.versions.rollback([&](const auto& from, const auto& to) {
    const std::string who = "version " + std::to_string(to.id);
    if (const auto why = s.misfit(to.payload, who); !why.empty())
      throw version_rejected_error("hot_module::rollback",
                                   "module '" + s.name + "': rollback to " + who +
                                       " refused: " + why + "; version " + std::to_string(from.id) +
                                       " keeps serving");
    s.retarget_all(from.payload, to.payload, to.id);
    s.run_inner(inner, from.payload);
    label = to.origin.label;
  });
  s.rollbacks.fetch_add(1);
  for (auto& g : s.graphs) g->bound_version = id;
  s.note_serving(id, label);
  s.signal.notify();
  if (log::enabled(log::level::info))
    log::info("module '" + s.name + "' rolled back: version " + std::to_string(id) + " serves");
  return id;
}

hot_kernel hot_module::get_kernel(std::string_view name) const {
  auto& s = checked();
  for (std::size_t i = 0; i < s.kernel_names.size(); ++i)
    if (s.kernel_names[i] == name) return hot_kernel(state_, i, std::string(name));
  detail::throw_errc(errc::precondition, "hot_module::get_kernel",
                     "module '" + s.name + "' has no kernel '" + std::string(name) + "'");
}

std::uint64_t hot_module::read_global(std::string_view variable, std::span<std::byte> out) const {
  auto& s = checked();
  scoped_current current(s.ctx.ref());
  const auto serving = s.versions.acquire();
  const auto bytes = serving.payload().loaded.get_global(variable);
  const std::string what = "__device__ variable '" + std::string(variable) + "' of module '" +
                           s.name + "' version " + std::to_string(serving.id());
  if (bytes.size() != out.size())
    detail::throw_errc(errc::precondition, "hot_module::read_global",
                       what + " is " + std::to_string(bytes.size()) + " bytes, the destination " +
                           std::to_string(out.size()));
  CUBRIDGE_CU(cuMemcpy, (reinterpret_cast<CUdeviceptr>(out.data()), bytes.address(), out.size()),
              what);
  return serving.id();
}

const std::string& hot_module::name() const {
  return checked().name;
}
context_ref hot_module::context() const {
  return checked().ctx.ref();
}
compute_capability hot_module::device_capability() const {
  return checked().ctx.ref().device().capability();
}

swap_counters hot_module::counters() const {
  const auto s = stats();
  const auto tally = launches();
  swap_counters c;
  c.promotions = s.promotions;
  c.rollbacks = s.rollbacks;
  c.rejected = s.rejected;
  c.unloaded = s.unloaded;
  c.reclaim_failures = s.reclaim_failures;
  c.launches = tally.launches;
  c.launch_failures = tally.failures;
  c.last_launch_failure = tally.last_failure;
  c.sticky_error = tally.sticky;
  return c;
}

hot_module_stats hot_module::stats() const {
  auto& s = checked();
  const auto chain_stats = s.versions.get_stats();
  hot_module_stats out;
  out.current_id = chain_stats.current_id;
  out.promotions = chain_stats.promotions;
  out.rollbacks = s.rollbacks.load();
  out.rejected = s.rejected.load();
  out.retired_waiting = chain_stats.retired;
  out.unloaded = chain_stats.reclaimed;
  out.reclaim_failures = s.reclaim_failures.load();
  std::lock_guard lock(s.failure_mutex);
  out.last_reclaim_failure = s.last_reclaim_failure;
  return out;
}

pinned_version hot_module::pin() const {
  auto& s = checked();
  return {s.versions.acquire(), s.serial};
}

prewarm_report hot_module::prewarm() const {
  auto& s = checked();
  const auto serving = s.versions.acquire();  // held: no unload while its kernels load
  prewarm_plan plan;
  for (const auto& k : serving.payload().kernels) plan.kernel(k);
  return plan.run(s.ctx.ref());
}

held_versions hot_module::versions() const {
  return checked().versions.held();
}

namespace {

// The launch errors after which the context is unusable: every later call in it fails with the
// same error (CUDA's "sticky" errors; the context must be destroyed).
bool poisons_the_context(CUresult r) noexcept {
  return is_sticky_error(r) || r == CUDA_ERROR_CONTEXT_IS_DESTROYED;
}

}  // namespace

launch_tally hot_module::launches() const {
  const auto& s = checked();
  const auto lease = s.versions.acquire();
  const auto held = s.versions.held();
  launch_tally h;
  h.version_id = lease.id();
  if (held.serving.id == h.version_id) h.label = held.serving.origin.label;
  const auto& c = *lease.payload().counters;
  h.launches = c.launches.load(std::memory_order_relaxed);
  h.failures = c.failures.load(std::memory_order_relaxed);
  if (const int code = c.last_failure.load(std::memory_order_relaxed); code != 0) {
    h.last_failure = detail::driver_error_name(static_cast<CUresult>(code));
    h.sticky = poisons_the_context(static_cast<CUresult>(code));
  }
  return h;
}

}  // namespace cubridge
