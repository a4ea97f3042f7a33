#include <cubridge/core/context.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/library.hpp>
#include <cubridge/core/module.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/core/stream.hpp>

#include "gpu_test.hpp"

#include <climits>
#include <functional>
#include <random>
#include <vector>

namespace {

struct triple {
  double a, b, c;
};

class Kernel : public ::testing::Test {
 protected:
  void SetUp() override {
    CUBRIDGE_REQUIRE_GPU();
    ctx_.emplace(cubridge::context::create(cubridge::device::get(0)));
    module_.emplace(cubridge::module::load_file(*ctx_, cubridge::testing::test_cubin_path()));
  }
  std::optional<cubridge::context> ctx_;
  std::optional<cubridge::module> module_;
};

// The argument array every launch and graph node is built from (no GPU needed): one pointer
// per argument, in order, to the converted value (a span passes as its element pointer), then
// nullptr.
TEST(KernelArguments, LaidOutInOrderAsConvertedValuesThenNull) {
  const auto span = cubridge::device_span<float>::from_native(CUdeviceptr{0x1000}, 4);
  const triple t{1.5, 2.5, 3.5};
  const int n = 7;
  const int result = cubridge::detail::with_kernel_arguments(
      [&](void** arguments) {
        EXPECT_EQ(*static_cast<float**>(arguments[0]), reinterpret_cast<float*>(0x1000));
        EXPECT_EQ(*static_cast<const int*>(arguments[1]), 7);
        EXPECT_NE(arguments[1], static_cast<const void*>(&n)) << "a copy, alive for the call";
        EXPECT_EQ(static_cast<const triple*>(arguments[2])->c, 3.5);
        EXPECT_EQ(arguments[3], nullptr);
        return 42;
      },
      span, n, t);
  EXPECT_EQ(result, 42) << "the callback's result is returned";
  cubridge::detail::with_kernel_arguments(
      [](void** arguments) { EXPECT_EQ(arguments[0], nullptr); });
}

// A list assembled at run time: each value at its alignment, the table pointing at each, and
// the table still right after the buffer grew and moved.
TEST(KernelArguments, RunTimeListKeepsEachValueAlignedAndThePointersCurrent) {
  cubridge::kernel_arguments args;
  args.push(char{3});
  args.push(2.5);
  const triple t{1, 2, 3};
  args.push(t);
  ASSERT_EQ(args.count(), 3u);
  EXPECT_EQ(args.sizes()[0], 1u);
  EXPECT_EQ(args.sizes()[1], 8u);
  EXPECT_EQ(args.sizes()[2], sizeof(triple));
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(args.pointers()[1]) % alignof(double), 0u);
  EXPECT_EQ(*static_cast<const double*>(args.pointers()[1]), 2.5);
  for (int i = 0; i < 100; ++i) args.push(i);  // enough to move the buffer
  EXPECT_EQ(*static_cast<const char*>(args.pointers()[0]), 3);
  EXPECT_EQ(static_cast<const triple*>(args.pointers()[2])->c, 3);
  EXPECT_EQ(*static_cast<const int*>(args.pointers()[102]), 99);
  args.clear();
  EXPECT_EQ(args.count(), 0u);
  args.push(7u);
  EXPECT_EQ(*static_cast<const unsigned*>(args.pointers()[0]), 7u);
}

TEST_F(Kernel, ParameterListComesFromTheDriver) {
  auto k = module_->get_kernel("mixed_parameters");
  EXPECT_EQ(k.name(), "mixed_parameters");
  const auto p = k.parameters();
  ASSERT_EQ(p.size(), 5u);
  EXPECT_EQ(p[0].size, 8u);
  EXPECT_EQ(p[1].size, 4u);
  EXPECT_EQ(p[2].size, 1u);
  EXPECT_EQ(p[3].size, 8u);
  EXPECT_EQ(p[4].size, 24u);
  EXPECT_EQ(p[0].offset, 0u);
  EXPECT_EQ(p[3].offset, 16u);
  EXPECT_EQ(module_->get_kernel("empty_kernel").parameters().size(), 0u);
}

TEST_F(Kernel, TypedLaunchComputesWithEveryParameterKind) {
  auto k = module_->get_kernel("mixed_parameters");
  auto out = cubridge::driver_buffer<float>::allocate(*ctx_, 1);
  cubridge::scoped_current guard(*ctx_);
  k.launch({.stream = cubridge::stream_ref::legacy_default()}, out.span(), 3, char{2}, 1.5,
           triple{1, 2, 3});
  float value = 0;
  CUBRIDGE_ASSERT_CU(cubridge::driver::api().cuMemcpy(reinterpret_cast<CUdeviceptr>(&value),
                                                      out.address(), sizeof value));
  EXPECT_FLOAT_EQ(value, 3 + 2 + 1.5f + 6);
}

