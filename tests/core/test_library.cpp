#include <cubridge/core/context.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/library.hpp>
#include <cubridge/core/scoped_current.hpp>

#include "gpu_test.hpp"

#include <vector>

namespace {

std::vector<unsigned> fill_in(const cubridge::kernel& fill, const cubridge::context& ctx,
                              unsigned value) {
  constexpr std::size_t n = 4096;
  auto out = cubridge::driver_buffer<unsigned>::allocate(ctx, n);
  cubridge::scoped_current guard(ctx);
  fill.launch({.grid = {n / 256}, .block = {256}, .stream = cubridge::stream_ref::legacy_default()},
              out.span(), value, n);
  std::vector<unsigned> host(n);
  EXPECT_EQ(cubridge::driver::api().cuMemcpy(reinterpret_cast<CUdeviceptr>(host.data()),
                                             out.address(), n * sizeof(unsigned)),
            CUDA_SUCCESS);
  return host;
}

TEST(Library, OneLoadServesEveryContext) {
  CUBRIDGE_REQUIRE_GPU();
  auto a = cubridge::context::create(cubridge::device::get(0));
  auto b = cubridge::context::create(cubridge::device::get(0));
  auto lib = cubridge::library::load_file(cubridge::testing::test_cubin_path());
  EXPECT_EQ(lib.name(), "test_kernels.sm_90.cubin");
  try {
    (void)lib.get_kernel("fill_u32");
    FAIL() << "a lookup without a current context must be refused";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::precondition));
    EXPECT_NE(std::string(e.what()).find("needs a current context"), std::string::npos) << e.what();
  }
  const auto fill = [&] {
    cubridge::scoped_current guard(a);
    return lib.get_kernel("fill_u32");
  }();
  EXPECT_EQ(fill.source(), cubridge::kernel::origin::library);
  ASSERT_EQ(fill.parameters().size(), 3u);
  for (unsigned v : fill_in(fill, a, 1u)) ASSERT_EQ(v, 1u);
  for (unsigned v : fill_in(fill, b, 2u)) ASSERT_EQ(v, 2u);
  EXPECT_GT(fill.attribute(CU_FUNC_ATTRIBUTE_NUM_REGS), 0);
}

TEST(Library, RefusesGarbageAndMissingKernels) {
  CUBRIDGE_REQUIRE_GPU();
  std::vector<std::byte> garbage(100, std::byte{0x42});
  EXPECT_THROW((void)cubridge::library::load(garbage), cubridge::image_error);
  auto lib =
      cubridge::library::load_file(cubridge::testing::test_fatbin_path(), {.name = "filters"});
  auto ctx = cubridge::context::create(cubridge::device::get(0));
  cubridge::scoped_current guard(ctx);
  try {
    (void)lib.get_kernel("nope");
    FAIL() << "no throw";
  } catch (const cubridge::error& e) {
    EXPECT_NE(std::string(e.what()).find("kernel 'nope' in library 'filters'"), std::string::npos)
        << e.what();
  }
}

// A `--compress-mode=size` fatbin (cubins zstd-compressed) loads as a library (its kernel list
// checked against cuLibraryEnumerateKernels) and its kernels run (issue 12).
TEST(Library, ASizeCompressedFatbinLoadsAndRuns) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = cubridge::context::create(cubridge::device::get(0));
  auto lib = cubridge::library::load_file(CUBRIDGE_SIZE_FATBIN);
  unsigned count = 0;
  ASSERT_EQ(cubridge::driver::api().cuLibraryGetKernelCount(&count, lib.get()), CUDA_SUCCESS);
  EXPECT_GE(count, 6u);  // test_kernels.cu defines six
  const auto fill = [&] {
    cubridge::scoped_current guard(ctx);
    return lib.get_kernel("fill_u32");
  }();
  for (unsigned v : fill_in(fill, ctx, 7u)) ASSERT_EQ(v, 7u);
}

}  // namespace
