#include <cubridge/core/context.hpp>
#include <cubridge/core/scoped_current.hpp>

#include "driver_helpers.hpp"
#include "gpu_test.hpp"

#include <type_traits>

namespace {

using cubridge::testing::raw_current;

static_assert(!std::is_copy_constructible_v<cubridge::scoped_current>);
static_assert(!std::is_move_constructible_v<cubridge::scoped_current>);

TEST(ScopedCurrent, RestoresAnEmptyStack) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = cubridge::context::create(cubridge::device::get(0));
  ASSERT_EQ(raw_current(), nullptr);
  {
    cubridge::scoped_current guard(ctx);
    EXPECT_EQ(raw_current(), ctx.get());
  }
  EXPECT_EQ(raw_current(), nullptr);
  // And the stack is really empty: popping now fails.
  CUcontext popped = nullptr;
  EXPECT_NE(cubridge::driver::api().cuCtxPopCurrent(&popped), CUDA_SUCCESS);
}

TEST(ScopedCurrent, NestsAndRestoresTheCallersStackExactly) {
  CUBRIDGE_REQUIRE_GPU();
  auto a = cubridge::context::create(cubridge::device::get(0));
  auto b = cubridge::context::create(cubridge::device::get(0));
  auto c = cubridge::context::create(cubridge::device::get(0));
  // The caller's own stack: [a, b] with b on top.
  CUBRIDGE_ASSERT_CU(cubridge::driver::api().cuCtxPushCurrent(a.get()));
  CUBRIDGE_ASSERT_CU(cubridge::driver::api().cuCtxPushCurrent(b.get()));
  {
    cubridge::scoped_current outer(c);
    EXPECT_EQ(raw_current(), c.get());
    {
      cubridge::scoped_current inner(a);
      EXPECT_EQ(raw_current(), a.get());
    }
    EXPECT_EQ(raw_current(), c.get());
  }
  CUcontext popped = nullptr;
  CUBRIDGE_ASSERT_CU(cubridge::driver::api().cuCtxPopCurrent(&popped));
  EXPECT_EQ(popped, b.get());
  CUBRIDGE_ASSERT_CU(cubridge::driver::api().cuCtxPopCurrent(&popped));
  EXPECT_EQ(popped, a.get());
  EXPECT_EQ(raw_current(), nullptr);
}

TEST(ScopedCurrent, RestoresOnException) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = cubridge::context::create(cubridge::device::get(0));
  try {
    cubridge::scoped_current guard(ctx);
    throw std::runtime_error("boom");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(raw_current(), nullptr);
}

}  // namespace
