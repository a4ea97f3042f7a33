#include <cubridge/core/context.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/image.hpp>
#include <cubridge/core/module.hpp>
#include <cubridge/core/scoped_current.hpp>

#include "gpu_test.hpp"

#include <cstring>
#include <iostream>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace {

using cubridge::testing::test_cubin_other_path;
using cubridge::testing::test_cubin_path;
using cubridge::testing::test_fatbin_path;
using cubridge::testing::test_ptx_path;

/// Runs fill_u32 from `m` over a fresh buffer and checks every element.
void expect_fill_works(const cubridge::module& m, const cubridge::context& ctx) {
  auto fill = m.get_kernel("fill_u32");
  constexpr std::size_t n = 10000;
  auto out = cubridge::driver_buffer<unsigned>::allocate(ctx, n);
  const unsigned value = std::random_device{}() | 1u;
  cubridge::scoped_current guard(ctx);
  fill.launch(
      {.grid = {(n + 255) / 256}, .block = {256}, .stream = cubridge::stream_ref::legacy_default()},
      out.span(), value, n);
  std::vector<unsigned> host(n);
  CUBRIDGE_ASSERT_CU(cubridge::driver::api().cuMemcpy(reinterpret_cast<CUdeviceptr>(host.data()),
                                                      out.address(), n * sizeof(unsigned)));
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(host[i], value) << "element " << i;
}

class Module : public ::testing::Test {
 protected:
  void SetUp() override {
    CUBRIDGE_REQUIRE_GPU();
    ctx_.emplace(cubridge::context::create(cubridge::device::get(0)));
  }
  std::optional<cubridge::context> ctx_;
};

TEST_F(Module, LoadsCubinFromFileAndMemory) {
  auto from_file = cubridge::module::load_file(*ctx_, test_cubin_path());
  EXPECT_EQ(from_file.name(), "test_kernels.sm_90.cubin");
  EXPECT_EQ(from_file.context(), ctx_->ref());
  expect_fill_works(from_file, *ctx_);
  const auto bytes = cubridge::testing::read_bytes(test_cubin_path());
  auto from_memory = cubridge::module::load(*ctx_, bytes, {.name = "filters"});
  EXPECT_EQ(from_memory.name(), "filters");
  expect_fill_works(from_memory, *ctx_);
  EXPECT_FALSE(cubridge::context_ref::current()) << "load must restore the caller's stack";
}

TEST_F(Module, LoadsFatbinAndPtx) {
  expect_fill_works(cubridge::module::load_file(*ctx_, test_fatbin_path()), *ctx_);
  // PTX without a trailing NUL (as read from a file): the loader must add it.
  auto ptx = cubridge::module::load_file(*ctx_, test_ptx_path());
  expect_fill_works(ptx, *ctx_);
}

TEST_F(Module, RefusesAnImageForAnotherGpuBeforeTheDriverSeesIt) {
  if (ctx_->device().capability().major == 8) GTEST_SKIP() << "sm_80 code runs on this device";
  try {
    (void)cubridge::module::load_file(*ctx_, test_cubin_other_path());
    FAIL() << "no throw";
  } catch (const cubridge::image_error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::incompatible_image));
    EXPECT_NE(std::string(e.what()).find("sm_80"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("test_kernels.sm_80.cubin"), std::string::npos)
        << e.what();
  }
}

TEST_F(Module, GarbageIsAnImageError) {
  std::vector<std::byte> garbage(4096);
  std::mt19937 rng(7);
  for (auto& b : garbage) b = static_cast<std::byte>(rng());
  EXPECT_THROW((void)cubridge::module::load(*ctx_, garbage), cubridge::image_error);
  EXPECT_THROW((void)cubridge::module::load(*ctx_, {}), cubridge::image_error);
}

