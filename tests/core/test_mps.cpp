// MPS detection (core/mps.hpp) with faked inputs: the machines here have no MPS, so the
// environment, the pipe directory (a temporary one holding a FIFO or a socket named `control`)
// and the device attribute are the test's. One test reads the real inputs and expects what this
// machine has: no driver here, no MPS on the GPU machine.
#include "temp_dir.hpp"

#include <cubridge/core/device.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/mps.hpp>

#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

namespace {

using cubridge::mps_attribute;
using cubridge::mps_probe;
using cubridge::mps_signal;
using cubridge::testing::temp_dir;

bool contains(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

// A probe over a fixed environment and a fixed attribute (nullopt: "no driver (faked)"), whose
// default pipe directory is `default_pipes` (never the real /tmp/nvidia-mps).
mps_probe fake_probe(std::map<std::string, std::string> env, std::optional<bool> attribute,
                     const std::filesystem::path& default_pipes, int* asked_device = nullptr) {
  mps_probe probe;
  probe.environment = [env](const char* name) -> std::optional<std::string> {
    const auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
  probe.device_attribute = [attribute, asked_device](int device, std::string& why) {
    if (asked_device) *asked_device = device;
    if (!attribute) why = "no driver (faked)";
    return attribute;
  };
  probe.default_pipe_directory = default_pipes;
  return probe;
}

void make_fifo(const std::filesystem::path& path) {
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0) << path;
}

TEST(Mps, NoSignalMeansNoMps) {
  temp_dir pipes;
  const auto s = cubridge::detect_mps(0, fake_probe({}, std::nullopt, pipes.path));
  EXPECT_FALSE(s.active);
  EXPECT_EQ(s.decided_by, mps_signal::none);
  EXPECT_EQ(s.attribute, mps_attribute::unknown);
  EXPECT_EQ(s.attribute_detail, "unknown: no driver (faked)");
  EXPECT_EQ(s.pipe_directory, pipes.path);
  EXPECT_FALSE(s.pipe_directory_from_environment);
  EXPECT_FALSE(s.control_pipe_present);
  EXPECT_EQ(s.control_pipe(), pipes.path / "control");
  EXPECT_TRUE(s.environment.empty());
  EXPECT_TRUE(
      contains(s.meaning, "no MPS seen: no control pipe at " + (pipes.path / "control").string()))
      << s.meaning;
}

TEST(Mps, ControlFifoInThePipeDirectoryOfTheEnvironmentMeansMps) {
  temp_dir pipes, unused_default;
  make_fifo(pipes.path / "control");
  const auto s =
      cubridge::detect_mps(1, fake_probe({{"CUDA_MPS_PIPE_DIRECTORY", pipes.path.string()},
                                          {"CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"}},
                                         std::nullopt, unused_default.path));
  EXPECT_TRUE(s.active);
  EXPECT_EQ(s.decided_by, mps_signal::control_pipe);
  EXPECT_EQ(s.device, 1);
  EXPECT_EQ(s.pipe_directory, pipes.path);
  EXPECT_TRUE(s.pipe_directory_from_environment);
  EXPECT_TRUE(s.control_pipe_present);
  ASSERT_EQ(s.environment.size(), 2u);  // in the order of mps_environment_variables
  EXPECT_EQ(s.environment[0].name, "CUDA_MPS_PIPE_DIRECTORY");
  EXPECT_EQ(s.environment[0].value, pipes.path.string());
  EXPECT_EQ(s.environment[1].name, "CUDA_MPS_LOG_DIRECTORY");
  EXPECT_EQ(s.environment[1].value, "/var/log/nvidia-mps");
  EXPECT_TRUE(contains(s.meaning, "control daemon listens at " + s.control_pipe().string()))
      << s.meaning;
  EXPECT_TRUE(contains(s.meaning, "at most 60 client contexts per device")) << s.meaning;
  EXPECT_TRUE(contains(s.meaning, "a fatal fault in one client reaches every client on that GPU"))
      << s.meaning;
  EXPECT_TRUE(contains(s.meaning, "neither a guest context nor the sandbox contains a fault"))
      << s.meaning;
}

TEST(Mps, ControlFifoInTheDefaultPipeDirectoryMeansMps) {
  temp_dir pipes;
  make_fifo(pipes.path / "control");
  // An empty CUDA_MPS_PIPE_DIRECTORY counts as unset.
  const auto s = cubridge::detect_mps(
      0, fake_probe({{"CUDA_MPS_PIPE_DIRECTORY", ""}}, std::nullopt, pipes.path));
  EXPECT_TRUE(s.active);
  EXPECT_FALSE(s.pipe_directory_from_environment);
  EXPECT_EQ(s.pipe_directory, pipes.path);
}

TEST(Mps, ControlSocketMeansMps) {
  // Newer daemons listen on a UNIX socket named `control`.
  temp_dir pipes;
  const auto path = (pipes.path / "control").string();
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  ASSERT_LT(path.size(), sizeof address.sun_path);
  path.copy(address.sun_path, path.size());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address), 0);
  const auto s = cubridge::detect_mps(0, fake_probe({}, std::nullopt, pipes.path));
  ::close(fd);
  EXPECT_TRUE(s.active);
  EXPECT_EQ(s.decided_by, mps_signal::control_pipe);
}