TEST_F(Kernel, WrongCountIsRefusedBeforeLaunch) {
  auto k = module_->get_kernel("fill_u32");
  try {
    k.launch({.stream = cubridge::stream_ref::legacy_default()}, static_cast<unsigned*>(nullptr),
             1u);
    FAIL() << "no throw";
  } catch (const cubridge::launch_argument_error& e) {
    EXPECT_NE(std::string(e.what()).find("kernel 'fill_u32' takes 3 parameters, 2 arguments given"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(Kernel, WrongSizeNamesIndexAndBothSizes) {
  auto k = module_->get_kernel("fill_u32");
  try {
    k.launch({.stream = cubridge::stream_ref::legacy_default()}, static_cast<unsigned*>(nullptr),
             1u, 5u);  // size_t expected, unsigned given
    FAIL() << "no throw";
  } catch (const cubridge::launch_argument_error& e) {
    EXPECT_NE(std::string(e.what()).find("kernel 'fill_u32' parameter 2 is 8 bytes, the argument "
                                         "given is 4 bytes"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW((void)(k.typed<unsigned*, unsigned, unsigned>()), cubridge::launch_argument_error);
}

TEST_F(Kernel, RunTimeArgumentListIsCheckedAndLaunched) {
  auto k = module_->get_kernel("mixed_parameters");
  auto out = cubridge::driver_buffer<float>::allocate(*ctx_, 1);
  cubridge::kernel_arguments args;
  args.push(out.data());
  args.push(3);
  args.push(char{2});
  args.push(1.5);
  try {
    k.launch({.stream = cubridge::stream_ref::legacy_default()}, args);
    FAIL() << "no throw";
  } catch (const cubridge::launch_argument_error& e) {
    EXPECT_NE(std::string(e.what()).find("takes 5 parameters, 4 arguments given"),
              std::string::npos)
        << e.what();
  }
  args.push(triple{1, 2, 3});
  cubridge::scoped_current guard(*ctx_);
  k.launch({.stream = cubridge::stream_ref::legacy_default()}, args);
  float value = 0;
  CUBRIDGE_ASSERT_CU(cubridge::driver::api().cuMemcpy(reinterpret_cast<CUdeviceptr>(&value),
                                                      out.address(), sizeof value));
  EXPECT_FLOAT_EQ(value, 3 + 2 + 1.5f + 6);
  cubridge::kernel_arguments wrong;
  wrong.push(out.data());
  wrong.push(3);
  wrong.push(char{2});
  wrong.push(1.5f);  // double expected
  wrong.push(triple{1, 2, 3});
  EXPECT_THROW(k.launch({.stream = cubridge::stream_ref::legacy_default()}, wrong),
               cubridge::launch_argument_error);
}

TEST_F(Kernel, TypedKernelLaunchesOnAStream) {
  auto fill = module_->get_kernel("fill_u32").typed<unsigned*, unsigned, std::size_t>();
  constexpr std::size_t n = 1 << 20;
  auto out = cubridge::driver_buffer<unsigned>::allocate(*ctx_, n);
  auto s = cubridge::stream::create(*ctx_);
  fill.launch({.grid = {n / 256}, .block = {256}, .stream = s}, out.data(), 77u, n);
  s.synchronize();
  std::vector<unsigned> host(n);
  cubridge::scoped_current guard(*ctx_);
  CUBRIDGE_ASSERT_CU(cubridge::driver::api().cuMemcpy(reinterpret_cast<CUdeviceptr>(host.data()),
                                                      out.address(), n * sizeof(unsigned)));
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(host[i], 77u) << i;
}

TEST_F(Kernel, TemplateKernelByMangledName) {
  // scale<float> as nvcc mangles it.
  auto k = module_->get_kernel("_Z5scaleIfEvPT_S0_m");
  constexpr std::size_t n = 1000;
  auto data = cubridge::driver_buffer<float>::allocate(*ctx_, n);
  std::vector<float> host(n);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-10, 10);
  for (auto& v : host) v = dist(rng);
  cubridge::scoped_current guard(*ctx_);
  CUBRIDGE_ASSERT_CU(cubridge::driver::api().cuMemcpy(
      data.address(), reinterpret_cast<CUdeviceptr>(host.data()), n * sizeof(float)));
  k.launch({.grid = {4}, .block = {256}, .stream = cubridge::stream_ref::legacy_default()},
           data.span(), 2.0f, n);
  std::vector<float> back(n);
  CUBRIDGE_ASSERT_CU(cubridge::driver::api().cuMemcpy(reinterpret_cast<CUdeviceptr>(back.data()),
                                                      data.address(), n * sizeof(float)));
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], host[i] * 2.0f) << i;
}

TEST_F(Kernel, ClusterLaunchGoesThroughLaunchKernelEx) {
  if (ctx_->device().capability().major < 9)
    GTEST_SKIP() << "clusters need compute capability 9.0+";
  auto k = module_->get_kernel("fill_u32");
  constexpr std::size_t n = 8 * 128;
  auto out = cubridge::driver_buffer<unsigned>::allocate(*ctx_, n);
  cubridge::scoped_current guard(*ctx_);
  k.launch({.grid = {8},
            .block = {128},
            .stream = cubridge::stream_ref::legacy_default(),
            .cluster = {2, 1, 1}},
           out.span(), 9u, n);
  std::vector<unsigned> host(n);
  CUBRIDGE_ASSERT_CU(cubridge::driver::api().cuMemcpy(reinterpret_cast<CUdeviceptr>(host.data()),
                                                      out.address(), n * sizeof(unsigned)));
  for (unsigned v : host) ASSERT_EQ(v, 9u);
  // A cluster that does not divide the grid is refused by the driver, with the config named.
  try {
    k.launch({.grid = {7},
              .block = {128},
              .stream = cubridge::stream_ref::legacy_default(),
              .cluster = {2, 1, 1}},
             out.span(), 9u, n);
    CUBRIDGE_ASSERT_CU(cubridge::driver::api().cuCtxSynchronize());
    FAIL() << "no throw";
  } catch (const cubridge::error& e) {
    EXPECT_EQ(e.call(), "cuLaunchKernelEx");
    EXPECT_NE(std::string(e.what()).find("cluster (2,1,1)"), std::string::npos) << e.what();
  }
}

// Occupancy: the driver's own answers, asked in the kernel's context (pushed, as for a launch).
TEST_F(Kernel, OccupancyIsTheDriversAnswer) {
  auto k = module_->get_kernel("fill_u32");
  cubridge::scoped_current guard(*ctx_);
  const unsigned blocks = k.max_active_blocks_per_sm(256);
  int raw_blocks = 0;
  CUBRIDGE_ASSERT_CU(cubridge::driver::api().cuOccupancyMaxActiveBlocksPerMultiprocessor(
      &raw_blocks, k.launch_handle(), 256, 0));
  EXPECT_EQ(blocks, static_cast<unsigned>(raw_blocks));
  EXPECT_GT(blocks, 0u);
  EXPECT_LE(k.max_active_blocks_per_sm(256, 16 * 1024), blocks)
      << "dynamic shared memory never lets more blocks fit";

  const auto suggestion = k.suggested_block_size();
  int raw_grid = 0;
  int raw_block = 0;
  CUBRIDGE_ASSERT_CU(cubridge::driver::api().cuOccupancyMaxPotentialBlockSize(
      &raw_grid, &raw_block, k.launch_handle(), nullptr, 0, 0));
  EXPECT_EQ(suggestion.block_size, static_cast<unsigned>(raw_block));
  EXPECT_EQ(suggestion.min_grid_size, static_cast<unsigned>(raw_grid));
  EXPECT_GT(suggestion.block_size, 0u);
  EXPECT_LE(suggestion.block_size,
            static_cast<unsigned>(k.attribute(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)));
  EXPECT_GT(suggestion.min_grid_size, 0u);
  EXPECT_GT(k.max_active_blocks_per_sm(suggestion.block_size), 0u);
  EXPECT_LE(k.suggested_block_size(0, 64).block_size, 64u) << "the limit caps the block size";
}

TEST_F(Kernel, OccupancyOfALibraryKernelIsForTheCurrentContextsDevice) {
  auto lib = cubridge::library::load_file(cubridge::testing::test_cubin_path());
  cubridge::scoped_current guard(*ctx_);
  const auto from_library = lib.get_kernel("fill_u32");
  const auto from_module = module_->get_kernel("fill_u32");
  EXPECT_EQ(from_library.max_active_blocks_per_sm(128), from_module.max_active_blocks_per_sm(128));
  EXPECT_EQ(from_library.suggested_block_size().block_size,
            from_module.suggested_block_size().block_size);
}

TEST_F(Kernel, OccupancyRefusesBlockSizesTheDriverCannotTakeNamingTheKernel) {
  auto k = module_->get_kernel("fill_u32");
  cubridge::scoped_current guard(*ctx_);
  for (const auto& ask : {std::function<void()>([&] { (void)k.max_active_blocks_per_sm(0); }),
                          std::function<void()>([&] {
                            (void)k.max_active_blocks_per_sm(static_cast<unsigned>(INT_MAX) + 1);
                          }),
                          std::function<void()>([&] {
                            (void)k.suggested_block_size(0, static_cast<unsigned>(INT_MAX) + 1);
                          })}) {
    try {
      ask();
      FAIL() << "no throw";
    } catch (const cubridge::error& e) {
      EXPECT_TRUE(e.is(cubridge::errc::precondition)) << e.what();
      EXPECT_NE(std::string(e.what()).find("kernel 'fill_u32'"), std::string::npos) << e.what();
    }
  }
}

TEST_F(Kernel, FromNativeAdoptsAFunction) {
  CUfunction raw = nullptr;
  CUBRIDGE_ASSERT_CU(cubridge::driver::api().cuModuleGetFunction(&raw, module_->get(), "add_f32"));
  auto k = cubridge::kernel::from_native(raw);
  EXPECT_EQ(k.name(), "add_f32");
  EXPECT_EQ(k.parameters().size(), 3u);
  EXPECT_GT(k.attribute(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK), 0);
}

}  // namespace
