// context_of / memory_kind_of: which context owns an address, and what kind of memory it is.
#include <cubridge/core/context.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/core/pinned_buffer.hpp>
#include <cubridge/core/pointer.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/core/shared_device_memory.hpp>

#include "driver_helpers.hpp"
#include "gpu_test.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace {

using cubridge::testing::cu;
using cubridge::testing::make_context;

/// "0x7ffd1234" as cubridge writes addresses in messages.
std::string hex(const void* p) {
  char text[32];
  std::snprintf(text, sizeof text, "0x%llx",
                static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(p)));
  return text;
}

/// Raw cuMemAlloc in `ctx` (pushed for the call), freed by the returned owner with `ctx` pushed.
struct raw_allocation {
  cubridge::context_ref ctx;
  CUdeviceptr address = 0;
  raw_allocation(cubridge::context_ref c, std::size_t bytes) : ctx(c) {
    cubridge::scoped_current guard(ctx);
    EXPECT_EQ(cu().cuMemAlloc(&address, bytes), CUDA_SUCCESS);
  }
  raw_allocation(const raw_allocation&) = delete;
  raw_allocation& operator=(const raw_allocation&) = delete;
  ~raw_allocation() {
    if (!address) return;
    cubridge::scoped_current guard(ctx);
    EXPECT_EQ(cu().cuMemFree(address), CUDA_SUCCESS);
  }
  [[nodiscard]] const void* pointer() const {
    return reinterpret_cast<const void*>(static_cast<std::uintptr_t>(address));
  }
};

TEST(ContextOf, CuMemAllocMemoryOfTwoContexts) {
  CUBRIDGE_REQUIRE_GPU();
  auto a = make_context();
  auto b = make_context();
  const raw_allocation in_a(a, 4096);
  const raw_allocation in_b(b, 4096);
  ASSERT_NE(in_a.address, CUdeviceptr{0});
  ASSERT_NE(in_b.address, CUdeviceptr{0});
  EXPECT_EQ(cubridge::context_of(in_a.pointer()), a.ref());
  EXPECT_EQ(cubridge::context_of(in_b.pointer()), b.ref());
  // An address inside the allocation belongs to it too.
  EXPECT_EQ(cubridge::context_of(static_cast<const char*>(in_a.pointer()) + 1000), a.ref());
  EXPECT_EQ(cubridge::context_of(static_cast<const char*>(in_b.pointer()) + 4095), b.ref());
}

TEST(ContextOf, AnswersWhateverContextIsCurrent) {
  CUBRIDGE_REQUIRE_GPU();
  auto a = make_context();
  auto b = make_context();
  auto in_a = cubridge::driver_buffer<int>::allocate(a, 100);
  {
    cubridge::scoped_current guard(b);
    EXPECT_EQ(cubridge::context_of(in_a.data()), a.ref());
  }
  {
    cubridge::scoped_current guard(a);
    EXPECT_EQ(cubridge::context_of(in_a.data()), a.ref());
  }
  EXPECT_EQ(cubridge::context_of(in_a.data()), a.ref()) << "with no context current";
}

TEST(ContextOf, CudaMallocInADriverContextBelongsToIt) {
  CUBRIDGE_REQUIRE_GPU();
  auto a = make_context();
  auto b = make_context();
  void* p = nullptr;
  {
    cubridge::scoped_current guard(b);
    ASSERT_EQ(cudaMalloc(&p, 1 << 20), cudaSuccess);
  }
  EXPECT_EQ(cubridge::context_of(p), b.ref());
  EXPECT_NE(cubridge::context_of(p), a.ref());
  EXPECT_EQ(cubridge::memory_kind_of(p), cubridge::memory_kind::device);
  {
    cubridge::scoped_current guard(b);
    EXPECT_EQ(cudaFree(p), cudaSuccess);
  }
}

TEST(ContextOf, BuffersOfEitherApi) {
  CUBRIDGE_REQUIRE_GPU();
  auto a = make_context();
  auto b = make_context();
  auto d = cubridge::driver_buffer<float>::allocate(a, 10);
  auto r = cubridge::runtime_buffer<float>::allocate(b, 10);
  EXPECT_EQ(cubridge::context_of(d.data()), a.ref());
  EXPECT_EQ(cubridge::context_of(r.data()), b.ref());
}

