// `cubridge fleet publish | status | rollback | watch`, the real binary run as a child against a
// real nats-server (tests/nats_server.hpp); the test plays the nodes' heartbeats.
#include "nats_server.hpp"
#include "fleet/nats.hpp"

#include <cubridge/core/detail/child_process.hpp>
#include <cubridge/update/bundle.hpp>
#include <cubridge/fleet/controller.hpp>
#include <cubridge/fleet/subjects.hpp>
#include <cubridge/update/rollback_request.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

namespace {

using namespace cubridge::fleet;
using namespace std::chrono_literals;
using cubridge::testing::nats_server;
using cubridge::testing::temp_dir;
using json = nlohmann::json;

struct run_result {
  int exit_code = -1;
  std::string out, err;
};

std::string read_text(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// `cubridge ARGS...` in `dir`, killed after 60 s (a hang is a failure, not a wait).
run_result run_tool(const std::vector<std::string>& args, const temp_dir& dir) {
  const auto out_path = dir.path / "out.txt", err_path = dir.path / "err.txt";
  const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  cubridge::detail::child_spec spec;
  spec.program = CUBRIDGE_TOOL_PATH;
  spec.args = args;
  spec.environment = cubridge::detail::current_environment();
  spec.fds = {{1, out}, {2, err}};
  spec.working_directory = dir.path;
  auto child = cubridge::detail::child_process::spawn(spec);
  ::close(out);
  ::close(err);
  run_result result;
  if (const auto ended = child.wait_for(60s); ended && ended->exited())
    result.exit_code = ended->exit_code;
  else
    ADD_FAILURE() << "cubridge did not exit within 60 s";
  result.out = read_text(out_path);
  result.err = read_text(err_path);
  return result;
}

std::chrono::sys_seconds now_seconds() {
  return std::chrono::floor<std::chrono::seconds>(std::chrono::system_clock::now());
}

struct FleetCli : ::testing::Test {
  nats_server server;
  temp_dir dir;
  cubridge::keypair keys = cubridge::generate_keypair();
  controller control{controller_options{server.url()}};
  detail::connection_ptr connection = detail::connect({server.url(), "nodes", false, false});
  detail::jetstream_ptr js = detail::jetstream(connection.get());

  void SetUp() override {
    cubridge::write_key_file(dir.path / "k.key", keys.secret_key);
    std::filesystem::copy_file(CUBRIDGE_TEST_CUBIN, dir.path / "filters.cubin");
  }
  void heartbeat(const std::string& node, std::map<std::string, std::uint64_t, std::less<>> v,
                 std::chrono::sys_seconds time = now_seconds(), std::string gpu = "sm_90") {
    cubridge::fleet::heartbeat beat;
    beat.node = node;
    beat.gpu = std::move(gpu);
    beat.interval = 5s;
    beat.time = time;
    beat.versions = std::move(v);
    const auto text = to_json(beat);
    detail::publish(js.get(), connection.get(), heartbeat_subject(node),
                    {reinterpret_cast<const std::byte*>(text.data()), text.size()}, "heartbeat");
  }
  std::string last(const std::string& stream, const std::string& subject) {
    const auto message = detail::last_message(js.get(), stream, subject);
    return message ? std::string(detail::message_text(message.get())) : std::string();
  }
};

TEST_F(FleetCli, PublishSignsAndReachesEveryNode) {
  const auto r = run_tool({"fleet", "publish", "filters.cubin", "--server", server.url(), "--key",
                           "k.key", "--version", "3"},
                          dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("published 'filters' v3"), std::string::npos) << r.out;
  const auto bundle = last(bundle_stream("filters"), bundle_subject_all("filters"));
  const auto verified =
      cubridge::verify_bundle({reinterpret_cast<const std::byte*>(bundle.data()), bundle.size()},
                              cubridge::trusted_keys{keys.public_key});
  EXPECT_EQ(verified.manifest.name, "filters");
  EXPECT_EQ(verified.version(), 3u);
  EXPECT_EQ(control.desired("filters", "all"), 3u);
}

TEST_F(FleetCli, CudaSourceIsCompiledForTheNodesGpu) {
  heartbeat("n1", {}, now_seconds(), "sm_80");  // the fleet's GPU, not the default sm_90
  std::filesystem::copy_file(CUBRIDGE_TEST_HOT_KERNELS, dir.path / "hot.cu");
  const auto r = run_tool({"fleet", "publish", "hot.cu", "--server", server.url(), "--key", "k.key",
                           "--version", "2", "--name", "hot"},
                          dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("compiled hot.cu for sm_80"), std::string::npos) << r.out;
  const auto bundle = last(bundle_stream("hot"), bundle_subject_all("hot"));
  const auto verified =
      cubridge::verify_bundle({reinterpret_cast<const std::byte*>(bundle.data()), bundle.size()},
                              cubridge::trusted_keys{keys.public_key});
  EXPECT_EQ(verified.manifest.target, "sm_80");
  EXPECT_EQ(verified.manifest.kind, cubridge::payload_kind::cubin);
}

TEST_F(FleetCli, NodesGetTheirOwnSubjectsAndWaitReportsSilence) {
  heartbeat("n1", {});
  const auto nodes = run_tool({"fleet", "publish", "filters.cubin", "--server", server.url(),
                               "--key", "k.key", "--version", "3", "--nodes", "a,b"},
                              dir);
  ASSERT_EQ(nodes.exit_code, 0) << nodes.err;
  EXPECT_NE(last(bundle_stream("filters"), bundle_subject_node("filters", "a")), "");
  EXPECT_NE(last(bundle_stream("filters"), bundle_subject_node("filters", "b")), "");
  EXPECT_EQ(last(bundle_stream("filters"), bundle_subject_all("filters")), "");
  EXPECT_EQ(control.desired("filters", "all"), std::nullopt);
  // n1 is live but runs no agent: --wait says so and fails.
  const auto wait = run_tool({"fleet", "publish", "filters.cubin", "--server", server.url(),
                              "--key", "k.key", "--version", "4", "--wait", "--window", "0.2"},
                             dir);
  EXPECT_EQ(wait.exit_code, 1) << wait.out;
  EXPECT_NE(wait.err.find("1 of 1 node(s) gave no result within 0.2 s"), std::string::npos)
      << wait.err;
}

TEST_F(FleetCli, StatusShowsNodesVersionsAndLag) {
  control.set_desired("filters", "all", 3);
  heartbeat("n1", {{"filters", 3}});
  heartbeat("n2", {{"filters", 2}}, now_seconds() - 120s);
  const auto r = run_tool({"fleet", "status", "--json", "--server", server.url()}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto status = json::parse(r.out);
  ASSERT_EQ(status["nodes"].size(), 2u);
  EXPECT_EQ(status["nodes"][0]["node"], "n1");
  EXPECT_EQ(status["nodes"][0]["live"], true);
  EXPECT_EQ(status["nodes"][0]["lag"]["filters"], 0);
  EXPECT_EQ(status["nodes"][1]["live"], false);
  EXPECT_EQ(status["nodes"][1]["versions"]["filters"], 2);
  EXPECT_EQ(status["nodes"][1]["lag"]["filters"], 1);
  EXPECT_GE(status["nodes"][1]["age_s"].get<int>(), 120);
  EXPECT_EQ(status["modules"][0]["desired_all"], 3);

  const auto table = run_tool({"fleet", "status", "--server", server.url()}, dir);
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("module filters: desired all v3"), std::string::npos) << table.out;
  const auto once = run_tool({"fleet", "watch", "--once", "--server", server.url()}, dir);
  ASSERT_EQ(once.exit_code, 0) << once.err;
  EXPECT_NE(once.out.find("n2"), std::string::npos) << once.out;
}

TEST_F(FleetCli, RollbackPublishesASignedRequest) {
  control.set_desired("filters", "all", 4);
  const auto r =
      run_tool({"fleet", "rollback", "filters", "--key", "k.key", "--server", server.url()}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto request =
      cubridge::verify_rollback_request(last(bundle_stream("filters"), rollback_subject("filters")),
                                        cubridge::trusted_keys{keys.public_key});
  EXPECT_EQ(request.from_version, 4u);
  EXPECT_EQ(control.desired("filters", "all"), std::nullopt);
}

TEST_F(FleetCli, CanaryWithoutAnswerHalts) {
  heartbeat("n1", {});
  heartbeat("n2", {});
  const auto r = run_tool({"fleet", "publish", "filters.cubin", "--server", server.url(), "--key",
                           "k.key", "--version", "5", "--canary", "1", "--window", "0.2"},
                          dir);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.err.find("halted: 0 of 1 canary results `applied` within 200 ms"), std::string::npos)
      << r.err;
  EXPECT_EQ(last(bundle_stream("filters"), bundle_subject_all("filters")), "");
  const auto status = run_tool({"fleet", "status", "--server", server.url()}, dir);
  EXPECT_NE(status.out.find("rollout of v5 HALTED"), std::string::npos) << status.out;
}

TEST_F(FleetCli, CanaryNeedsLiveNodes) {
  const auto r = run_tool({"fleet", "publish", "filters.cubin", "--server", server.url(), "--key",
                           "k.key", "--version", "5", "--canary", "2"},
                          dir);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("0 live node(s) for 2 canaries"), std::string::npos) << r.err;
}

TEST_F(FleetCli, UnreachableServerIsOneLineAndExit75) {
  const std::string dead = "nats://127.0.0.1:" + std::to_string(server.port());
  server.kill();
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"fleet", "status", "--server", dead},
           {"fleet", "publish", "filters.cubin", "--server", dead, "--key", "k.key", "--version",
            "3"},
           {"fleet", "rollback", "filters", "--key", "k.key", "--server", dead},
           {"fleet", "watch", "--once", "--server", dead}}) {
    const auto r = run_tool(args, dir);
    EXPECT_EQ(r.exit_code, 75) << args[1] << ": " << r.err;
    EXPECT_NE(r.err.find("CUBRIDGE_FLEET_UNREACHABLE"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

TEST_F(FleetCli, UsageErrors) {
  const auto both = run_tool({"fleet", "publish", "filters.cubin", "--server", server.url(),
                              "--canary", "1", "--nodes", "a"},
                             dir);
  EXPECT_EQ(both.exit_code, 64) << both.err;
  const auto no_key = run_tool(
      {"fleet", "publish", "filters.cubin", "--server", server.url(), "--canary", "1"}, dir);
  EXPECT_EQ(no_key.exit_code, 64) << no_key.err;
}

}  // namespace
