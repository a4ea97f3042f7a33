// Tests of cubridge/compile/machine_code.hpp: every source kind to machine code for a given
// device, checked by inspecting what comes out. NVRTC and nvJitLink run without a GPU.
#include <cubridge/compile/machine_code.hpp>
#include <cubridge/core/image.hpp>
#include <cubridge/core/module.hpp>

#include <gtest/gtest.h>

#include "gpu_test.hpp"  // only for the test images (paths, read_bytes)
#include "temp_dir.hpp"

#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace {

using cubridge::arch_variant;
using cubridge::build_machine_code;
using cubridge::compute_capability;
using cubridge::source_kind;
using bytes = std::vector<std::byte>;

constexpr std::string_view scale_source = R"(
#include "factor.h"
extern "C" __global__ void scale(float* data, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] *= FACTOR;
}
)";

bytes as_bytes(std::string_view text) {
  bytes out(text.size());
  std::memcpy(out.data(), text.data(), text.size());
  return out;
}

cubridge::build_options with_factor_header() {
  cubridge::build_options options;
  options.compile.headers.push_back({"factor.h", "#define FACTOR 2.0f\n"});
  return options;
}

// The cubin's one target, named as the formatter names `target`, and the kernel `kernel`.
void expect_cubin_for(const bytes& code, compute_capability target, const char* kernel) {
  const auto info = cubridge::inspect_image(code);
  EXPECT_EQ(info.kind, cubridge::image_kind::cubin);
  ASSERT_EQ(info.targets.size(), 1u);
  EXPECT_EQ(info.targets[0].arch_name, cubridge::to_string(target));
  EXPECT_EQ(info.targets[0].capability(), target);
  EXPECT_NE(info.find_kernel(kernel), nullptr) << kernel;
}

TEST(SourceKind, FromTheFileExtension) {
  EXPECT_EQ(cubridge::source_kind_of("dir/filters.cu"), source_kind::cuda_source);
  EXPECT_EQ(cubridge::source_kind_of("filters.ptx"), source_kind::ptx);
  EXPECT_EQ(cubridge::source_kind_of("/tmp/filters.cubin"), source_kind::cubin);
  EXPECT_EQ(cubridge::source_kind_of("filters.fatbin"), source_kind::fatbin);
  for (const char* other : {"filters.CU", "filters.txt", "filters", "filters.cubin.bak", ".cu/x"})
    EXPECT_FALSE(cubridge::source_kind_of(other)) << other;
}

TEST(BuildMachineCode, CudaSourceBecomesACubinForTheTarget) {
  const auto source = as_bytes(scale_source);
  for (const compute_capability target :
       {compute_capability{9, 0}, compute_capability{8, 6},
        compute_capability{9, 0, arch_variant::arch_specific},
        compute_capability{10, 0, arch_variant::family_specific}}) {
    SCOPED_TRACE(cubridge::to_string(target));
    const auto code = build_machine_code(source_kind::cuda_source, source, "scale.cu", target,
                                         with_factor_header());
    expect_cubin_for(code, target, "scale");
  }
}

TEST(BuildMachineCode, CudaSourceErrorsCarryTheLogAndTheName) {
  try {
    (void)build_machine_code(source_kind::cuda_source,
                             as_bytes("extern \"C\" __global__ void k() { undeclared = 1; }\n"),
                             "broken.cu", {9, 0});
    FAIL() << "no throw";
  } catch (const cubridge::compile_error& e) {
    EXPECT_EQ(e.source_name(), "broken.cu");
    EXPECT_EQ(e.architecture(), "sm_90");
    EXPECT_NE(e.log().find("undeclared"), std::string::npos) << e.log();
  }
}

TEST(BuildMachineCode, PtxIsLinkedForTheTarget) {
  const auto ptx = cubridge::testing::read_bytes(cubridge::testing::test_ptx_path());  // compute_90
  expect_cubin_for(build_machine_code(source_kind::ptx, ptx, "test_kernels.ptx", {9, 0}), {9, 0},
                   "fill_u32");
  expect_cubin_for(build_machine_code(source_kind::ptx, ptx, "test_kernels.ptx", {10, 0}), {10, 0},
                   "fill_u32");
}

