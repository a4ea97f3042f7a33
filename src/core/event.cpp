// Events of either API, owning and borrowing (event.hpp).
#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/detail/describe.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/event.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/core/stream.hpp>

#include <utility>

namespace cubridge {

void detail::throw_moved_from_event() {
  throw_moved_from(event_traits::name);
}

// Each checks the handle (get()) before it calls the driver: a moved-from event is refused as
// such, with or without a driver.
void event_ref::record(stream_ref stream) const {
  const CUevent handle = get();
  const CUstream on = stream.get();
  CUBRIDGE_CU(cuEventRecord, (handle, on),
              detail::event_name(handle) + " on " + detail::stream_name(on));
}

void event_ref::synchronize() const {
  const CUevent handle = get();
  CUBRIDGE_CU(cuEventSynchronize, (handle), detail::event_name(handle));
}

bool event_ref::ready() const {
  const CUevent handle = get();
  const CUresult r = driver::api().cuEventQuery(handle);
  if (r == CUDA_ERROR_NOT_READY) return false;
  if (r != CUDA_SUCCESS)
    detail::throw_driver_error(r, "cuEventQuery", detail::event_name(handle),
                               std::source_location::current());
  return true;
}

float event_ref::elapsed_ms_since(event_ref start) const {
  const CUevent handle = get();
  const CUevent from = start.get();
  float ms = 0;
  CUBRIDGE_CU(cuEventElapsedTime, (&ms, from, handle),
              "from " + detail::event_name(from) + " to " + detail::event_name(handle));
  return ms;
}

event event::create(context_arg ctx, unsigned flags) {
  scoped_current guard(ctx.ref());
  CUevent handle = nullptr;
  CUBRIDGE_CU(cuEventCreate, (&handle, flags), "creating an event in " + ctx.ref().describe());
  return event(handle, std::move(ctx));
}

event event::from_native(CUevent handle, context_arg ctx) {
  CUBRIDGE_EXPECTS(handle != nullptr && handle != detail::moved_from_event(),
                   "adopting an event: only a created event can be owned (and destroyed)");
  return event(handle, std::move(ctx));
}

void detail::event_traits::destroy(CUevent handle, const context_arg&) noexcept {
  check_release(driver::api().cuEventDestroy(handle), "cuEventDestroy");
}

}  // namespace cubridge
