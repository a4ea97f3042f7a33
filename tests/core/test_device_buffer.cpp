// driver_buffer / runtime_buffer: owning device memory of one context, freed by the API that
// allocated it.
#include <cubridge/core/context.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/core/pointer.hpp>
#include <cubridge/core/scoped_current.hpp>

#include "driver_helpers.hpp"
#include "gpu_test.hpp"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using cubridge::testing::as_address;
using cubridge::testing::cu;
using cubridge::testing::make_context;
using cubridge::testing::raw_current;

using cubridge::driver_buffer;
using cubridge::runtime_buffer;

// Moves, release and the moved-from state: test_owning_handles.cpp, for every owning type.
static_assert(driver_buffer<int>::api == cubridge::allocator_api::driver);
static_assert(runtime_buffer<int>::api == cubridge::allocator_api::runtime);
static_assert(std::is_convertible_v<const driver_buffer<int>&, cubridge::device_span<int>>);
static_assert(std::is_convertible_v<const runtime_buffer<int>&, cubridge::device_span<const int>>);

std::vector<std::uint32_t> random_u32(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<std::uint32_t> v(n);
  for (auto& x : v) x = static_cast<std::uint32_t>(gen());
  return v;
}

std::vector<float> random_floats(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1000.0f, 1000.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// --- where the memory lives ---------------------------------------------------------------------

TEST(DriverBuffer, AllocatesInTheGivenContext) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  auto buffer = driver_buffer<int>::allocate(ctx, 1000);
  ASSERT_NE(buffer.data(), nullptr);
  EXPECT_EQ(buffer.size(), 1000u);
  EXPECT_EQ(buffer.size_bytes(), 1000u * sizeof(int));
  EXPECT_EQ(buffer.context(), ctx.ref());
  EXPECT_EQ(cubridge::context_of(buffer.data()), ctx.ref());
  EXPECT_EQ(cubridge::memory_kind_of(buffer.data()), cubridge::memory_kind::device);
  EXPECT_EQ(buffer.address(), as_address(buffer.data()));
}

TEST(RuntimeBuffer, AllocatesInTheGivenContext) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  auto buffer = runtime_buffer<double>::allocate(ctx, 777);
  ASSERT_NE(buffer.data(), nullptr);
  EXPECT_EQ(buffer.size(), 777u);
  EXPECT_EQ(buffer.size_bytes(), 777u * sizeof(double));
  EXPECT_EQ(buffer.context(), ctx.ref());
  EXPECT_EQ(cubridge::context_of(buffer.data()), ctx.ref())
      << "cudaMalloc with a driver context pushed must allocate in that context";
  EXPECT_EQ(cubridge::memory_kind_of(buffer.data()), cubridge::memory_kind::device);
}

TEST(DeviceBuffer, BuffersOfTwoContextsBelongToTheirOwn) {
  CUBRIDGE_REQUIRE_GPU();
  auto a = make_context();
  auto b = make_context();
  auto in_a = driver_buffer<int>::allocate(a, 64);
  auto in_b = runtime_buffer<int>::allocate(b, 64);
  EXPECT_EQ(cubridge::context_of(in_a.data()), a.ref());
  EXPECT_EQ(cubridge::context_of(in_b.data()), b.ref());
  EXPECT_NE(cubridge::context_of(in_a.data()), cubridge::context_of(in_b.data()));
}

TEST(DeviceBuffer, SpanViewsTheWholeBuffer) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  auto buffer = driver_buffer<std::uint16_t>::allocate(ctx, 300);
  const cubridge::device_span<std::uint16_t> s = buffer;
  const cubridge::device_span<const std::uint16_t> c = buffer;
  EXPECT_EQ(s.data(), buffer.data());
  EXPECT_EQ(s.size(), 300u);
  EXPECT_EQ(c.data(), buffer.data());
  EXPECT_EQ(c.size(), 300u);
  EXPECT_EQ(buffer.span().address(), buffer.address());
  EXPECT_EQ(buffer.span().size_bytes(), buffer.size_bytes());
}

