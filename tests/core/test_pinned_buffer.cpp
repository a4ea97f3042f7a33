// pinned_buffer: page-locked host memory (cuMemAllocHost) that keeps its context alive.
#include <cubridge/core/context.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/pinned_buffer.hpp>
#include <cubridge/core/pointer.hpp>
#include <cubridge/core/scoped_current.hpp>

#include "driver_helpers.hpp"
#include "gpu_test.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using cubridge::testing::as_address;
using cubridge::testing::cu;
using cubridge::testing::make_context;
using cubridge::testing::raw_current;

using cubridge::pinned_buffer;

// Moves, release and the moved-from state: test_owning_handles.cpp, for every owning type.

/// The kind of memory behind `p`, asked with `ctx` pushed.
cubridge::memory_kind kind_in(cubridge::context_ref ctx, const void* p) {
  cubridge::scoped_current guard(ctx);
  return cubridge::memory_kind_of(p);
}

std::vector<std::uint64_t> random_u64(std::size_t n, unsigned seed) {
  std::mt19937_64 gen(seed);
  std::vector<std::uint64_t> v(n);
  for (auto& x : v) x = gen();
  return v;
}

TEST(PinnedBuffer, AllocatesPageLockedHostMemory) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  auto buffer = pinned_buffer<std::uint64_t>::allocate(ctx, 5000);
  ASSERT_NE(buffer.data(), nullptr);
  EXPECT_EQ(buffer.size(), 5000u);
  EXPECT_EQ(buffer.size_bytes(), 5000u * sizeof(std::uint64_t));
  EXPECT_EQ(buffer.span().data(), buffer.data());
  EXPECT_EQ(buffer.span().size(), buffer.size());
  EXPECT_EQ(kind_in(ctx, buffer.data()), cubridge::memory_kind::host);
  EXPECT_EQ(kind_in(ctx, buffer.data() + 4999), cubridge::memory_kind::host)
      << "the whole range is pinned";
  EXPECT_EQ(raw_current(), nullptr) << "allocate must leave the context stack alone";
}

TEST(PinnedBuffer, HostWritesAndReadsBack) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  constexpr std::size_t n = 1 << 16;
  const auto input = random_u64(n, 31);
  auto buffer = pinned_buffer<std::uint64_t>::allocate(ctx, n);
  for (std::size_t i = 0; i < n; ++i) buffer[i] = input[i];
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(buffer.data()[i], input[i]) << "at " << i;
  std::size_t index = 0;
  for (const auto value : buffer.span()) ASSERT_EQ(value, input[index++]);
}

TEST(PinnedBuffer, RoundTripsThroughDeviceMemory) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  constexpr std::size_t n = 1 << 18;
  const auto input = random_u64(n, 32);
  auto source = pinned_buffer<std::uint64_t>::allocate(ctx, n);
  auto destination = pinned_buffer<std::uint64_t>::allocate(ctx, n);
  auto device = cubridge::driver_buffer<std::uint64_t>::allocate(ctx, n);
  for (std::size_t i = 0; i < n; ++i) {
    source[i] = input[i];
    destination[i] = ~input[i];
  }
  {
    cubridge::scoped_current guard(ctx);
    CUBRIDGE_ASSERT_CU(
        cu().cuMemcpy(device.address(), as_address(source.data()), source.size_bytes()));
    CUBRIDGE_ASSERT_CU(
        cu().cuMemcpy(as_address(destination.data()), device.address(), device.size_bytes()));
  }
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(destination[i], input[i]) << "at " << i;
}

TEST(PinnedBuffer, ZeroSizeGivesNullptr) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  auto buffer = pinned_buffer<int>::allocate(ctx, 0);
  EXPECT_EQ(buffer.data(), nullptr);
  EXPECT_EQ(buffer.size(), 0u);
  EXPECT_TRUE(buffer.span().empty());
}

}  // namespace
