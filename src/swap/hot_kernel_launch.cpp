// The launch path of hot kernels: the current version pinned for each launch, the stream noted
// once per thread through a per-thread cache, the launch shape raised for later versions to fit.
// hot_kernel::launch (hot_module.hpp) calls acquire() and finish() for every launch.
#include "hot_module_state.hpp"

#include <cubridge/swap/detail/stream_listeners.hpp>
#include <cubridge/swap/hot_module.hpp>

namespace cubridge {

namespace hot_module_internal {

void refuse_per_thread_stream(const std::string& what) {
  detail::throw_errc(errc::precondition, "hot launch",
                     what +
                         " on the per-thread default stream (CU_STREAM_PER_THREAD): it is "
                         "another stream on every thread, so the event that lets its "
                         "version be unloaded could not follow this thread's work. Launch on "
                         "a stream of your own (cubridge::stream) or the legacy default stream");
}

}  // namespace hot_module_internal

hot_kernel::chain::lease hot_kernel::acquire() const {
  CUBRIDGE_EXPECTS(state_ != nullptr, "a moved-from hot_kernel");
  return state_->versions.acquire();
}

std::vector<parameter_info> hot_kernel::parameters() const {
  const auto lease = acquire();
  const auto p = lease.payload().kernels[index_].parameters();
  return {p.begin(), p.end()};
}

hot_kernel::chain::lease hot_kernel::acquire(const launch_config& config) const {
  if (config.stream.is_per_thread()) [[unlikely]]
    hot_module_internal::refuse_per_thread_stream("hot kernel '" + name_ + "' of module '" +
                                                  (state_ ? state_->name : std::string("?")) +
                                                  "' launched");
  return acquire();
}

const hot_kernel::chain::lease& hot_kernel::checked_pin(const pinned_version& pinned,
                                                        const launch_config& config) const {
  CUBRIDGE_EXPECTS(state_ != nullptr, "a moved-from hot_kernel");
  if (pinned.module_serial_ != state_->serial) [[unlikely]]
    detail::throw_errc(errc::precondition, "hot_kernel::launch",
                       "hot kernel '" + name_ + "' of module '" + state_->name +
                           "' launched on a version pinned from another hot module");
  if (config.stream.is_per_thread()) [[unlikely]]
    hot_module_internal::refuse_per_thread_stream("hot kernel '" + name_ + "' of module '" +
                                                  state_->name + "' launched");
  return pinned.lease_;
}

void hot_kernel::finish(const chain::lease& lease, const launch_config& config) const {
  // A serving thread launches the same version on the same stream again and again; noting the
  // stream once is enough (the note holds until the version is unpinned and retired, after which
  // no lease on it exists), so repeats skip the version's mutex.
  // A destroyed stream's handle may come back for a new stream: the generation tells.
  thread_local std::uint64_t noted_serial = 0;
  thread_local CUstream noted_stream = nullptr;
  thread_local std::uint64_t noted_generation = 0;
  const CUstream stream = config.stream.get();
  const auto generation = detail::stream_generation();
  if (noted_serial != lease.serial() || noted_stream != stream || noted_generation != generation) {
    lease.note(stream);
    noted_serial = lease.serial();
    noted_stream = stream;
    noted_generation = generation;
  }
  count_launch(lease, config);
}

void hot_kernel::count_launch(const chain::lease& lease, const launch_config& config) const {
  note_usage(config);
  // For a poison record's suspect (process_health): written only when another kernel launches,
  // so that a serving loop of one kernel reads the line and never writes it.
  if (state_->last_kernel.load(std::memory_order_relaxed) != index_)
    state_->last_kernel.store(static_cast<std::uint32_t>(index_), std::memory_order_relaxed);
  lease.payload().counters->launches.fetch_add(1, std::memory_order_relaxed);
}

void hot_kernel::count_failure(const hot_version& version) noexcept {
  auto& c = *version.counters;
  c.failures.fetch_add(1, std::memory_order_relaxed);
  try {
    throw;  // the launch's exception, to read its code
  } catch (const error& e) {
    if (e.source() == error_source::driver)
      c.last_failure.store(e.code(), std::memory_order_relaxed);
  } catch (...) {
  }
}

void hot_kernel::note_usage(const launch_config& config) const noexcept {
  auto& usage = state_->usage[index_];
  hot_module_internal::raise_to(usage.threads_per_block, config.block.volume());
  hot_module_internal::raise_to(usage.dynamic_shared_bytes, config.dynamic_shared_bytes);
}

}  // namespace cubridge
