#pragma once
// Raw Driver API helpers shared by the tests that cross-check cubridge against the driver.

#include <cubridge/core/context.hpp>
#include <cubridge/core/device.hpp>
#include <cubridge/core/driver.hpp>

#include <gtest/gtest.h>

#include <cuda.h>

#include <cstdint>

namespace cubridge::testing {

/// The driver's entry points, for raw calls.
inline const driver::entry_points& cu() {
  return driver::api();
}

/// The calling thread's current context, straight from the driver. A failed query is a test
/// failure and answers an address that is no context (~0), so that every comparison with it
/// fails too, also in a child process whose gtest failures nobody sees.
inline CUcontext raw_current() {
  CUcontext c = nullptr;
  const CUresult r = cu().cuCtxGetCurrent(&c);
  if (r != CUDA_SUCCESS) {
    ADD_FAILURE() << "cuCtxGetCurrent failed: " << static_cast<int>(r);
    return reinterpret_cast<CUcontext>(~std::uintptr_t{0});
  }
  return c;
}

/// A host or device pointer as the CUdeviceptr raw copies take.
inline CUdeviceptr as_address(const void* p) {
  return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p));
}

/// A new context on device 0 (not current).
inline context make_context() {
  return context::create(device::get(0));
}

}  // namespace cubridge::testing
