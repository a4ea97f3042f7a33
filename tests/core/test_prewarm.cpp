#include <cubridge/core/context.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/library.hpp>
#include <cubridge/core/module.hpp>
#include <cubridge/core/pointer.hpp>
#include <cubridge/core/prewarm.hpp>
#include <cubridge/core/scoped_current.hpp>

#include "gpu_test.hpp"

#include <cuda_runtime_api.h>

#include <vector>

namespace {

CUfunctionLoadingState loading_state(CUfunction f) {
  CUfunctionLoadingState state{};
  EXPECT_EQ(cubridge::driver::api().cuFuncIsLoaded(&state, f), CUDA_SUCCESS);
  return state;
}

TEST(Prewarm, AStepWithoutAnActionIsRefused) {
  cubridge::prewarm_plan plan;
  EXPECT_THROW(plan.step("nothing", {}), cubridge::error);
}

TEST(Prewarm, LoadsModuleKernelsAndReportsEachStep) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = cubridge::context::create(cubridge::device::get(0));
  auto m = cubridge::module::load_file(ctx, cubridge::testing::test_cubin_path());
  auto fill = m.get_kernel("fill_u32");
  auto add = m.get_kernel("add_f32");
  cubridge::prewarm_plan plan;
  plan.kernel(fill).kernel(add);
  const auto report = plan.run(ctx);
  ASSERT_EQ(report.steps.size(), 2u);
  EXPECT_EQ(report.steps[0].what, "kernel 'fill_u32' loaded");
  EXPECT_GE(report.total_milliseconds(), 0.0);
  EXPECT_EQ(loading_state(fill.launch_handle()), CU_FUNCTION_LOADING_STATE_LOADED);
  EXPECT_EQ(loading_state(add.launch_handle()), CU_FUNCTION_LOADING_STATE_LOADED);
  EXPECT_FALSE(cubridge::context_ref::current()) << "run() must restore the caller's stack";
  // A second run finds nothing left to do.
  for (const auto& step : plan.run(ctx).steps) EXPECT_TRUE(step.already_done) << step.what;
}

TEST(Prewarm, AWarmUpLaunchRunsInTheContextAndIsCheckedWhenPlanned) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = cubridge::context::create(cubridge::device::get(0));
  auto m = cubridge::module::load_file(ctx, cubridge::testing::test_cubin_path());
  auto fill = m.get_kernel("fill_u32");
  auto scratch = cubridge::driver_buffer<unsigned>::allocate(ctx, 256);
  cubridge::prewarm_plan plan;
  EXPECT_THROW(plan.launch(fill, {.block = {256}, .stream = cubridge::stream_ref::legacy_default()},
                           scratch.span()),
               cubridge::launch_argument_error);
  plan.launch(fill, {.block = {256}, .stream = cubridge::stream_ref::legacy_default()},
              scratch.span(), 7u, std::size_t{256});
  const auto report = plan.run(ctx);
  ASSERT_EQ(report.steps.size(), 1u) << "the refused launch added no step";
  EXPECT_EQ(report.steps[0].what, "warm-up launch of 'fill_u32'");
  EXPECT_FALSE(cubridge::context_ref::current());
  cubridge::scoped_current current(ctx);
  std::vector<unsigned> back(256);
  ASSERT_EQ(cubridge::driver::api().cuMemcpy(reinterpret_cast<CUdeviceptr>(back.data()),
                                             scratch.address(), 256 * sizeof(unsigned)),
            CUDA_SUCCESS);
  EXPECT_EQ(back.front(), 7u);
  EXPECT_EQ(back.back(), 7u) << "the warm-up launch ran and was synchronized";
}

TEST(Prewarm, LoadsALibraryKernelIntoTheGivenContext) {
  CUBRIDGE_REQUIRE_GPU();
  auto a = cubridge::context::create(cubridge::device::get(0));
  auto b = cubridge::context::create(cubridge::device::get(0));
  auto lib = cubridge::library::load_file(cubridge::testing::test_cubin_path());
  const auto fill = [&] {
    cubridge::scoped_current guard(a);
    return lib.get_kernel("fill_u32");
  }();
  cubridge::prewarm_plan plan;
  plan.kernel(fill);
  (void)plan.run(b);
  cubridge::scoped_current guard(b);
  CUfunction in_b = nullptr;
  CUBRIDGE_ASSERT_CU(cubridge::driver::api().cuKernelGetFunction(
      &in_b, reinterpret_cast<CUkernel>(fill.launch_handle())));
  EXPECT_EQ(loading_state(in_b), CU_FUNCTION_LOADING_STATE_LOADED);
}

TEST(Prewarm, RuntimeAndCustomStepsRunInTheContext) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = cubridge::context::create(cubridge::device::get(0));
  cubridge::context_ref seen = cubridge::context_ref::from_native(nullptr);
  cubridge::prewarm_plan plan;
  plan.runtime().step("custom", [&] { seen = cubridge::context_ref::current(); });
  const auto report = plan.run(ctx);
  ASSERT_EQ(report.steps.size(), 2u);
  EXPECT_EQ(seen, ctx.ref());
  // The runtime adopted the driver context, not the primary one.
  EXPECT_FALSE(cubridge::device::get(0).primary_state().active);
  cubridge::scoped_current guard(ctx);
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 256), cudaSuccess);
  EXPECT_EQ(cubridge::context_of(p), ctx.ref());
  ASSERT_EQ(cudaFree(p), cudaSuccess);
}

TEST(Prewarm, AFailingStepPropagatesAndRestoresTheStack) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = cubridge::context::create(cubridge::device::get(0));
  cubridge::prewarm_plan plan;
  plan.step("throws", [] { throw std::runtime_error("library handle creation failed"); });
  EXPECT_THROW((void)plan.run(ctx), std::runtime_error);
  EXPECT_FALSE(cubridge::context_ref::current());
}

}  // namespace