// --- contents ----------------------------------------------------------------------------------

TEST(DriverBuffer, ValuesRoundTripThroughCuMemcpy) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  constexpr std::size_t n = 1 << 20;
  const auto input = random_u32(n, 1234);
  auto buffer = driver_buffer<std::uint32_t>::allocate(ctx, n);
  std::vector<std::uint32_t> output(n, 0);
  {
    cubridge::scoped_current guard(ctx);
    CUBRIDGE_ASSERT_CU(
        cu().cuMemcpy(buffer.address(), as_address(input.data()), buffer.size_bytes()));
    CUBRIDGE_ASSERT_CU(
        cu().cuMemcpy(as_address(output.data()), buffer.address(), buffer.size_bytes()));
  }
  EXPECT_EQ(output, input);
}

TEST(RuntimeBuffer, ValuesRoundTripThroughCudaMemcpy) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  constexpr std::size_t n = 100'003;
  const auto input = random_floats(n, 99);
  auto buffer = runtime_buffer<float>::allocate(ctx, n);
  std::vector<float> output(n, 0.0f);
  {
    cubridge::scoped_current guard(ctx);
    ASSERT_EQ(cudaMemcpy(buffer.data(), input.data(), buffer.size_bytes(), cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(output.data(), buffer.data(), buffer.size_bytes(), cudaMemcpyDeviceToHost),
              cudaSuccess);
  }
  EXPECT_EQ(output, input);
}

TEST(DeviceBuffer, EachApiReadsTheOthersMemory) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  constexpr std::size_t n = 4096;
  const auto input = random_u32(n, 7);
  auto driver_memory = driver_buffer<std::uint32_t>::allocate(ctx, n);
  auto runtime_memory = runtime_buffer<std::uint32_t>::allocate(ctx, n);
  std::vector<std::uint32_t> output(n, 0);
  {
    cubridge::scoped_current guard(ctx);
    // runtime writes the driver's memory, driver copies it into the runtime's, runtime reads.
    ASSERT_EQ(cudaMemcpy(driver_memory.data(), input.data(), driver_memory.size_bytes(),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    CUBRIDGE_ASSERT_CU(cu().cuMemcpy(runtime_memory.address(), driver_memory.address(),
                                     driver_memory.size_bytes()));
    ASSERT_EQ(cudaMemcpy(output.data(), runtime_memory.data(), runtime_memory.size_bytes(),
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
  }
  EXPECT_EQ(output, input);
}

// --- edge cases and failures -------------------------------------------------------------------

TEST(DeviceBuffer, ZeroSizeGivesNullptr) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  {
    auto d = driver_buffer<int>::allocate(ctx, 0);
    EXPECT_EQ(d.data(), nullptr);
    EXPECT_EQ(d.size(), 0u);
    EXPECT_EQ(d.size_bytes(), 0u);
    EXPECT_EQ(d.address(), CUdeviceptr{0});
    auto r = runtime_buffer<double>::allocate(ctx, 0);
    EXPECT_EQ(r.data(), nullptr);
    EXPECT_EQ(r.size(), 0u);
    auto moved = std::move(d);
    EXPECT_EQ(moved.data(), nullptr);
  }  // destroying empty buffers frees nothing and must not fail
  EXPECT_EQ(raw_current(), nullptr);
}

constexpr std::size_t absurd_bytes = std::size_t{1} << 50;  // 1 PiB: more than any GPU has
constexpr const char* absurd_bytes_text = "1125899906842624";
static_assert(absurd_bytes == 1125899906842624ull);

TEST(DriverBuffer, AbsurdSizeThrowsOutOfMemoryNamingTheBytes) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  try {
    // Elements of 4 bytes: the message must name bytes, not elements.
    auto buffer = driver_buffer<float>::allocate(ctx, absurd_bytes / sizeof(float));
    ADD_FAILURE() << "allocating 1 PiB succeeded at " << buffer.data();
  } catch (const cubridge::error& e) {
    EXPECT_EQ(e.source(), cubridge::error_source::driver);
    EXPECT_EQ(e.code(), CUDA_ERROR_OUT_OF_MEMORY) << e.what();
    EXPECT_EQ(e.code_name(), "CUDA_ERROR_OUT_OF_MEMORY");
    EXPECT_NE(std::string(e.what()).find(absurd_bytes_text), std::string::npos) << e.what();
    EXPECT_NE(e.call().find("cuMemAlloc"), std::string::npos) << e.call();
  }
  EXPECT_EQ(raw_current(), nullptr) << "a failed allocation must restore the context stack";
  // The context is still usable.
  auto fine = driver_buffer<float>::allocate(ctx, 16);
  EXPECT_NE(fine.data(), nullptr);
}

TEST(RuntimeBuffer, AbsurdSizeThrowsMemoryAllocationNamingTheBytes) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  try {
    auto buffer = runtime_buffer<std::byte>::allocate(ctx, absurd_bytes);
    ADD_FAILURE() << "allocating 1 PiB succeeded at " << buffer.data();
  } catch (const cubridge::error& e) {
    EXPECT_EQ(e.source(), cubridge::error_source::runtime);
    EXPECT_EQ(e.code(), static_cast<int>(cudaErrorMemoryAllocation)) << e.what();
    EXPECT_NE(std::string(e.what()).find(absurd_bytes_text), std::string::npos) << e.what();
    EXPECT_NE(e.call().find("cudaMalloc"), std::string::npos) << e.call();
  }
  EXPECT_EQ(raw_current(), nullptr) << "a failed allocation must restore the context stack";
  auto fine = runtime_buffer<std::byte>::allocate(ctx, 16);
  EXPECT_NE(fine.data(), nullptr);
}

