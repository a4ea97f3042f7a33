#include <cubridge/core/context.hpp>
#include <cubridge/core/primary_context.hpp>
#include <cubridge/core/scoped_current.hpp>

#include "gpu_test.hpp"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

namespace {

TEST(PrimaryContext, RetainIsTheDriversPrimary) {
  CUBRIDGE_REQUIRE_GPU();
  const auto dev = cubridge::device::get(0);
  auto primary = cubridge::primary_context::retain(dev);
  CUcontext raw = nullptr;
  CUBRIDGE_ASSERT_CU(cubridge::driver::api().cuDevicePrimaryCtxRetain(&raw, dev.get()));
  EXPECT_EQ(primary.get(), raw);
  CUBRIDGE_ASSERT_CU(cubridge::driver::api().cuDevicePrimaryCtxRelease(dev.get()));
  EXPECT_TRUE(dev.primary_state().active);
  EXPECT_EQ(primary.device(), dev);
  EXPECT_EQ(primary.retained_id(), primary.ref().id());
  EXPECT_FALSE(primary.was_reset());
  EXPECT_NO_THROW(primary.check_not_reset());
}

TEST(PrimaryContext, ReleasedWithTheLastReference) {
  CUBRIDGE_REQUIRE_GPU();
  const auto dev = cubridge::device::get(0);
  {
    auto primary = cubridge::primary_context::retain(dev);
    auto moved = std::move(primary);
    EXPECT_EQ(primary.get(), nullptr);  // NOLINT(bugprone-use-after-move)
    EXPECT_TRUE(dev.primary_state().active);
  }
  EXPECT_FALSE(dev.primary_state().active) << "our one reference was the only one";
}

TEST(PrimaryContext, AdoptsTheRuntimesContext) {
  CUBRIDGE_REQUIRE_GPU();
  // A "library" initialised the runtime before us.
  ASSERT_EQ(cudaFree(nullptr), cudaSuccess);
  CUcontext runtime_context = nullptr;
  CUBRIDGE_ASSERT_CU(cubridge::driver::api().cuCtxGetCurrent(&runtime_context));
  auto adopted = cubridge::primary_context::adopt_runtime();
  EXPECT_EQ(adopted.get(), runtime_context);
  EXPECT_EQ(cubridge::context_ref::current(), adopted.ref());
}

TEST(PrimaryContext, AdoptRefusesWhenADriverContextIsCurrent) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = cubridge::context::create(cubridge::device::get(0));
  cubridge::scoped_current guard(ctx);
  try {
    (void)cubridge::primary_context::adopt_runtime();
    FAIL() << "no throw";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::precondition));
    EXPECT_NE(std::string(e.what()).find("is not the primary context"), std::string::npos)
        << e.what();
  }
}

// cudaDeviceReset wrecks the process's runtime state, so it runs in a child process.
TEST(PrimaryContext, ResetBehindOurBackIsDetected) {
  CUBRIDGE_REQUIRE_GPU();
  CUBRIDGE_EXPECT_CLEAN_EXIT(
      {
        auto primary = cubridge::primary_context::adopt_runtime();
        if (primary.was_reset()) std::exit(2);
        (void)cudaDeviceReset();  // what a misbehaving library does
        if (!primary.was_reset()) std::exit(3);
        try {
          primary.check_not_reset();
          std::exit(4);
        } catch (const cubridge::context_reset_error& e) {
          std::fprintf(stderr, "%s\n", e.what());
        }
        std::exit(0);
      },
      "primary context .* of device 0 retained with id [0-9]+ was");
}

}  // namespace
