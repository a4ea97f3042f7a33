#pragma once
// Shared helpers of the GPU tests: skip with a reason where there is no GPU, and the paths of
// the test kernels built from tests/kernels/test_kernels.cu.

#include <cubridge/core/detail/file_io.hpp>
#include <cubridge/core/device.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/module.hpp>

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace cubridge::testing {

/// Why GPU tests cannot run here, or empty when they can.
inline std::string gpu_unavailable_reason() {
  if (!driver::available()) return driver::unavailable_reason();
  if (device::count() == 0) return "the CUDA driver reports no device";
  return {};
}

inline const char* test_cubin_path() {
  return CUBRIDGE_TEST_CUBIN;
}  // sm_90
inline const char* test_cubin_other_path() {
  return CUBRIDGE_TEST_CUBIN_OTHER;
}  // sm_80
inline const char* test_ptx_path() {
  return CUBRIDGE_TEST_PTX;
}  // compute_90
inline const char* test_fatbin_path() {
  return CUBRIDGE_TEST_FATBIN;
}  // sm_80, sm_90, PTX

/// The bytes of a test image or source file, read as module::load_file reads an image.
inline std::vector<std::byte> read_bytes(const std::filesystem::path& path) {
  return detail::read_regular_file(path, detail::max_image_bytes, "test file");
}

}  // namespace cubridge::testing

/// First statement of every GPU test: skips it, with the reason, where there is no GPU.
#define CUBRIDGE_REQUIRE_GPU()                                                              \
  do {                                                                                      \
    if (const auto reason = ::cubridge::testing::gpu_unavailable_reason(); !reason.empty()) \
      GTEST_SKIP() << "no GPU: " << reason;                                                 \
  } while (false)

/// Fails the test if a Driver API call fails (for raw calls the tests make to cross-check).
#define CUBRIDGE_ASSERT_CU(call)          \
  do {                                    \
    const CUresult r_ = (call);           \
    ASSERT_EQ(r_, CUDA_SUCCESS) << #call; \
  } while (false)

namespace cubridge::testing {
/// True when CUBRIDGE_TEST_IN_PROCESS=1: tests that normally isolate themselves in a child
/// process run in this one instead (scripts/gpu-check runs each of them alone under
/// compute-sanitizer that way, rather than instrumenting a parent that only waits).
inline bool in_process() {
  const char* v = std::getenv("CUBRIDGE_TEST_IN_PROCESS");
  return v && std::string(v) == "1";
}
}  // namespace cubridge::testing

/// Runs `statement`, which ends the process (exit code 0 on success), in a child process (the
/// threadsafe death-test style re-executes the binary, so CUDA starts fresh there), or in this
/// process when cubridge::testing::in_process().
#define CUBRIDGE_EXPECT_CLEAN_EXIT(statement, stderr_regex)               \
  do {                                                                    \
    if (::cubridge::testing::in_process()) {                              \
      statement;                                                          \
    } else {                                                              \
      GTEST_FLAG_SET(death_test_style, "threadsafe");                     \
      EXPECT_EXIT(statement, ::testing::ExitedWithCode(0), stderr_regex); \
    }                                                                     \
  } while (false)