TEST(DeviceBuffer, AllocateLeavesAnEmptyStackEmpty) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  const CUcontext before = raw_current();
  ASSERT_EQ(before, nullptr);
  {
    auto d = driver_buffer<int>::allocate(ctx, 256);
    EXPECT_EQ(raw_current(), before);
    auto r = runtime_buffer<int>::allocate(ctx, 256);
    EXPECT_EQ(raw_current(), before);
  }
  EXPECT_EQ(raw_current(), before) << "freeing must leave the stack alone too";
}

TEST(DeviceBuffer, AllocateLeavesAnotherCurrentContextCurrent) {
  CUBRIDGE_REQUIRE_GPU();
  auto target = make_context();
  auto other = make_context();
  cubridge::scoped_current guard(other);
  const CUcontext before = raw_current();
  ASSERT_EQ(before, other.get());
  {
    auto d = driver_buffer<int>::allocate(target, 256);
    EXPECT_EQ(raw_current(), before);
    EXPECT_EQ(cubridge::context_of(d.data()), target.ref()) << "allocated in the current context";
    auto r = runtime_buffer<int>::allocate(target, 256);
    EXPECT_EQ(raw_current(), before);
    EXPECT_EQ(cubridge::context_of(r.data()), target.ref()) << "allocated in the current context";
  }
  EXPECT_EQ(raw_current(), before);
}

TEST(RuntimeBuffer, LeavesThePrimaryContextInactive) {
  CUBRIDGE_REQUIRE_GPU();
  const auto dev = cubridge::device::get(0);
  if (dev.primary_state().active)
    GTEST_SKIP() << "the primary context was already active in this process";
  auto ctx = make_context();
  {
    auto r = runtime_buffer<float>::allocate(ctx, 1024);
    EXPECT_FALSE(dev.primary_state().active)
        << "cudaMalloc in a driver context activated the primary";
  }
  EXPECT_FALSE(dev.primary_state().active) << "cudaFree activated the primary context";
}

}  // namespace