TEST_F(Module, BadPtxCarriesTheJitLog) {
  const std::string ptx =
      ".version 8.0\n.target sm_90\n.address_size 64\n"
      ".visible .entry broken()\n{\n  this_is_not_an_instruction;\n}\n";
  std::vector<std::byte> bytes(ptx.size());
  std::memcpy(bytes.data(), ptx.data(), ptx.size());
  try {
    (void)cubridge::module::load(*ctx_, bytes, {.name = "broken"});
    FAIL() << "no throw";
  } catch (const cubridge::image_error& e) {
    // The inspector reads PTX's header only: a refusal here would hide the JIT log this tests.
    FAIL() << "the inspector refused well-formed PTX before the JIT saw it: " << e.what();
  } catch (const cubridge::error& e) {
    EXPECT_EQ(e.call(), "cuModuleLoadDataEx");
    EXPECT_NE(std::string(e.what()).find("module 'broken'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("JIT log"), std::string::npos) << e.what();
  }
}

TEST_F(Module, MissingFileAndMissingKernelAreNamed) {
  try {
    (void)cubridge::module::load_file(*ctx_, "/nonexistent/filters.cubin");
    FAIL() << "no throw";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::io));
    EXPECT_NE(std::string(e.what()).find("/nonexistent/filters.cubin"), std::string::npos);
  }
  auto m = cubridge::module::load_file(*ctx_, test_cubin_path(), {.name = "filters"});
  try {
    (void)m.get_kernel("no_such_kernel");
    FAIL() << "no throw";
  } catch (const cubridge::error& e) {
    EXPECT_EQ(e.code(), CUDA_ERROR_NOT_FOUND);
    EXPECT_NE(std::string(e.what()).find("kernel 'no_such_kernel' in module 'filters'"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(Module, GlobalsAreReachable) {
  auto m = cubridge::module::load_file(*ctx_, test_cubin_path());
  auto counter = m.get_global("launch_counter");
  EXPECT_EQ(counter.size(), sizeof(unsigned long long));
  auto count = m.get_kernel("count_launch");
  cubridge::scoped_current guard(*ctx_);
  CUBRIDGE_ASSERT_CU(cubridge::driver::api().cuMemsetD8(counter.address(), 0, counter.size()));
  for (int i = 0; i < 5; ++i) count.launch({.stream = cubridge::stream_ref::legacy_default()});
  unsigned long long value = 0;
  CUBRIDGE_ASSERT_CU(cubridge::driver::api().cuMemcpy(reinterpret_cast<CUdeviceptr>(&value),
                                                      counter.address(), sizeof value));
  EXPECT_EQ(value, 5u);
}

TEST_F(Module, AKernelKeepsItsModuleLoaded) {
  std::optional<cubridge::kernel> fill;
  CUmodule raw = nullptr;
  {
    auto m = cubridge::module::load_file(*ctx_, test_cubin_path());
    raw = m.get();
    fill.emplace(m.get_kernel("fill_u32"));
  }
  // The module object is gone, but the kernel still launches: the module stayed loaded.
  auto out = cubridge::driver_buffer<unsigned>::allocate(*ctx_, 256);
  cubridge::scoped_current guard(*ctx_);
  fill->launch({.block = {256}, .stream = cubridge::stream_ref::legacy_default()}, out.span(), 5u,
               std::size_t{256});
  CUBRIDGE_ASSERT_CU(cubridge::driver::api().cuCtxSynchronize());
  CUfunction f = nullptr;
  EXPECT_EQ(cubridge::driver::api().cuModuleGetFunction(&f, raw, "fill_u32"), CUDA_SUCCESS);
}

// The kernels the driver lists for a loaded module (cuModuleEnumerateFunctions).
std::set<std::string> driver_kernels(const cubridge::module& m) {
  unsigned count = 0;
  EXPECT_EQ(cubridge::driver::api().cuModuleGetFunctionCount(&count, m.get()), CUDA_SUCCESS);
  std::vector<CUfunction> functions(count);
  if (count != 0) {
    EXPECT_EQ(cubridge::driver::api().cuModuleEnumerateFunctions(functions.data(), count, m.get()),
              CUDA_SUCCESS);
  }
  std::set<std::string> names;
  for (CUfunction f : functions) {
    const char* name = nullptr;
    EXPECT_EQ(cubridge::driver::api().cuFuncGetName(&name, f), CUDA_SUCCESS);
    if (name) names.insert(name);
  }
  return names;
}

// A `--compress-mode=size` fatbin (cubins zstd-compressed) loads, its kernels launch, and what
// the image lists is what the driver lists (issue 12).
TEST_F(Module, ASizeCompressedFatbinLoadsAndItsKernelsAreTheDrivers) {
  auto m = cubridge::module::load_file(*ctx_, CUBRIDGE_SIZE_FATBIN);
  expect_fill_works(m, *ctx_);
  const auto info = cubridge::inspect_image_file(CUBRIDGE_SIZE_FATBIN);
  ASSERT_FALSE(info.kernels.empty());
  std::set<std::string> listed;
  for (const auto& k : info.kernels) listed.insert(k.name);
  const auto loaded = driver_kernels(m);
  for (const auto& name : listed)
    EXPECT_TRUE(loaded.contains(name)) << name << " missing from the driver's list";
  std::string all;
  for (const auto& name : loaded) all += name + " ";
  std::cout << "driver lists " << loaded.size() << " kernels: " << all << "\n";
}

// The post-load check accepts every form of the test kernels (no false refusals).
TEST_F(Module, TheKernelListCheckAcceptsEveryImageForm) {
  for (const char* path :
       {test_cubin_path(), test_fatbin_path(), test_ptx_path(), CUBRIDGE_SIZE_FATBIN}) {
    SCOPED_TRACE(path);
    auto m = cubridge::module::load_file(*ctx_, path);
    EXPECT_TRUE(driver_kernels(m).contains("fill_u32"));
  }
  EXPECT_FALSE(cubridge::context_ref::current()) << "load must restore the caller's stack";
}

}  // namespace