TEST(BuildMachineCode, MachineCodeForTheTargetPassesThroughAsItIs) {
  const auto cubin = cubridge::testing::read_bytes(cubridge::testing::test_cubin_path());  // sm_90
  EXPECT_EQ(build_machine_code(source_kind::cubin, cubin, "k.cubin", {9, 0}), cubin);
  const auto fatbin = cubridge::testing::read_bytes(cubridge::testing::test_fatbin_path());
  EXPECT_EQ(build_machine_code(source_kind::fatbin, fatbin, "k.fatbin", {8, 6}), fatbin);   // sm_80
  EXPECT_EQ(build_machine_code(source_kind::fatbin, fatbin, "k.fatbin", {12, 0}), fatbin);  // PTX
}

TEST(BuildMachineCode, MachineCodeForAnotherGpuIsRefused) {
  const auto cubin = cubridge::testing::read_bytes(cubridge::testing::test_cubin_path());  // sm_90
  for (const compute_capability other : {compute_capability{8, 0}, compute_capability{10, 0}}) {
    SCOPED_TRACE(cubridge::to_string(other));
    try {
      (void)build_machine_code(source_kind::cubin, cubin, "filters.cubin", other);
      ADD_FAILURE() << "an sm_90 cubin passed for " << cubridge::to_string(other);
    } catch (const cubridge::image_error& e) {
      EXPECT_TRUE(e.is(cubridge::errc::incompatible_image)) << e.what();
      const std::string m = e.what();
      EXPECT_NE(m.find("filters.cubin: cubin has code for sm_90, none of which runs on a device "
                       "of " +
                       cubridge::to_string(other)),
                std::string::npos)
          << m;
    }
  }
  const auto fatbin = cubridge::testing::read_bytes(cubridge::testing::test_fatbin_path());
  EXPECT_THROW((void)build_machine_code(source_kind::fatbin, fatbin, "k.fatbin", {7, 5}),
               cubridge::image_error);
}

TEST(BuildMachineCode, BytesThatAreNoImageAreRefusedByName) {
  try {
    (void)build_machine_code(source_kind::cubin, as_bytes("not a cubin"), "fake.cubin", {9, 0});
    FAIL() << "no throw";
  } catch (const cubridge::image_error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::bad_image)) << e.what();
    EXPECT_NE(std::string(e.what()).find("fake.cubin: "), std::string::npos) << e.what();
  }
}

TEST(BuildMachineCode, BuildsThroughTheCacheWhenGiven) {
  cubridge::testing::temp_dir dir;
  auto cache = cubridge::compile_cache::open(dir.path);
  auto options = with_factor_header();
  options.cache = &cache;
  const auto source = as_bytes(scale_source);
  const auto first =
      build_machine_code(source_kind::cuda_source, source, "scale.cu", {9, 0}, options);
  const auto second =
      build_machine_code(source_kind::cuda_source, source, "scale.cu", {9, 0}, options);
  EXPECT_EQ(first, second);
  EXPECT_EQ(cache.stats().misses, 1u);
  EXPECT_EQ(cache.stats().hits, 1u);
  // Another target is another entry.
  (void)build_machine_code(source_kind::cuda_source, source, "scale.cu", {8, 6}, options);
  EXPECT_EQ(cache.stats().misses, 2u);
  const auto ptx = cubridge::testing::read_bytes(cubridge::testing::test_ptx_path());
  (void)build_machine_code(source_kind::ptx, ptx, "k.ptx", {9, 0}, options);
  (void)build_machine_code(source_kind::ptx, ptx, "k.ptx", {9, 0}, options);
  EXPECT_EQ(cache.stats().misses, 3u);
  EXPECT_EQ(cache.stats().hits, 2u);
}

}  // namespace
