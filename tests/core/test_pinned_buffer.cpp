// pinned_buffer: page-locked host memory (cuMemAllocHost) that keeps its context alive.
#include <cubridge/core/context.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/pinned_buffer.hpp>
#include <cubridge/core/pointer.hpp>
#include <cubridge/core/scoped_current.hpp>

#include "gpu_test.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using cubridge::pinned_buffer;

static_assert(!std::is_copy_constructible_v<pinned_buffer<int>>);
static_assert(!std::is_copy_assignable_v<pinned_buffer<int>>);
static_assert(std::is_nothrow_move_constructible_v<pinned_buffer<int>>);
static_assert(std::is_nothrow_move_assignable_v<pinned_buffer<int>>);

const cubridge::driver::entry_points& cu() {
  return cubridge::driver::api();
}

CUdeviceptr as_address(const void* p) {
  return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p));
}

CUcontext raw_current() {
  CUcontext c = nullptr;
  EXPECT_EQ(cu().cuCtxGetCurrent(&c), CUDA_SUCCESS);
  return c;
}

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

cubridge::context make_context() {
  return cubridge::context::create(cubridge::device::get(0));
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

TEST(PinnedBuffer, MoveConstructionTransfersOwnership) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  constexpr std::size_t n = 4096;
  const auto input = random_u64(n, 33);
  std::unique_ptr<pinned_buffer<std::uint64_t>> moved;
  std::uint64_t* pointer = nullptr;
  {
    auto original = pinned_buffer<std::uint64_t>::allocate(ctx, n);
    pointer = original.data();
    for (std::size_t i = 0; i < n; ++i) original[i] = input[i];
    moved = std::make_unique<pinned_buffer<std::uint64_t>>(std::move(original));
    EXPECT_EQ(original.data(), nullptr);  // NOLINT(bugprone-use-after-move): the point of the test
    EXPECT_EQ(original.size(), 0u);       // NOLINT(bugprone-use-after-move)
    EXPECT_EQ(moved->data(), pointer);
    EXPECT_EQ(moved->size(), n);
  }  // the moved-from buffer must not free the memory
  EXPECT_EQ(kind_in(ctx, pointer), cubridge::memory_kind::host) << "a moved-from buffer freed it";
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ((*moved)[i], input[i]) << "at " << i;
  moved.reset();
  EXPECT_EQ(kind_in(ctx, pointer), cubridge::memory_kind::unregistered_host)
      << "the buffer did not free its memory";
}

TEST(PinnedBuffer, MoveAssignmentFreesTheOldMemory) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  auto target = pinned_buffer<float>::allocate(ctx, 100);
  auto source = pinned_buffer<float>::allocate(ctx, 200);
  float* old_target = target.data();
  float* old_source = source.data();
  source[199] = 1.5f;
  target = std::move(source);
  EXPECT_EQ(target.data(), old_source);
  EXPECT_EQ(target.size(), 200u);
  EXPECT_EQ(target[199], 1.5f);
  EXPECT_EQ(source.data(), nullptr);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(source.size(), 0u);       // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(kind_in(ctx, old_target), cubridge::memory_kind::unregistered_host)
      << "move assignment leaked the old memory";
  EXPECT_EQ(kind_in(ctx, old_source), cubridge::memory_kind::host);
}

TEST(PinnedBuffer, KeepsItsContextAlive) {
  CUBRIDGE_REQUIRE_GPU();
  auto witness = make_context();
  std::unique_ptr<pinned_buffer<int>> buffer;
  CUcontext raw = nullptr;
  {
    auto ctx = make_context();
    raw = ctx.get();
    buffer = std::make_unique<pinned_buffer<int>>(pinned_buffer<int>::allocate(ctx, 1000));
  }
  unsigned long long id = 0;
  EXPECT_EQ(cu().cuCtxGetId(raw, &id), CUDA_SUCCESS) << "the buffer must keep its context alive";
  EXPECT_EQ(kind_in(witness, buffer->data()), cubridge::memory_kind::host);
  for (int i = 0; i < 1000; ++i) (*buffer)[static_cast<std::size_t>(i)] = i * 3;
  EXPECT_EQ((*buffer)[999], 2997);
  const int* pointer = buffer->data();
  buffer.reset();
  EXPECT_EQ(kind_in(witness, pointer), cubridge::memory_kind::unregistered_host);
  EXPECT_EQ(raw_current(), nullptr);
}

}  // namespace
