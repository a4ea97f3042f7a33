#pragma once
// The hot-module GPU tests' common ground: the test versions of one module (tests/kernels/
// hot_kernels.cu, built for sm_90 as hot_<tag>.sm_90.cubin) and a fixture that serves version 1
// of it in a context of its own.
#include <cubridge/core/context.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/core/stream.hpp>
#include <cubridge/swap/hot_module.hpp>

#include "gpu_test.hpp"

#include <optional>
#include <string>
#include <vector>

namespace cubridge::testing {

/// The cubin of one test version: "v1", "v2", "missing", "changed", "small".
inline std::vector<std::byte> hot_image(const char* tag) {
  return read_bytes(std::string(CUBRIDGE_TEST_HOT_DIR) + "/hot_" + tag + ".sm_90.cubin");
}

/// One element of a driver buffer, read back to the host.
inline unsigned read_back(const driver_buffer<unsigned>& buffer, std::size_t index = 0) {
  unsigned value = 0;
  EXPECT_EQ(driver::api().cuMemcpy(reinterpret_cast<CUdeviceptr>(&value),
                                   buffer.address() + index * sizeof(unsigned), sizeof value),
            CUDA_SUCCESS);
  return value;
}

/// A context made current, the module "versions" loaded from v1, a stream and a 256-element
/// buffer.
class hot_module_fixture : public ::testing::Test {
 protected:
  void SetUp() override {
    CUBRIDGE_REQUIRE_GPU();
    if (device::get(0).capability().major != 9) GTEST_SKIP() << "test images are sm_90";
    ctx_.emplace(context::create(device::get(0)));
    current_.emplace(*ctx_);
    hot_.emplace(hot_module::load(*ctx_, "versions", hot_image("v1")));
    stream_.emplace(stream::create(*ctx_));
    out_.emplace(driver_buffer<unsigned>::allocate(*ctx_, 256));
  }
  /// Launches write_version over 256 threads on the fixture's stream and returns what the GPU
  /// wrote.
  unsigned run_write_version() {
    auto k = hot_->get_kernel("write_version");
    (void)k.launch({.block = {256}, .stream = *stream_}, out_->span());
    EXPECT_EQ(driver::api().cuCtxSynchronize(), CUDA_SUCCESS);
    return read_back(*out_, 255);
  }
  std::optional<context> ctx_;
  std::optional<scoped_current> current_;
  std::optional<hot_module> hot_;
  std::optional<stream> stream_;
  std::optional<driver_buffer<unsigned>> out_;
};

}  // namespace cubridge::testing
