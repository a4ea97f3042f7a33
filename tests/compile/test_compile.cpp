// NVRTC and nvJitLink compiles, checked by inspecting the produced images (no GPU needed).
#include <cubridge/compile/compile.hpp>
#include <cubridge/core/detail/file_io.hpp>
#include <cubridge/core/image.hpp>

#include <gtest/gtest.h>

#include "temp_dir.hpp"

#include <unistd.h>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

namespace {

using cubridge::testing::temp_dir;
using cubridge::testing::write_text;

namespace fs = std::filesystem;

constexpr const char* scale_source = R"(
extern "C" __global__ void scale(float* data, float factor, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] *= factor;
}
)";

constexpr const char* template_source = R"(
template <typename T>
__global__ void axpy(T a, const T* x, T* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
)";

std::vector<std::size_t> sizes(std::initializer_list<std::size_t> list) {
  return list;
}

cubridge::image_info inspect(const std::vector<std::byte>& bytes) {
  return cubridge::inspect_image(std::span<const std::byte>(bytes));
}

void expect_cubin_for_sm90(const cubridge::image_info& info) {
  EXPECT_EQ(info.kind, cubridge::image_kind::cubin);
  ASSERT_EQ(info.targets.size(), 1u);
  EXPECT_EQ(info.targets[0].kind, cubridge::image_kind::cubin);
  EXPECT_EQ(info.targets[0].sm, 90);
  EXPECT_EQ(info.targets[0].variant, cubridge::arch_variant::generic);
  EXPECT_EQ(info.targets[0].arch_name, "sm_90");
  EXPECT_TRUE(cubridge::can_run_on(info, {9, 0}));
}

TEST(Compile, KernelToCubinForSm90) {
  const auto image = cubridge::nvrtc_compile({.name = "scale.cu", .text = scale_source});
  const auto info = inspect(image.cubin);
  expect_cubin_for_sm90(info);
  ASSERT_EQ(info.kernels.size(), 1u);
  const auto* kernel = info.find_kernel("scale");
  ASSERT_NE(kernel, nullptr);
  ASSERT_TRUE(kernel->parameter_sizes.has_value());
  EXPECT_EQ(*kernel->parameter_sizes, sizes({8, 4, 4}));
  EXPECT_TRUE(image.lowered_names.empty());
}

TEST(Compile, OtherArchitectureGivesItsOwnCubin) {
  const auto image = cubridge::nvrtc_compile({.name = "scale.cu", .text = scale_source},
                                             {.architecture = "sm_80"});
  const auto info = inspect(image.cubin);
  ASSERT_EQ(info.targets.size(), 1u);
  EXPECT_EQ(info.targets[0].arch_name, "sm_80");
  EXPECT_NE(info.find_kernel("scale"), nullptr);

  const auto specific = cubridge::nvrtc_compile({.name = "scale.cu", .text = scale_source},
                                                {.architecture = "sm_90a"});
  const auto specific_info = inspect(specific.cubin);
  ASSERT_EQ(specific_info.targets.size(), 1u);
  EXPECT_EQ(specific_info.targets[0].arch_name, "sm_90a");
  EXPECT_EQ(specific_info.targets[0].variant, cubridge::arch_variant::arch_specific);
}

TEST(Compile, NameExpressionsMapToTheMangledKernelsOfTheCubin) {
  const auto image = cubridge::nvrtc_compile({.name = "axpy.cu", .text = template_source},
                                             {.name_expressions = {"axpy<float>", "axpy<double>"}});
  ASSERT_EQ(image.lowered_names.size(), 2u);
  const std::string& as_float = image.lowered_names.at("axpy<float>");
  const std::string& as_double = image.lowered_names.at("axpy<double>");
  // The Itanium mangling of the instantiations: axpy<float>(float, const float*, float*, int).
  EXPECT_EQ(as_float, "_Z4axpyIfEvT_PKS0_PS0_i");
  EXPECT_EQ(as_double, "_Z4axpyIdEvT_PKS0_PS0_i");

  const auto info = inspect(image.cubin);
  expect_cubin_for_sm90(info);
  EXPECT_EQ(info.kernels.size(), 2u);
  const auto* f = info.find_kernel(as_float);
  const auto* d = info.find_kernel(as_double);
  ASSERT_NE(f, nullptr);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(*f->parameter_sizes, sizes({4, 8, 8, 4}));
  EXPECT_EQ(*d->parameter_sizes, sizes({8, 8, 8, 4}));
}