TEST(Mps, PlainFileOrDirectoryNamedControlIsNoDaemon) {
  temp_dir file_dir, dir_dir;
  cubridge::testing::write_text(file_dir.path / "control", "not a pipe");
  std::filesystem::create_directory(dir_dir.path / "control");
  for (const auto& dir : {file_dir.path, dir_dir.path}) {
    const auto s = cubridge::detect_mps(0, fake_probe({}, std::nullopt, dir));
    EXPECT_FALSE(s.active) << dir;
    EXPECT_FALSE(s.control_pipe_present) << dir;
  }
}

TEST(Mps, VariablesAloneDecideNothing) {
  temp_dir pipes;
  const auto s =
      cubridge::detect_mps(0, fake_probe({{"CUDA_MPS_PIPE_DIRECTORY", pipes.path.string()},
                                          {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "50"}},
                                         std::nullopt, "/nonexistent"));
  EXPECT_FALSE(s.active);
  EXPECT_EQ(s.decided_by, mps_signal::none);
  ASSERT_EQ(s.environment.size(), 2u);
  EXPECT_EQ(s.environment[1].name, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
  EXPECT_TRUE(contains(s.meaning, "MPS variables are set but no daemon listens")) << s.meaning;
}

TEST(Mps, EnabledAttributeMeansMpsAndIsAskedForTheDevice) {
  temp_dir pipes;
  int asked = -1;
  const auto s = cubridge::detect_mps(3, fake_probe({}, true, pipes.path, &asked));
  EXPECT_EQ(asked, 3);
  EXPECT_TRUE(s.active);
  EXPECT_EQ(s.decided_by, mps_signal::device_attribute);
  EXPECT_EQ(s.attribute, mps_attribute::enabled);
  EXPECT_EQ(s.attribute_detail, "enabled");
  EXPECT_FALSE(s.control_pipe_present);
  EXPECT_TRUE(contains(s.meaning,
                       "NVIDIA MPS serves device 3 (CU_DEVICE_ATTRIBUTE_MPS_ENABLED "
                       "is 1): the MPS server takes at most 60"))
      << s.meaning;
}

TEST(Mps, DisabledAttributeOutweighsAControlPipe) {
  // A daemon this process is not a client of (another user's, a stale pipe) serves nothing here.
  temp_dir pipes;
  make_fifo(pipes.path / "control");
  const auto s = cubridge::detect_mps(0, fake_probe({}, false, pipes.path));
  EXPECT_FALSE(s.active);
  EXPECT_EQ(s.decided_by, mps_signal::device_attribute);
  EXPECT_EQ(s.attribute, mps_attribute::disabled);
  EXPECT_TRUE(s.control_pipe_present);
  EXPECT_TRUE(contains(s.meaning, "no MPS on device 0 (CU_DEVICE_ATTRIBUTE_MPS_ENABLED is 0)"))
      << s.meaning;
}

TEST(Mps, EmptyProbeReadsNothing) {
  cubridge::mps_probe probe;
  temp_dir pipes;
  probe.default_pipe_directory = pipes.path;
  const auto s = cubridge::detect_mps(0, probe);
  EXPECT_FALSE(s.active);
  EXPECT_TRUE(s.environment.empty());
  EXPECT_EQ(s.attribute_detail, "unknown: not asked (the probe has no attribute reader)");
}

TEST(Mps, ProcessProbeIsReplaceable) {
  temp_dir pipes;
  auto previous = cubridge::set_mps_probe(fake_probe({}, true, pipes.path));
  const auto faked = cubridge::detect_mps(2);
  auto mine = cubridge::set_mps_probe(std::move(previous));
  EXPECT_TRUE(faked.active);
  EXPECT_EQ(faked.device, 2);
  // What was set came back.
  EXPECT_EQ(mine.default_pipe_directory, pipes.path);
  std::string why;
  EXPECT_EQ(mine.device_attribute(0, why), std::optional<bool>(true));
}

TEST(Mps, SystemProbeAsksTheDriver) {
  std::string why;
  const auto value = cubridge::system_mps_probe().device_attribute(0, why);
  if (!cubridge::driver::available()) {
    EXPECT_FALSE(value.has_value());
    EXPECT_TRUE(why.starts_with("no driver (")) << why;
    EXPECT_TRUE(contains(why, cubridge::driver::unavailable_reason())) << why;
    const auto s = cubridge::detect_mps(0, cubridge::system_mps_probe());
    EXPECT_TRUE(s.attribute_detail.starts_with("unknown: no driver (")) << s.attribute_detail;
    return;
  }
  if (cubridge::device::count() == 0) GTEST_SKIP() << "the CUDA driver reports no device";
  ASSERT_TRUE(value.has_value()) << why;  // CUDA 13 drivers know CU_DEVICE_ATTRIBUTE_MPS_ENABLED
  const auto out_of_range = cubridge::system_mps_probe().device_attribute(4096, why);
  EXPECT_FALSE(out_of_range.has_value());
  EXPECT_TRUE(why.starts_with("no device 4096 (cuDeviceGet CUDA_ERROR_INVALID_DEVICE")) << why;
}

TEST(Mps, Names) {
  using cubridge::to_string;
  EXPECT_EQ(to_string(mps_attribute::unknown), "unknown");
  EXPECT_EQ(to_string(mps_attribute::enabled), "enabled");
  EXPECT_EQ(to_string(mps_attribute::disabled), "disabled");
  EXPECT_EQ(to_string(mps_signal::none), "none");
  EXPECT_EQ(to_string(mps_signal::device_attribute), "device_attribute");
  EXPECT_EQ(to_string(mps_signal::control_pipe), "control_pipe");
  EXPECT_EQ(cubridge::mps_client_contexts_per_device, 60);
}

}  // namespace
