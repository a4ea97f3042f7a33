// device_buffer.hpp: device memory from the driver (cuMemAlloc) or the runtime (cudaMalloc).
#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/scoped_current.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

namespace cubridge {

namespace detail {

void* allocate_device(allocator_api api, context_ref ctx, std::size_t bytes) {
  if (bytes == 0) return nullptr;
  scoped_current guard(ctx);
  const auto what = [&] { return std::to_string(bytes) + " bytes in " + ctx.describe(); };
  if (api == allocator_api::driver) {
    CUdeviceptr p = 0;
    CUBRIDGE_CU(cuMemAlloc, (&p, bytes), what());
    return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p));
  }
  void* p = nullptr;
  CUBRIDGE_CUDART(cudaMalloc(&p, bytes), what());
  return p;
}

void free_device(allocator_api api, context_ref ctx, void* pointer) noexcept {
  if (api == allocator_api::driver) {
    check_release(driver::api().cuMemFree(reinterpret_cast<CUdeviceptr>(pointer)), "cuMemFree");
    return;
  }
  // cudaFree works on the current context's memory: push the owner for the call.
  if (driver::api().cuCtxPushCurrent(ctx.get()) != CUDA_SUCCESS) return;
  (void)cudaFree(pointer);
  CUcontext popped = nullptr;
  check_release(driver::api().cuCtxPopCurrent(&popped), "cuCtxPopCurrent");
}

}  // namespace detail

}  // namespace cubridge