TEST(Compile, InvalidNameExpressionThrows) {
  try {
    (void)cubridge::nvrtc_compile({.name = "axpy.cu", .text = template_source},
                                  {.name_expressions = {"no_such_kernel<int>"}});
    FAIL() << "expected a compile_error";
  } catch (const cubridge::compile_error& e) {
    EXPECT_EQ(e.source(), cubridge::error_source::nvrtc);
    EXPECT_NE(std::string(e.what()).find("no_such_kernel"), std::string::npos) << e.what();
  }
}

TEST(Compile, IncludePathsAndInMemoryHeadersAndDefines) {
  temp_dir dir;
  // From an include path, found through a nested include.
  write_text(dir.path / "inc" / "names.cuh", "#pragma once\n#include \"detail/name.cuh\"\n");
  write_text(dir.path / "inc" / "detail" / "name.cuh", "#define KERNEL_NAME from_include_path\n");
  const std::string source = R"(
#include "names.cuh"
#include <params.cuh>
extern "C" __global__ void KERNEL_NAME(params p, int* out) { out[0] = (int)p.values[2]; }
extern "C" __global__ void DEFINED_NAME(int* out) { out[0] = EXTRA; }
)";
  const auto image = cubridge::nvrtc_compile(
      {.name = "includes.cu", .text = source},
      {.include_paths = {dir.path / "inc"},
       .headers = {{"params.cuh", "struct params { double values[5]; };\n"}},
       .defines = {{"DEFINED_NAME", "from_define"}, {"EXTRA", "7"}}});
  const auto info = inspect(image.cubin);
  expect_cubin_for_sm90(info);
  const auto* from_path = info.find_kernel("from_include_path");
  ASSERT_NE(from_path, nullptr);
  // The in-memory header's struct decides the first parameter's size: 5 doubles.
  EXPECT_EQ(*from_path->parameter_sizes, sizes({40, 8}));
  const auto* from_define = info.find_kernel("from_define");
  ASSERT_NE(from_define, nullptr);
  EXPECT_EQ(*from_define->parameter_sizes, sizes({8}));
}

TEST(Compile, CompileErrorCarriesTheLogNamingTheLine) {
  const std::string broken =
      "extern \"C\" __global__ void k(int* p) {\n"
      "  int fine = 1;\n"
      "  p[0] = undeclared_variable + fine;\n"
      "}\n";
  try {
    (void)cubridge::nvrtc_compile({.name = "broken.cu", .text = broken});
    FAIL() << "expected a compile_error";
  } catch (const cubridge::compile_error& e) {
    EXPECT_EQ(e.source(), cubridge::error_source::nvrtc);
    EXPECT_EQ(e.code(), 6);  // NVRTC_ERROR_COMPILATION
    EXPECT_EQ(e.code_name(), "NVRTC_ERROR_COMPILATION");
    EXPECT_EQ(e.call(), "nvrtcCompileProgram");
    EXPECT_EQ(e.source_name(), "broken.cu");
    EXPECT_EQ(e.architecture(), "sm_90");
    EXPECT_NE(e.log().find("broken.cu(3)"), std::string::npos) << e.log();
    EXPECT_NE(e.log().find("undeclared_variable"), std::string::npos) << e.log();
    const std::string what = e.what();
    EXPECT_NE(what.find("compiling 'broken.cu' for sm_90"), std::string::npos) << what;
    EXPECT_NE(what.find("broken.cu(3)"), std::string::npos) << what;
  }
}

