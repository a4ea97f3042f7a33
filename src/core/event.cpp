// Events of either API, owning and borrowing (event.hpp).
#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/detail/describe.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/event.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/core/stream.hpp>

#include <utility>

namespace cubridge {

void event_ref::record(stream_ref stream) const {
  const CUstream on = stream.get();
  CUBRIDGE_CU(cuEventRecord, (handle_, on),
              detail::event_name(handle_) + " on " + detail::stream_name(stream.get()));
}

void event_ref::synchronize() const {
  CUBRIDGE_CU(cuEventSynchronize, (handle_), detail::event_name(handle_));
}

bool event_ref::ready() const {
  const CUresult r = driver::api().cuEventQuery(handle_);
  if (r == CUDA_ERROR_NOT_READY) return false;
  if (r != CUDA_SUCCESS)
    detail::throw_driver_error(r, "cuEventQuery", detail::event_name(handle_),
                               std::source_location::current());
  return true;
}

float event_ref::elapsed_ms_since(event_ref start) const {
  float ms = 0;
  CUBRIDGE_CU(cuEventElapsedTime, (&ms, start.get(), handle_),
              "from " + detail::event_name(start.get()) + " to " + detail::event_name(handle_));
  return ms;
}

event event::create(context_arg ctx, unsigned flags) {
  scoped_current guard(ctx.ref());
  CUevent handle = nullptr;
  CUBRIDGE_CU(cuEventCreate, (&handle, flags), "creating an event in " + ctx.ref().describe());
  return event(std::move(ctx), handle);
}

event::event(context_arg ctx, CUevent handle) noexcept : event_ref(handle), ctx_(std::move(ctx)) {}

event::event(event&& other) noexcept
    : event_ref(std::exchange(other.handle_, nullptr)), ctx_(std::move(other.ctx_)) {}

event& event::operator=(event&& other) noexcept {
  if (this != &other) {
    if (handle_) detail::check_release(driver::api().cuEventDestroy(handle_), "cuEventDestroy");
    handle_ = std::exchange(other.handle_, nullptr);
    ctx_ = std::move(other.ctx_);
  }
  return *this;
}

event::~event() {
  if (handle_) detail::check_release(driver::api().cuEventDestroy(handle_), "cuEventDestroy");
}

CUevent event::release() noexcept {
  return std::exchange(handle_, nullptr);
}

}  // namespace cubridge
