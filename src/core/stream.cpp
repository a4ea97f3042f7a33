// Streams of either API, owning and borrowing (stream.hpp), and the hook run before a stream is
// destroyed.
#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/detail/describe.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/event.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/core/stream.hpp>

#include <atomic>
#include <utility>

namespace cubridge {

namespace {
// One process-wide slot, read on every stream destruction: an atomic pointer, no lock (the layer
// that installs a hook keeps its own listeners and their lock).
std::atomic<stream_destroy_hook> installed_hook{nullptr};
}  // namespace

stream_destroy_hook set_stream_destroy_hook(stream_destroy_hook hook) noexcept {
  return installed_hook.exchange(hook, std::memory_order_acq_rel);
}

void before_stream_destroy(CUstream stream) noexcept {
  if (const auto hook = installed_hook.load(std::memory_order_acquire)) hook(stream);
}

void detail::throw_moved_from_stream() {
  throw_moved_from(stream_traits::name,
                   "a launch on it would otherwise run on the legacy default stream");
}

// Each checks the handle (get()) before it calls the driver: a moved-from stream is refused
// as such, with or without a driver.
context_ref stream_ref::context() const {
  const CUstream handle = get();
  CUcontext owner = nullptr;
  CUBRIDGE_CU(cuStreamGetCtx, (handle, &owner),
              "asking which context owns " + detail::stream_name(handle));
  return context_ref::from_native(owner);
}

void stream_ref::synchronize() const {
  const CUstream handle = get();
  CUBRIDGE_CU(cuStreamSynchronize, (handle), detail::stream_name(handle));
}

bool stream_ref::ready() const {
  const CUstream handle = get();
  const CUresult r = driver::api().cuStreamQuery(handle);
  if (r == CUDA_ERROR_NOT_READY) return false;
  if (r != CUDA_SUCCESS)
    detail::throw_driver_error(r, "cuStreamQuery", detail::stream_name(handle_),
                               std::source_location::current());
  return true;
}

void stream_ref::wait(event_ref event) const {
  const CUstream handle = get();
  CUBRIDGE_CU(cuStreamWaitEvent, (handle, event.get(), 0),
              detail::stream_name(handle_) + " waiting for " + detail::event_name(event.get()));
}

stream stream::create(context_arg ctx, unsigned flags) {
  scoped_current guard(ctx.ref());
  CUstream handle = nullptr;
  CUBRIDGE_CU(cuStreamCreate, (&handle, flags), "creating a stream in " + ctx.ref().describe());
  return stream(handle, std::move(ctx));
}

stream stream::from_native(CUstream handle, context_arg ctx) {
  const auto view = stream_ref::from_native(handle);
  CUBRIDGE_EXPECTS(!view.is_legacy() && !view.is_per_thread() && !view.is_moved_from(),
                   "adopting " + detail::stream_name(handle) +
                       ": only a created stream can be owned (and destroyed)");
  return stream(handle, std::move(ctx));
}

void detail::stream_traits::destroy(CUstream handle, const context_arg&) noexcept {
  before_stream_destroy(handle);
  check_release(driver::api().cuStreamDestroy(handle), "cuStreamDestroy");
}

}  // namespace cubridge