TEST(Compile, UnknownOptionThrowsInvalidOption) {
  try {
    (void)cubridge::nvrtc_compile({.name = "scale.cu", .text = scale_source},
                                  {.extra_options = {"--no-such-option"}});
    FAIL() << "expected a compile_error";
  } catch (const cubridge::compile_error& e) {
    EXPECT_EQ(e.source(), cubridge::error_source::nvrtc);
    EXPECT_EQ(e.code_name(), "NVRTC_ERROR_INVALID_OPTION");
  }
}

TEST(Compile, PreconditionsAreChecked) {
  const cubridge::cuda_source source{.name = "scale.cu", .text = scale_source};
  auto expect_precondition = [](auto&& call) {
    try {
      call();
      ADD_FAILURE() << "expected a precondition error";
    } catch (const cubridge::compile_error& e) {
      ADD_FAILURE() << "expected a precondition error, got " << e.what();
    } catch (const cubridge::error& e) {
      EXPECT_TRUE(e.is(cubridge::errc::precondition)) << e.what();
    }
  };
  expect_precondition(
      [&] { (void)cubridge::nvrtc_compile(source, {.architecture = "compute_90"}); });
  expect_precondition([&] { (void)cubridge::nvrtc_compile(source, {.architecture = "sm_9"}); });
  expect_precondition([&] { (void)cubridge::nvrtc_compile(source, {.architecture = "90"}); });
  expect_precondition(
      [&] { (void)cubridge::nvrtc_compile(source, {.extra_options = {"-arch=sm_80"}}); });
  expect_precondition([&] {
    (void)cubridge::nvrtc_compile(source, {.headers = {{"a.h", ""}, {"a.h", "int x;"}}});
  });
  expect_precondition(
      [&] { (void)cubridge::nvrtc_compile_ptx(source, {.architecture = "sm_90"}); });
  expect_precondition([&] { (void)cubridge::ptx_to_cubin(""); });
  expect_precondition(
      [&] { (void)cubridge::ptx_to_cubin(".version 9.0", {.architecture = "compute_90"}); });
  expect_precondition(
      [&] { (void)cubridge::ptx_to_cubin(".version 9.0", {.extra_options = {"-arch=sm_80"}}); });
}

TEST(Compile, NvrtcPtxLinksToSm90CubinThroughNvJitLink) {
  const auto ptx = cubridge::nvrtc_compile_ptx(
      {.name = "axpy.cu", .text = template_source},
      {.architecture = "compute_90", .name_expressions = {"axpy<float>"}});
  const auto ptx_info =
      cubridge::inspect_image(std::as_bytes(std::span(ptx.ptx.data(), ptx.ptx.size())));
  EXPECT_EQ(ptx_info.kind, cubridge::image_kind::ptx);
  ASSERT_EQ(ptx_info.targets.size(), 1u);
  EXPECT_EQ(ptx_info.targets[0].arch_name, "compute_90");
  const std::string& mangled = ptx.lowered_names.at("axpy<float>");
  ASSERT_NE(ptx_info.find_kernel(mangled), nullptr);

  const auto image = cubridge::ptx_to_cubin(ptx.ptx, {.architecture = "sm_90", .name = "axpy.ptx"});
  const auto info = inspect(image.cubin);
  expect_cubin_for_sm90(info);
  const auto* kernel = info.find_kernel(mangled);
  ASSERT_NE(kernel, nullptr);
  EXPECT_EQ(*kernel->parameter_sizes, sizes({4, 8, 8, 4}));
}