TEST(ContextOf, PlainHostPointerThrowsNamingTheAddress) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  cubridge::scoped_current guard(ctx);
  int on_stack = 42;
  const auto heap = std::make_unique<double>(1.0);
  for (const void* p :
       {static_cast<const void*>(&on_stack), static_cast<const void*>(heap.get())}) {
    try {
      const auto owner = cubridge::context_of(p);
      ADD_FAILURE() << "context_of(" << p << ") returned " << owner.describe();
    } catch (const cubridge::error& e) {
      EXPECT_EQ(e.source(), cubridge::error_source::driver);
      EXPECT_EQ(e.code(), CUDA_ERROR_INVALID_VALUE) << e.what();
      EXPECT_NE(std::string(e.what()).find(hex(p)), std::string::npos)
          << "message should name " << hex(p) << ": " << e.what();
    }
  }
  EXPECT_EQ(on_stack, 42);
}

TEST(MemoryKindOf, DeviceMemoryOfBothApis) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  auto d = cubridge::driver_buffer<int>::allocate(ctx, 1000);
  auto r = cubridge::runtime_buffer<int>::allocate(ctx, 1000);
  const raw_allocation raw(ctx, 256);
  EXPECT_EQ(cubridge::memory_kind_of(d.data()), cubridge::memory_kind::device);
  EXPECT_EQ(cubridge::memory_kind_of(d.data() + 999), cubridge::memory_kind::device);
  EXPECT_EQ(cubridge::memory_kind_of(r.data()), cubridge::memory_kind::device);
  EXPECT_EQ(cubridge::memory_kind_of(raw.pointer()), cubridge::memory_kind::device);
  cubridge::scoped_current guard(ctx);
  EXPECT_EQ(cubridge::memory_kind_of(d.data()), cubridge::memory_kind::device);
}

TEST(MemoryKindOf, PinnedHostMemoryIsHost) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  auto pinned = cubridge::pinned_buffer<char>::allocate(ctx, 10'000);
  EXPECT_EQ(cubridge::memory_kind_of(pinned.data()), cubridge::memory_kind::host);
  EXPECT_EQ(cubridge::memory_kind_of(pinned.data() + 9999), cubridge::memory_kind::host);
  cubridge::scoped_current guard(ctx);
  EXPECT_EQ(cubridge::memory_kind_of(pinned.data()), cubridge::memory_kind::host);
}

TEST(MemoryKindOf, PlainHostMemoryIsUnregisteredHost) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  int on_stack = 7;
  std::vector<double> on_heap(1000, 1.0);
  {
    cubridge::scoped_current guard(ctx);
    EXPECT_EQ(cubridge::memory_kind_of(&on_stack), cubridge::memory_kind::unregistered_host);
    EXPECT_EQ(cubridge::memory_kind_of(on_heap.data()), cubridge::memory_kind::unregistered_host);
  }
  // With no context current too ("never throws for a valid driver").
  EXPECT_EQ(cubridge::memory_kind_of(&on_stack), cubridge::memory_kind::unregistered_host);
  EXPECT_EQ(cubridge::memory_kind_of(on_heap.data()), cubridge::memory_kind::unregistered_host);
  EXPECT_EQ(cubridge::memory_kind_of(nullptr), cubridge::memory_kind::unregistered_host);
  EXPECT_EQ(on_stack, 7);
}

TEST(MemoryKindOf, ManagedMemoryIsManaged) {
  CUBRIDGE_REQUIRE_GPU();
  if (cubridge::device::get(0).attribute(CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY) == 0)
    GTEST_SKIP() << "device 0 does not support managed memory";
  auto ctx = make_context();
  cubridge::scoped_current guard(ctx);
  void* p = nullptr;
  ASSERT_EQ(cudaMallocManaged(&p, 4096), cudaSuccess);
  EXPECT_EQ(cubridge::memory_kind_of(p), cubridge::memory_kind::managed);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
}

TEST(ContextOf, VmmMemoryBelongsToNoContext) {
  CUBRIDGE_REQUIRE_GPU();
  const auto dev = cubridge::device::get(0);
  if (dev.attribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) == 0)
    GTEST_SKIP() << "device 0 has no VMM support";
  auto ctx = make_context();
  auto shared = cubridge::shared_device_memory::allocate(dev, 1 << 20);
  const auto* p = reinterpret_cast<const void*>(static_cast<std::uintptr_t>(shared.address()));
  cubridge::scoped_current guard(ctx);
  EXPECT_FALSE(cubridge::context_of(p)) << "pointer.hpp documents null for VMM memory";
  EXPECT_EQ(cubridge::memory_kind_of(p), cubridge::memory_kind::device);
}

}  // namespace
