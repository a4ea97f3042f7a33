// `cubridge doctor` reports MPS (issue 15 item 5). The machines here have no MPS, so it is faked
// the way a user's environment would point at it: CUDA_MPS_PIPE_DIRECTORY names a temporary
// directory holding a FIFO named `control`. Without a driver that pipe decides (MPS detected);
// with one (the GPU machine, no MPS) the device attribute decides and outweighs the pipe.
// Checked in-process (diagnose, render_table) and through the built command's --json.
#include "doctor.hpp"
#include "temp_dir.hpp"

#include <cubridge/core/driver.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include <sys/stat.h>
#include <sys/wait.h>

namespace {

using cubridge::testing::temp_dir;

bool contains(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

// CUDA_MPS_PIPE_DIRECTORY set to a temporary directory with a FIFO `control`, for one test.
class FakedMpsPipe : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::mkfifo(control().c_str(), 0600), 0);
    if (const char* old = std::getenv("CUDA_MPS_PIPE_DIRECTORY")) previous_ = old;
    ::setenv("CUDA_MPS_PIPE_DIRECTORY", pipes_.path.c_str(), 1);
  }
  void TearDown() override {
    if (previous_)
      ::setenv("CUDA_MPS_PIPE_DIRECTORY", previous_->c_str(), 1);
    else
      ::unsetenv("CUDA_MPS_PIPE_DIRECTORY");
  }
  [[nodiscard]] std::filesystem::path control() const { return pipes_.path / "control"; }

  // What the report must say of the faked pipe, on this machine.
  void expect_faked_pipe_in(const nlohmann::json& report) const {
    ASSERT_TRUE(report.contains("mps")) << report.dump(2);
    const auto& m = report["mps"];
    EXPECT_EQ(m["pipe_directory"], pipes_.path.string());
    EXPECT_EQ(m["pipe_directory_source"], "CUDA_MPS_PIPE_DIRECTORY");
    EXPECT_EQ(m["control_pipe"], control().string());
    EXPECT_EQ(m["control_pipe_present"], true);
    EXPECT_EQ(m["environment"]["CUDA_MPS_PIPE_DIRECTORY"], pipes_.path.string());
    EXPECT_EQ(m["client_contexts_per_device"], 60);
    const auto meaning = m["meaning"].get<std::string>();
    if (!cubridge::driver::available()) {
      EXPECT_EQ(m["active"], true);
      EXPECT_EQ(m["decided_by"], "control_pipe");
      EXPECT_EQ(m["device_attribute"], "unknown");
      EXPECT_TRUE(
          m["device_attribute_detail"].get<std::string>().starts_with("unknown: no driver ("));
      EXPECT_TRUE(contains(meaning,
                           "a fatal fault in one client reaches every client on that "
                           "GPU, so neither a guest context nor the sandbox contains"))
          << meaning;
      EXPECT_TRUE(contains(meaning, "at most 60 client contexts per device")) << meaning;
    } else {
      EXPECT_EQ(m["decided_by"], "device_attribute");
      EXPECT_NE(m["device_attribute"], "unknown");
      for (const auto& dev : report["devices"]) EXPECT_TRUE(dev["mps_enabled"].is_boolean());
    }
  }

 private:
  temp_dir pipes_;
  std::optional<std::string> previous_;
};

TEST_F(FakedMpsPipe, ReportAndTableSayWhatTheFakedPipeMeans) {
  const auto report = cubridge::tool::diagnose();
  expect_faked_pipe_in(report);
  const auto table = cubridge::tool::render_table(report);
  if (!cubridge::driver::available()) {
    EXPECT_TRUE(contains(table,
                         "MPS               DETECTED (by control_pipe): device attribute "
                         "unknown: no driver ("))
        << table;
  }
  EXPECT_TRUE(contains(table, "control pipe " + control().string() + " present")) << table;
  EXPECT_TRUE(contains(table, report["mps"]["meaning"].get<std::string>())) << table;
}

TEST_F(FakedMpsPipe, TheCommandsJsonCarriesIt) {
  // popen's shell inherits this process's environment, the faked pipe directory included.
  const std::string command = std::string(CUBRIDGE_TOOL_PATH) + " doctor --json 2>/dev/null";
  FILE* out = ::popen(command.c_str(), "r");
  ASSERT_NE(out, nullptr);
  std::string text;
  std::array<char, 4096> buffer{};
  while (const auto n = std::fread(buffer.data(), 1, buffer.size(), out))
    text.append(buffer.data(), n);
  const int status = ::pclose(out);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_TRUE(WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 69) << WEXITSTATUS(status);
  expect_faked_pipe_in(nlohmann::json::parse(text));
}

TEST(Doctor, WithoutAPipeNoMpsIsReportedAndOldReportsStillRender) {
  temp_dir empty;
  const char* old = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  const std::optional<std::string> previous = old ? std::optional<std::string>(old) : std::nullopt;
  ::setenv("CUDA_MPS_PIPE_DIRECTORY", empty.path.c_str(), 1);
  auto report = cubridge::tool::diagnose();
  previous ? ::setenv("CUDA_MPS_PIPE_DIRECTORY", previous->c_str(), 1)
           : ::unsetenv("CUDA_MPS_PIPE_DIRECTORY");
  EXPECT_EQ(report["mps"]["control_pipe_present"], false);
  if (!cubridge::driver::available()) {
    EXPECT_EQ(report["mps"]["active"], false);
    EXPECT_EQ(report["mps"]["decided_by"], "none");
    EXPECT_TRUE(contains(cubridge::tool::render_table(report),
                         "MPS               not detected "
                         "(no signal)"));
  }
  // A report from before MPS was reported (python's render_doctor takes any) renders without it.
  report.erase("mps");
  EXPECT_FALSE(contains(cubridge::tool::render_table(report), "MPS "));
}

}  // namespace