TEST(Compile, NvccPtxLinksToSm90Cubin) {
  std::ifstream in(CUBRIDGE_TEST_PTX, std::ios::binary);
  ASSERT_TRUE(in) << CUBRIDGE_TEST_PTX;
  const std::string ptx((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto from_ptx = cubridge::inspect_image(std::as_bytes(std::span(ptx.data(), ptx.size())));
  const auto image =
      cubridge::ptx_to_cubin(ptx, {.name = "test_kernels.ptx", .extra_options = {"-O3"}});
  const auto info = inspect(image.cubin);
  expect_cubin_for_sm90(info);
  // Every kernel of the PTX, with the same parameter sizes.
  ASSERT_FALSE(from_ptx.kernels.empty());
  for (const auto& kernel : from_ptx.kernels) {
    const auto* linked = info.find_kernel(kernel.name);
    ASSERT_NE(linked, nullptr) << kernel.name;
    EXPECT_EQ(linked->parameter_sizes, kernel.parameter_sizes) << kernel.name;
  }
}

TEST(Compile, BadPtxThrowsWithNvJitLinkLog) {
  const auto ptx = cubridge::nvrtc_compile_ptx({.name = "scale.cu", .text = scale_source},
                                               {.architecture = "compute_90"});
  // Break one instruction of valid PTX.
  std::string broken = ptx.ptx;
  const auto at = broken.find("ret;");
  ASSERT_NE(at, std::string::npos);
  broken.replace(at, 4, "no_such_instruction %r1;");
  try {
    (void)cubridge::ptx_to_cubin(broken, {.name = "broken.ptx"});
    FAIL() << "expected a compile_error";
  } catch (const cubridge::compile_error& e) {
    EXPECT_EQ(e.source(), cubridge::error_source::nvjitlink);
    EXPECT_EQ(e.code_name(), "NVJITLINK_ERROR_PTX_COMPILE");
    EXPECT_EQ(e.source_name(), "broken.ptx");
    EXPECT_FALSE(e.log().empty());
    EXPECT_NE(e.log().find("no_such_instruction"), std::string::npos) << e.log();
    EXPECT_NE(std::string(e.what()).find("linking 'broken.ptx' for sm_90"), std::string::npos)
        << e.what();
  }

  try {
    (void)cubridge::ptx_to_cubin("this is not PTX at all", {.name = "garbage.ptx"});
    FAIL() << "expected a compile_error";
  } catch (const cubridge::compile_error& e) {
    EXPECT_EQ(e.source(), cubridge::error_source::nvjitlink);
    EXPECT_FALSE(e.log().empty()) << e.what();
  }
}

TEST(Compile, UnknownNvJitLinkOptionThrows) {
  const auto ptx = cubridge::nvrtc_compile_ptx({.name = "scale.cu", .text = scale_source},
                                               {.architecture = "compute_90"});
  try {
    (void)cubridge::ptx_to_cubin(ptx.ptx, {.extra_options = {"-no-such-option"}});
    FAIL() << "expected a compile_error";
  } catch (const cubridge::compile_error& e) {
    EXPECT_EQ(e.source(), cubridge::error_source::nvjitlink);
    EXPECT_EQ(e.call(), "nvJitLinkCreate");
  }
}

TEST(Compile, LibraryVersionsAreThoseOfTheToolkit) {
  const auto nvrtc = cubridge::nvrtc_version();
  const auto nvjitlink = cubridge::nvjitlink_version();
  EXPECT_EQ(nvrtc.major, 13);
  EXPECT_EQ(nvjitlink.major, 13);
  EXPECT_GE(nvrtc.minor, 0);
}

// --- the toolkit's own headers --------------------------------------------------------------

constexpr const char* cooperative_source = R"(
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
extern "C" __global__ void block_sum(int* out) {
  auto block = cg::this_thread_block();
  atomicAdd(out, static_cast<int>(block.thread_rank()));
  block.sync();
}
)";

/// Skips the test where the toolkit this was built with has no headers on this machine (a GPU
/// machine with the runtime libraries only); where it has, NVRTC's toolkit must be found.
#define CUBRIDGE_REQUIRE_TOOLKIT_HEADERS()                                                 \
  do {                                                                                     \
    const fs::path header = fs::path(CUBRIDGE_TEST_CUDA_INCLUDE) / "cooperative_groups.h"; \
    if (!fs::exists(header)) GTEST_SKIP() << "no toolkit headers here: no " << header;     \
  } while (false)

TEST(Compile, TheToolkitsHeadersAreFoundWithoutAnIncludePath) {
  CUBRIDGE_REQUIRE_TOOLKIT_HEADERS();
  const auto& toolkit = cubridge::toolkit_include_paths();
  ASSERT_FALSE(toolkit.empty()) << "the toolkit's include directory was not found from NVRTC";
  for (const auto& path : toolkit) EXPECT_TRUE(fs::is_directory(path)) << path;
  EXPECT_TRUE(fs::exists(toolkit.front() / "cooperative_groups.h")) << toolkit.front();
  if (cubridge::nvrtc_version().major >= 13) {  // CCCL moved to include/cccl in CUDA 13
    ASSERT_EQ(toolkit.size(), 2u);
    EXPECT_EQ(toolkit[1], toolkit.front() / "cccl");
  }
  const auto image =
      cubridge::nvrtc_compile({.name = "cooperative.cu", .text = cooperative_source});
  expect_cubin_for_sm90(inspect(image.cubin));
  EXPECT_NE(inspect(image.cubin).find_kernel("block_sum"), nullptr);
}

TEST(Compile, TheToolkitsHeadersAreLeftOutWhenAskedTo) {
  CUBRIDGE_REQUIRE_TOOLKIT_HEADERS();
  try {
    (void)cubridge::nvrtc_compile({.name = "cooperative.cu", .text = cooperative_source},
                                  {.search_toolkit_headers = false});
    FAIL() << "compiled without the toolkit's headers";
  } catch (const cubridge::compile_error& e) {
    EXPECT_EQ(e.code_name(), "NVRTC_ERROR_COMPILATION");
    EXPECT_NE(e.log().find("cooperative_groups.h"), std::string::npos) << e.log();
  }
}

TEST(Compile, TheCallersHeadersComeBeforeTheToolkits) {
  CUBRIDGE_REQUIRE_TOOLKIT_HEADERS();
  temp_dir dir;
  // A header of the toolkit's name in the caller's include paths (options, then -I) wins.
  write_text(dir.path / "first" / "cooperative_groups.h", "#define CALLERS_OWN from_options\n");
  write_text(dir.path / "second" / "cuda_fp16.h", "#define CALLERS_HALF from_extra_option\n");
  const std::string source =
      "#include <cooperative_groups.h>\n#include <cuda_fp16.h>\n"
      "extern \"C\" __global__ void CALLERS_OWN() {}\n"
      "extern \"C\" __global__ void CALLERS_HALF() {}\n";
  const auto image = cubridge::nvrtc_compile(
      {.name = "shadow.cu", .text = source},
      {.include_paths = {dir.path / "first"},
       .extra_options = {"--include-path=" + (dir.path / "second").string()}});
  const auto info = inspect(image.cubin);
  EXPECT_NE(info.find_kernel("from_options"), nullptr);
  EXPECT_NE(info.find_kernel("from_extra_option"), nullptr);
}

// --- a .cu file ------------------------------------------------------------------------------

/// Makes `directory` the working directory until the end of the scope.
class working_directory {
 public:
  explicit working_directory(const fs::path& directory) : before_(fs::current_path()) {
    fs::current_path(directory);
  }
  ~working_directory() { fs::current_path(before_); }
  working_directory(const working_directory&) = delete;
  working_directory& operator=(const working_directory&) = delete;

 private:
  fs::path before_;
};

TEST(CompileFile, CompilesTheFileAndNamesItByItsFileName) {
  temp_dir dir;
  write_text(dir.path / "kernels" / "scale.cu", scale_source);
  const auto image = cubridge::nvrtc_compile_file(dir.path / "kernels" / "scale.cu");
  expect_cubin_for_sm90(inspect(image.cubin));
  EXPECT_NE(inspect(image.cubin).find_kernel("scale"), nullptr);

  write_text(dir.path / "kernels" / "broken.cu",
             "extern \"C\" __global__ void k(int* p) {\n  p[0] = 1;\n  p[1] = undeclared;\n}\n");
  try {
    (void)cubridge::nvrtc_compile_file(dir.path / "kernels" / "broken.cu",
                                       {.architecture = "sm_80"});
    FAIL() << "expected a compile_error";
  } catch (const cubridge::compile_error& e) {
    EXPECT_EQ(e.source_name(), "broken.cu");
    EXPECT_EQ(e.architecture(), "sm_80");
    EXPECT_NE(std::string(e.what()).find("compiling 'broken.cu' for sm_80"), std::string::npos)
        << e.what();
    // NVRTC's own log names the file by its path, as nvcc does.
    const auto path = fs::absolute(dir.path / "kernels" / "broken.cu").lexically_normal();
    EXPECT_NE(e.log().find(path.string() + "(3)"), std::string::npos) << e.log();
  }
}

TEST(CompileFile, QuotedIncludesAreFoundBesideTheFileFirst) {
  temp_dir dir;
  write_text(dir.path / "kernels" / "config.h", "#define KERNEL_NAME beside_the_file\n");
  write_text(dir.path / "kernels" / "detail" / "helper.h", "#include \"../config.h\"\n");
  write_text(dir.path / "elsewhere" / "config.h", "#define KERNEL_NAME from_the_include_path\n");
  // The working directory, where NVRTC looks first for a source named without a directory.
  write_text(dir.path / "cwd" / "config.h", "#define KERNEL_NAME from_the_working_directory\n");
  write_text(dir.path / "kernels" / "k.cu",
             "#include \"config.h\"\n#include <detail/helper.h>\n"
             "extern \"C\" __global__ void KERNEL_NAME() {}\n");
  const working_directory cwd(dir.path / "cwd");
  const auto image = cubridge::nvrtc_compile_file(dir.path / "kernels" / "k.cu",
                                                  {.include_paths = {dir.path / "elsewhere"}});
  const auto info = inspect(image.cubin);
  EXPECT_NE(info.find_kernel("beside_the_file"), nullptr);
  EXPECT_EQ(info.kernels.size(), 1u);

  // Named relative to the working directory, it is still looked for beside the file.
  write_text(dir.path / "cwd" / "sub" / "config.h", "#define KERNEL_NAME relative_and_beside\n");
  write_text(dir.path / "cwd" / "sub" / "k.cu",
             "#include \"config.h\"\nextern \"C\" __global__ void KERNEL_NAME() {}\n");
  EXPECT_NE(
      inspect(cubridge::nvrtc_compile_file("sub/k.cu").cubin).find_kernel("relative_and_beside"),
      nullptr);
}

TEST(CompileFile, WhatIsNoReadableSourceFileIsAnIoErrorNamingThePath) {
  temp_dir dir;
  const auto too_big = dir.path / "huge.cu";
  { std::ofstream(too_big) << "x"; }
  fs::resize_file(too_big, cubridge::detail::max_image_bytes + 1);  // sparse: nothing is written
  for (const auto& path : {dir.path / "missing.cu", dir.path, too_big}) {
    try {
      (void)cubridge::nvrtc_compile_file(path);
      ADD_FAILURE() << "compiled " << path;
    } catch (const cubridge::compile_error& e) {
      ADD_FAILURE() << "compile_error for " << path << ": " << e.what();
    } catch (const cubridge::error& e) {
      EXPECT_TRUE(e.is(cubridge::errc::io)) << e.what();
      EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
    }
  }
}

TEST(Compile, SameInputGivesTheSameBytes) {
  const auto a = cubridge::nvrtc_compile({.name = "scale.cu", .text = scale_source});
  const auto b = cubridge::nvrtc_compile({.name = "scale.cu", .text = scale_source});
  EXPECT_EQ(a.cubin, b.cubin);
}

}  // namespace
