// What guest contexts and the sandbox do under NVIDIA MPS (isolation/mps_policy.hpp), with the
// detection faked: the machines here have no MPS, so the process's probe (core/mps.hpp) is the
// test's, and warnings go to a sink of the test's. No GPU: a refusing guest_context::create
// throws before it touches the driver.
#include "temp_dir.hpp"

#include <cubridge/core/device.hpp>
#include <cubridge/core/mps.hpp>
#include <cubridge/isolation/guest_context.hpp>
#include <cubridge/isolation/mps_policy.hpp>
#include <cubridge/isolation/sandbox.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include <sys/stat.h>

namespace {

using cubridge::mps_active_error;
using cubridge::mps_policy;

bool contains(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

// Installs a faked probe (the attribute says `attribute`, nullopt: unknown; no environment; the
// pipe directory an empty temporary one) and a sink that keeps the lines; restores both.
class MpsPolicy : public ::testing::Test {
 protected:
  void fake(std::optional<bool> attribute) {
    cubridge::mps_probe probe;
    probe.environment = [this](const char* name) -> std::optional<std::string> {
      if (std::string_view(name) == "CUDA_MPS_PIPE_DIRECTORY" && pipe_directory_in_environment_)
        return pipes_.path.string();
      return std::nullopt;
    };
    probe.device_attribute = [this, attribute](int device, std::string& why) {
      asked_.push_back(device);
      if (!attribute) why = "no driver (faked)";
      return attribute;
    };
    probe.default_pipe_directory = "/nonexistent/cubridge-test-mps";
    cubridge::set_mps_probe(std::move(probe));
  }
  void SetUp() override {
    previous_probe_ = cubridge::set_mps_probe(cubridge::system_mps_probe());
    previous_sink_ = cubridge::set_mps_warning_sink(
        [this](std::string_view line) { lines_.emplace_back(line); });
  }
  void TearDown() override {
    cubridge::set_mps_probe(std::move(previous_probe_));
    cubridge::set_mps_warning_sink(std::move(previous_sink_));
  }

  cubridge::testing::temp_dir pipes_;
  bool pipe_directory_in_environment_ = false;
  std::vector<int> asked_;          // the devices the attribute was read for
  std::vector<std::string> lines_;  // what the warning sink got

 private:
  cubridge::mps_probe previous_probe_;
  cubridge::mps_warning_sink previous_sink_;
};

TEST_F(MpsPolicy, RefuseThrowsTheTypedErrorNamingComponentDeviceAndWhy) {
  fake(true);
  try {
    cubridge::enforce_mps_policy(mps_policy::refuse, 2, "sandbox 'libfft.so'");
    FAIL() << "no exception";
  } catch (const mps_active_error& e) {
    EXPECT_TRUE(e.is(cubridge::isolation_errc::mps_active));
    EXPECT_EQ(e.code_name(), "CUBRIDGE_MPS_ACTIVE");
    EXPECT_EQ(e.call(), "enforce_mps_policy");
    EXPECT_EQ(e.component(), "sandbox 'libfft.so'");
    EXPECT_EQ(e.status().device, 2);
    EXPECT_TRUE(e.status().active);
    const std::string what = e.what();
    EXPECT_TRUE(contains(what,
                         "sandbox 'libfft.so' refused on device 2: NVIDIA MPS serves "
                         "device 2 (CU_DEVICE_ATTRIBUTE_MPS_ENABLED is 1)"))
        << what;
    EXPECT_TRUE(contains(what, "a fatal fault in one client reaches every client on that GPU"))
        << what;
    EXPECT_TRUE(contains(what, "mps_policy::warn or allow")) << what;
  }
  EXPECT_EQ(asked_, std::vector<int>{2});
  EXPECT_TRUE(lines_.empty());
}

TEST_F(MpsPolicy, WarnWritesOneLineAndGoesOn) {
  fake(true);
  EXPECT_NO_THROW(cubridge::enforce_mps_policy(mps_policy::warn, 0, "guest context 'vendor'"));
  ASSERT_EQ(lines_.size(), 1u);
  EXPECT_TRUE(
      lines_[0].starts_with("cubridge: warning: guest context 'vendor' on device 0 does "
                            "not contain faults: NVIDIA MPS serves device 0"))
      << lines_[0];
  EXPECT_FALSE(contains(lines_[0], "\n")) << lines_[0];
}

TEST_F(MpsPolicy, WarnNamesTheControlPipeWhenThatDecided) {
  ASSERT_EQ(::mkfifo((pipes_.path / "control").c_str(), 0600), 0);
  pipe_directory_in_environment_ = true;
  fake(std::nullopt);
  cubridge::enforce_mps_policy(mps_policy::warn, 0, "sandbox 'lib'");
  ASSERT_EQ(lines_.size(), 1u);
  EXPECT_TRUE(contains(lines_[0], "control daemon listens at " +
                                      (pipes_.path / "control").string() +
                                      " (the device attribute is unknown: no driver (faked))"))
      << lines_[0];
}

TEST_F(MpsPolicy, AllowIsSilentAndDoesNotEvenDetect) {
  fake(true);
  EXPECT_NO_THROW(cubridge::enforce_mps_policy(mps_policy::allow, 0, "guest context 'g'"));
  EXPECT_TRUE(asked_.empty());
  EXPECT_TRUE(lines_.empty());
}

TEST_F(MpsPolicy, WithoutMpsNoPolicySaysAnything) {
  fake(false);
  for (const auto policy : {mps_policy::allow, mps_policy::warn, mps_policy::refuse})
    EXPECT_NO_THROW(cubridge::enforce_mps_policy(policy, 0, "guest context 'g'"));
  fake(std::nullopt);  // no driver and no control pipe: nothing says MPS
  EXPECT_NO_THROW(cubridge::enforce_mps_policy(mps_policy::refuse, 0, "guest context 'g'"));
  EXPECT_TRUE(lines_.empty());
}

TEST_F(MpsPolicy, AStatusDetectedAlreadyIsUsedAsIs) {
  cubridge::mps_status status;
  status.active = true;
  status.device = 5;
  status.meaning = "faked by the test";
  EXPECT_THROW(cubridge::enforce_mps_policy(mps_policy::refuse, status, "x"), mps_active_error);
  cubridge::enforce_mps_policy(mps_policy::warn, status, "x");
  EXPECT_EQ(lines_, std::vector<std::string>{
                        "cubridge: warning: x on device 5 does not contain faults: faked by the "
                        "test"});
  EXPECT_TRUE(asked_.empty());
}

TEST_F(MpsPolicy, TheDefaultSinkWritesTheLineToStderr) {
  fake(true);
  cubridge::set_mps_warning_sink({});  // the default again
  ::testing::internal::CaptureStderr();
  cubridge::enforce_mps_policy(mps_policy::warn, 0, "guest context 'g'");
  const std::string err = ::testing::internal::GetCapturedStderr();
  // Through the process's logger: "<RFC 3339 time> cubridge warning: <the line's message>".
  EXPECT_NE(err.find(" cubridge warning: guest context 'g' on device 0"), std::string::npos) << err;
  EXPECT_TRUE(err.ends_with("\n")) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
}

TEST_F(MpsPolicy, GuestContextCreateRefusesBeforeMakingAnything) {
  fake(true);
  cubridge::guest_options options;
  options.name = "vendor-fft";
  options.mps = mps_policy::refuse;
  try {
    (void)cubridge::guest_context::create(cubridge::device::from_native(0), options);
    FAIL() << "no exception";
  } catch (const mps_active_error& e) {
    EXPECT_EQ(e.component(), "guest context 'vendor-fft'");
    EXPECT_TRUE(contains(e.what(), "guest context 'vendor-fft' refused on device 0")) << e.what();
  }
  EXPECT_EQ(asked_, std::vector<int>{0});
}

TEST_F(MpsPolicy, SandboxStartRefusesBeforeStartingAWorker) {
  fake(true);
  cubridge::sandbox_options options;
  options.library = "/nonexistent/libvendor.so";  // never reached: the policy comes first
  options.worker = "/nonexistent/cubridge-sandbox-worker";
  options.name = "vendor";
  options.device = 3;
  options.mps = mps_policy::refuse;
  try {
    (void)cubridge::sandbox::start(options);
    FAIL() << "no exception";
  } catch (const mps_active_error& e) {
    EXPECT_EQ(e.component(), "sandbox 'vendor'");
    EXPECT_TRUE(contains(e.what(), "sandbox 'vendor' refused on device 3")) << e.what();
  }
  EXPECT_EQ(asked_, std::vector<int>{3});
  // A worker without CUDA is no MPS client: not even looked at.
  options.initialize_cuda = false;
  EXPECT_THROW((void)cubridge::sandbox::start(options), cubridge::sandbox_error);
  EXPECT_EQ(asked_, std::vector<int>{3});
}

TEST(MpsPolicyNames, Spelling) {
  EXPECT_EQ(cubridge::to_string(mps_policy::allow), "allow");
  EXPECT_EQ(cubridge::to_string(mps_policy::warn), "warn");
  EXPECT_EQ(cubridge::to_string(mps_policy::refuse), "refuse");
  EXPECT_EQ(cubridge::to_string(cubridge::isolation_errc::mps_active), "CUBRIDGE_MPS_ACTIVE");
  // Guest contexts and sandboxes warn unless told otherwise.
  EXPECT_EQ(cubridge::guest_options{}.mps, mps_policy::warn);
  EXPECT_EQ(cubridge::sandbox_options{}.mps, mps_policy::warn);
}

}  // namespace
