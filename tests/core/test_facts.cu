// Pins down the facts of FACTS.md that cubridge relies on, so that a driver change is noticed.
// Each fact runs in a child process of its own (threadsafe death-test style): resets and
// primary-context state must not leak between facts.
#include <cubridge/core/context.hpp>
#include <cubridge/core/module.hpp>
#include <cubridge/core/scoped_current.hpp>

#include "driver_helpers.hpp"
#include "gpu_test.hpp"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

namespace {

using cubridge::testing::cu;

__global__ void write_values(int* out, int value, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = value + i;
}

#define FACT_CHECK(condition, code)                                              \
  do {                                                                           \
    if (!(condition)) {                                                          \
      std::fprintf(stderr, "fact broken: %s (line %d)\n", #condition, __LINE__); \
      std::exit(code);                                                           \
    }                                                                            \
  } while (false)

/// Fills n ints on `out` with a driver-loaded kernel in the current context, then checks them.
bool driver_kernel_writes(const cubridge::kernel& fill, CUdeviceptr out, unsigned value, int n) {
  try {
    fill.launch({.grid = {static_cast<unsigned>((n + 255) / 256)},
                 .block = {256},
                 .stream = cubridge::stream_ref::legacy_default()},
                reinterpret_cast<unsigned*>(out), value, static_cast<std::size_t>(n));
    if (cu().cuCtxSynchronize() != CUDA_SUCCESS) return false;
    std::vector<unsigned> host(n);
    if (cu().cuMemcpy(reinterpret_cast<CUdeviceptr>(host.data()), out, n * sizeof(unsigned)) !=
        CUDA_SUCCESS)
      return false;
    for (unsigned v : host)
      if (v != value) return false;
    return true;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return false;
  }
}

[[noreturn]] void fact_RuntimeFirstCurrentContextIsThePrimary() {
  FACT_CHECK(cudaFree(nullptr) == cudaSuccess, 2);
  CUcontext current = nullptr, primary = nullptr;
  FACT_CHECK(cu().cuCtxGetCurrent(&current) == CUDA_SUCCESS, 3);
  FACT_CHECK(cu().cuDevicePrimaryCtxRetain(&primary, 0) == CUDA_SUCCESS, 4);
  FACT_CHECK(current == primary, 5);
  std::exit(0);
}

[[noreturn]] void fact_DriverFirstRuntimeWorksInTheDriversContext() {
  auto ctx = cubridge::context::create(cubridge::device::get(0));
  cubridge::scoped_current guard(ctx);
  int* p = nullptr;
  FACT_CHECK(cudaMalloc(&p, 1024 * sizeof(int)) == cudaSuccess, 2);
  CUcontext owner = nullptr;
  FACT_CHECK(cu().cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT,
                                        reinterpret_cast<CUdeviceptr>(p)) == CUDA_SUCCESS,
             3);
  FACT_CHECK(owner == ctx.get(), 4);
  write_values<<<4, 256>>>(p, 7, 1024);
  FACT_CHECK(cudaDeviceSynchronize() == cudaSuccess, 5);
  std::vector<int> host(1024);
  FACT_CHECK(cudaMemcpy(host.data(), p, 1024 * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess,
             6);
  for (int i = 0; i < 1024; ++i) FACT_CHECK(host[i] == 7 + i, 7);
  unsigned flags = 0;
  int active = 1;
  FACT_CHECK(cu().cuDevicePrimaryCtxGetState(0, &flags, &active) == CUDA_SUCCESS, 8);
  FACT_CHECK(active == 0, 9);
  FACT_CHECK(cudaFree(p) == cudaSuccess, 10);
  std::exit(0);
}

[[noreturn]] void fact_DeviceResetWithANonPrimaryContextCurrentDestroysNothingVisible() {
  auto ctx = cubridge::context::create(cubridge::device::get(0));
  cubridge::scoped_current guard(ctx);
  auto module = cubridge::module::load_file(ctx, cubridge::testing::test_cubin_path());
  auto fill = module.get_kernel("fill_u32");
  CUdeviceptr buffer = 0;
  FACT_CHECK(cu().cuMemAlloc(&buffer, 4096 * sizeof(unsigned)) == CUDA_SUCCESS, 2);
  FACT_CHECK(driver_kernel_writes(fill, buffer, 11, 4096), 3);
  (void)cudaDeviceReset();
  FACT_CHECK(cubridge::context_ref::current() == ctx.ref(), 4);
  FACT_CHECK(driver_kernel_writes(fill, buffer, 12, 4096), 5);
  std::exit(0);
}

[[noreturn]] void fact_DeviceResetWithThePrimaryCurrentSparesOtherContexts() {
  auto other = cubridge::context::create(cubridge::device::get(0));
  auto other_module = cubridge::module::load_file(other, cubridge::testing::test_cubin_path());
  auto other_fill = other_module.get_kernel("fill_u32");
  CUdeviceptr other_buffer = 0;
  {
    cubridge::scoped_current guard(other);
    FACT_CHECK(cu().cuMemAlloc(&other_buffer, 4096 * sizeof(unsigned)) == CUDA_SUCCESS, 2);
  }
  FACT_CHECK(cudaFree(nullptr) == cudaSuccess, 3);  // the primary context is now current
  int* primary_buffer = nullptr;
  FACT_CHECK(cudaMalloc(&primary_buffer, 4096) == cudaSuccess, 4);
  (void)cudaDeviceReset();
  int probe = 0;
  const CUresult after = cu().cuMemcpy(reinterpret_cast<CUdeviceptr>(&probe),
                                       reinterpret_cast<CUdeviceptr>(primary_buffer), sizeof probe);
  FACT_CHECK(after != CUDA_SUCCESS, 5);  // the primary's buffer is gone
  cubridge::scoped_current guard(other);
  FACT_CHECK(driver_kernel_writes(other_fill, other_buffer, 21, 4096), 6);
  std::exit(0);
}

[[noreturn]] void fact_AKernelInOneContextWritesMemAllocMemoryOfAnother() {
  auto a = cubridge::context::create(cubridge::device::get(0));
  auto b = cubridge::context::create(cubridge::device::get(0));
  CUdeviceptr in_a = 0;
  {
    cubridge::scoped_current guard(a);
    FACT_CHECK(cu().cuMemAlloc(&in_a, 1024 * sizeof(unsigned)) == CUDA_SUCCESS, 2);
  }
  auto module_b = cubridge::module::load_file(b, cubridge::testing::test_cubin_path());
  cubridge::scoped_current guard(b);
  FACT_CHECK(driver_kernel_writes(module_b.get_kernel("fill_u32"), in_a, 31, 1024), 3);
  std::exit(0);
}

class Facts : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(Facts, RuntimeFirstCurrentContextIsThePrimary) {
  CUBRIDGE_REQUIRE_GPU();
  CUBRIDGE_EXPECT_CLEAN_EXIT(fact_RuntimeFirstCurrentContextIsThePrimary(), "");
}

TEST_F(Facts, DriverFirstRuntimeWorksInTheDriversContext) {
  CUBRIDGE_REQUIRE_GPU();
  CUBRIDGE_EXPECT_CLEAN_EXIT(fact_DriverFirstRuntimeWorksInTheDriversContext(), "");
}

TEST_F(Facts, DeviceResetWithANonPrimaryContextCurrentDestroysNothingVisible) {
  CUBRIDGE_REQUIRE_GPU();
  CUBRIDGE_EXPECT_CLEAN_EXIT(fact_DeviceResetWithANonPrimaryContextCurrentDestroysNothingVisible(),
                             "");
}

TEST_F(Facts, DeviceResetWithThePrimaryCurrentSparesOtherContexts) {
  CUBRIDGE_REQUIRE_GPU();
  CUBRIDGE_EXPECT_CLEAN_EXIT(fact_DeviceResetWithThePrimaryCurrentSparesOtherContexts(), "");
}

TEST_F(Facts, AKernelInOneContextWritesMemAllocMemoryOfAnother) {
  // Undocumented (the programming guide calls contexts separate address spaces): if this ever
  // fails, cross-context sharing must go through VMM only, as cubridge's shared memory does.
  CUBRIDGE_REQUIRE_GPU();
  CUBRIDGE_EXPECT_CLEAN_EXIT(fact_AKernelInOneContextWritesMemAllocMemoryOfAnother(), "");
}

}  // namespace
