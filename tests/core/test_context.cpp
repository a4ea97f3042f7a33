#include <cubridge/core/context.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/primary_context.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/core/stream.hpp>

#include "gpu_test.hpp"

#include <type_traits>

namespace {

static_assert(!std::is_copy_constructible_v<cubridge::context>);
static_assert(std::is_nothrow_move_constructible_v<cubridge::context>);
static_assert(!std::is_constructible_v<cubridge::context_ref, std::nullptr_t>);
static_assert(!std::is_constructible_v<cubridge::context_ref, int>);

TEST(Context, CreateLeavesTheCallersStackAlone) {
  CUBRIDGE_REQUIRE_GPU();
  ASSERT_FALSE(cubridge::context_ref::current());
  auto ctx = cubridge::context::create(cubridge::device::get(0));
  EXPECT_NE(ctx.get(), nullptr);
  EXPECT_FALSE(cubridge::context_ref::current()) << "create must not leave the context current";
  EXPECT_EQ(ctx.device(), cubridge::device::get(0));
  EXPECT_FALSE(cubridge::context_ref::current()) << "device() must restore the stack";
}

TEST(Context, IdsAreUniqueAndStable) {
  CUBRIDGE_REQUIRE_GPU();
  auto a = cubridge::context::create(cubridge::device::get(0));
  auto b = cubridge::context::create(cubridge::device::get(0));
  EXPECT_NE(a.id(), b.id());
  EXPECT_EQ(a.id(), a.ref().id());
  EXPECT_NE(a.ref().describe().find("id " + std::to_string(a.id())), std::string::npos);
}

TEST(Context, DestroyedWhenTheLastOwnerGoes) {
  CUBRIDGE_REQUIRE_GPU();
  CUcontext raw = nullptr;
  {
    auto ctx = cubridge::context::create(cubridge::device::get(0));
    raw = ctx.get();
  }
  unsigned long long id = 0;
  EXPECT_NE(cubridge::driver::api().cuCtxGetId(raw, &id), CUDA_SUCCESS)
      << "the context must be destroyed with its last owner";
}

TEST(Context, ObjectsMadeInItKeepItAlive) {
  CUBRIDGE_REQUIRE_GPU();
  std::optional<cubridge::driver_buffer<int>> buffer;
  CUcontext raw = nullptr;
  {
    auto ctx = cubridge::context::create(cubridge::device::get(0));
    raw = ctx.get();
    buffer.emplace(cubridge::driver_buffer<int>::allocate(ctx, 16));
  }
  unsigned long long id = 0;
  EXPECT_EQ(cubridge::driver::api().cuCtxGetId(raw, &id), CUDA_SUCCESS)
      << "a buffer must keep its context alive";
  buffer.reset();
  EXPECT_NE(cubridge::driver::api().cuCtxGetId(raw, &id), CUDA_SUCCESS);
}

TEST(Context, SynchronizeAndCurrent) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = cubridge::context::create(cubridge::device::get(0));
  EXPECT_NO_THROW(ctx.ref().synchronize());
  cubridge::scoped_current guard(ctx);
  EXPECT_EQ(cubridge::context_ref::current(), ctx.ref());
}

// The owners wait for their context's work themselves (not only through ref()), each with the
// context pushed for the call and the caller's stack left as it was.
TEST(Context, SynchronizeWaitsForTheContextsWorkAndLeavesTheStackAsFound) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = cubridge::context::create(cubridge::device::get(0));
  auto other = cubridge::context::create(cubridge::device::get(0));
  constexpr std::size_t bytes = std::size_t{256} << 20;
  auto buffer = cubridge::driver_buffer<unsigned char>::allocate(ctx, bytes);
  auto s = cubridge::stream::create(ctx);
  {
    cubridge::scoped_current guard(ctx);
    CUBRIDGE_ASSERT_CU(
        cubridge::driver::api().cuMemsetD8Async(buffer.address(), 7, bytes, s.get()));
  }
  ASSERT_FALSE(cubridge::context_ref::current());
  ctx.synchronize();
  EXPECT_FALSE(cubridge::context_ref::current()) << "synchronize must restore the empty stack";
  EXPECT_TRUE(s.ready()) << "the context's stream still has work after synchronize()";

  cubridge::scoped_current in_other(other);
  ctx.synchronize();
  other.synchronize();
  auto primary = cubridge::primary_context::retain(cubridge::device::get(0));
  primary.synchronize();
  EXPECT_EQ(cubridge::context_ref::current(), other.ref()) << "the caller's context is current";
}

TEST(Context, PrimaryContextStaysInactive) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = cubridge::context::create(cubridge::device::get(0));
  cubridge::scoped_current guard(ctx);
  auto buffer = cubridge::driver_buffer<float>::allocate(ctx, 1024);
  EXPECT_FALSE(cubridge::device::get(0).primary_state().active);
}

}  // namespace
