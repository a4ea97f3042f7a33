#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/detail/describe.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/primary_context.hpp>

#include <cuda_runtime_api.h>

namespace cubridge {

class primary_context::owner final : public detail::context_owner {
 public:
  owner(CUcontext handle, cubridge::device dev, unsigned long long id) noexcept
      : context_owner(handle), device_(dev), id_(id) {}
  ~owner() override {
    detail::check_release(driver::api().cuDevicePrimaryCtxRelease(device_.get()),
                          "cuDevicePrimaryCtxRelease");
  }
  cubridge::device device_;
  unsigned long long id_;
};

primary_context::primary_context(std::shared_ptr<const owner> state) noexcept
    : state_(std::move(state)) {}

primary_context primary_context::retain(cubridge::device dev) {
  CUcontext handle = nullptr;
  const std::string what = "primary context of device " + std::to_string(dev.ordinal());
  CUBRIDGE_CU(cuDevicePrimaryCtxRetain, (&handle, dev.get()), what);
  unsigned long long id = 0;
  if (const CUresult r = driver::api().cuCtxGetId(handle, &id); r != CUDA_SUCCESS) {
    driver::api().cuDevicePrimaryCtxRelease(dev.get());
    detail::throw_driver_error(r, "cuCtxGetId", what, std::source_location::current());
  }
  return primary_context(std::make_shared<const owner>(handle, dev, id));
}

primary_context primary_context::adopt_runtime() {
  // cudaFree(0) initialises the runtime and its primary context, or does nothing if a library
  // already did; either way the runtime's context is then current on this thread.
  CUBRIDGE_CUDART(cudaFree(nullptr), "initialising the CUDA runtime");
  int ordinal = 0;
  CUBRIDGE_CUDART(cudaGetDevice(&ordinal), "reading the runtime's current device");
  auto adopted = retain(cubridge::device::get(ordinal));
  const auto current = context_ref::current();
  if (current != adopted.ref())
    detail::throw_errc(errc::precondition, "primary_context::adopt_runtime",
                       "the runtime's current context " + current.describe() +
                           " is not the primary context " + adopted.ref().describe() +
                           " of device " + std::to_string(ordinal) +
                           "; adopt it with context_ref::current() instead");
  return adopted;
}

CUcontext primary_context::get() const noexcept {
  return state_ ? state_->get() : nullptr;
}

primary_context::operator context_arg() const noexcept {
  return {ref(), state_};
}

device primary_context::device() const noexcept {
  return state_->device_;
}

unsigned long long primary_context::retained_id() const noexcept {
  return state_->id_;
}

bool primary_context::was_reset() const noexcept {
  if (!state_ || !driver::available()) return false;
  unsigned long long id = 0;
  const CUresult r = driver::api().cuCtxGetId(state_->get(), &id);
  return r != CUDA_SUCCESS || id != state_->id_;
}

void primary_context::check_not_reset() const {
  CUBRIDGE_EXPECTS(state_ != nullptr, "primary_context was moved from");
  unsigned long long id = 0;
  const CUresult r = driver::api().cuCtxGetId(state_->get(), &id);
  const std::string what = "primary context " + detail::hex(state_->get()) + " of device " +
                           std::to_string(state_->device_.ordinal()) + " retained with id " +
                           std::to_string(state_->id_);
  if (r != CUDA_SUCCESS)
    detail::throw_errc(errc::context_reset, "cuCtxGetId",
                       what + " was destroyed (" + detail::driver_error_name(r) +
                           "); a library probably called cudaDeviceReset");
  if (id != state_->id_)
    detail::throw_errc(errc::context_reset, "cuCtxGetId",
                       what + " was reset and re-created with id " + std::to_string(id) +
                           "; buffers and modules made before are gone");
}

}  // namespace cubridge
