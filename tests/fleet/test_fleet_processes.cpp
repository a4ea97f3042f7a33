// The fleet with real processes: a real nats-server (tests/nats_server.hpp) and node processes
// (tests/fleet/fleet_node.cpp: a fleet_agent over a recording sink that keeps its versions in a
// file), driven by the control side (fleet_controller.hpp). Every wait is on a condition (a
// node's event line, a record in the result stream) with a deadline.
//
// Covered in-process only, by test_fleet_agent: a bundle for another module (name_mismatch),
// forged and replayed rollback requests, another node's canary bundle; here, through processes:
// duplicate, replayed (after a restart), older, tampered, unsigned, wrongly signed, oversized;
// a node killed after the promote (a duplicate after the restart) and before it (resumed).
#include "fleet/fleet_node_process.hpp"
#include "nats_server.hpp"
#include "update/source_bundles.hpp"

#include <cubridge/fleet/controller.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
using cubridge::gate_outcome;
using cubridge::fleet::controller;
using cubridge::fleet::result_record;
using cubridge::testing::eventually;
using cubridge::testing::fleet_node_process;

// Whether `line` has the words of `pattern`, "*" standing for any one word. A record of a bundle
// that did not verify says serving_version 0 (the agent knows no module for it yet).
bool matches(const std::string& line, const std::string& pattern) {
  std::istringstream got(line), wanted(pattern);
  std::string a, b;
  while (wanted >> b)
    if (!(got >> a) || (b != "*" && a != b)) return false;
  return !(got >> a);
}

class FleetProcesses : public ::testing::Test {
 protected:
  const std::string module = "filters";
  cubridge::testing::nats_server server;
  cubridge::testing::temp_dir dir;
  cubridge::keypair keys = cubridge::generate_keypair();
  std::filesystem::path key_file = dir.path / "trusted.pub";
  std::vector<std::unique_ptr<fleet_node_process>> nodes;
  std::unique_ptr<controller> control;

  void SetUp() override {
    cubridge::write_key_file(key_file, keys.public_key);
    connect();
  }
  void connect() {
    control = std::make_unique<controller>(cubridge::fleet::controller_options{server.url()});
  }

  // Starts nodes n<first>..n<first+count-1> and waits until each is connected.
  void start_nodes(std::size_t count, const std::vector<std::string>& extra = {}) {
    const auto first = nodes.size();
    for (std::size_t i = 0; i < count; ++i) {
      const auto number = first + i + 1;
      nodes.push_back(std::make_unique<fleet_node_process>(
          (number < 10 ? "n0" : "n") + std::to_string(number), dir.path));
      nodes.back()->start(server.url(), key_file, module, extra);
    }
    for (std::size_t i = first; i < nodes.size(); ++i)
      ASSERT_TRUE(nodes[i]->wait_line("ready")) << nodes[i]->id() << " " << nodes[i]->exit_text();
  }
  std::vector<std::string> ids() const {
    std::vector<std::string> out;
    for (const auto& n : nodes) out.push_back(n->id());
    return out;
  }
  std::vector<std::byte> bundle(std::uint64_t version, std::size_t padding = 0) const {
    return cubridge::testing::source_bundle(module, version, keys.secret_key, "sm_90", padding);
  }
  // Publishes `version` to every node and waits for every node's record of it.
  std::vector<result_record> roll_out(std::uint64_t version) {
    control->publish(bundle(version), module);
    control->set_desired(module, "all", version);
    return control->wait_for_results(module, version, ids(), 60s);
  }
  static bool all_applied(const std::vector<result_record>& results, std::size_t count) {
    return results.size() == count &&
           std::all_of(results.begin(), results.end(),
                       [](const result_record& r) { return r.outcome == gate_outcome::applied; });
  }
};

TEST_F(FleetProcesses, RolloutToTwentyNodes) {
  start_nodes(20);
  const auto results = roll_out(1);
  ASSERT_EQ(results.size(), 20u);
  for (const auto& r : results) {
    EXPECT_EQ(r.outcome, gate_outcome::applied) << r.node << ": " << r.reason << " " << r.detail;
    EXPECT_EQ(r.serving_version, 1u);
  }
  for (const auto& n : nodes) {
    EXPECT_EQ(n->serving().first, 1u) << n->id();
    EXPECT_EQ(n->count_lines("apply "), 1u) << n->id();
  }
  // The status view, from the heartbeats: twenty live nodes, each serving v1.
  EXPECT_TRUE(eventually([&] {
    const auto seen = control->nodes();
    return seen.size() == 20 && std::all_of(seen.begin(), seen.end(), [&](const auto& s) {
             const auto v = s.beat.versions.find(module);
             return s.live && v != s.beat.versions.end() && v->second == 1;
           });
  })) << "the heartbeats never showed 20 live nodes at v1";
}

TEST_F(FleetProcesses, ACanaryFailureHaltsTheRestAndRollsTheCanariesBack) {
  start_nodes(1);
  start_nodes(1, {"--fail-version", "2"});  // n2's smoke test fails for v2
  start_nodes(2);
  ASSERT_TRUE(all_applied(roll_out(1), 4));
  ASSERT_TRUE(eventually([&] {
    const auto seen = control->nodes();
    return seen.size() == 4 &&
           std::all_of(seen.begin(), seen.end(), [](const auto& s) { return s.live; });
  }));
  cubridge::fleet::canary_policy policy;
  policy.canaries = 2;
  policy.window = 60s;
  const auto report = control->rollout(bundle(2), module, 2, policy, keys.secret_key);
  ASSERT_FALSE(report.completed);
  EXPECT_EQ(report.canaries, (std::vector<std::string>{"n01", "n02"}));
  EXPECT_NE(report.halt_reason.find("canary n02 failed v2"), std::string::npos)
      << report.halt_reason;
  EXPECT_EQ(report.rolled_back, std::vector<std::string>{"n01"});
  // n01 handles the rollback request after the bundle (stream order): rolled back to v1 when it
  // had applied v2, refused (version_mismatch) when the purge came before it fetched v2.
  ASSERT_TRUE(eventually([&] {
    return nodes[0]->has_line("record") && (nodes[0]->has_line("rolled_back 1") ||
                                            nodes[0]->lines().back().ends_with("version_mismatch"));
  }));
  for (const auto& n : nodes) EXPECT_EQ(n->serving().first, 1u) << n->id();
  EXPECT_TRUE(nodes[1]->has_line("failed 2"));
  // The rest never saw v2.
  EXPECT_FALSE(nodes[2]->has_line("apply 2"));
  EXPECT_FALSE(nodes[3]->has_line("apply 2"));
  const auto modules = control->modules();
  ASSERT_EQ(modules.size(), 1u);
  EXPECT_EQ(modules[0].halted_version, 2u);
  EXPECT_EQ(modules[0].desired_all, 1u);
}

TEST_F(FleetProcesses, ANodeKilledMidApplyConvergesAfterRestart) {
  // The server redelivers an unacknowledged message after the ack wait (1 s here).
  start_nodes(1, {"--apply-delay-ms", "600000", "--ack-wait-ms", "1000"});
  auto& node = *nodes[0];
  control->publish(bundle(1), module);
  ASSERT_TRUE(node.wait_line("promoted 1"));  // in the sink, before the record and the ack
  node.kill();
  EXPECT_TRUE(control->last_results(module).empty());  // no record went out
  node.start(server.url(), key_file, module, {"--ack-wait-ms", "1000"});
  const auto results = control->wait_for_results(module, 1, ids(), 60s);
  ASSERT_EQ(results.size(), 1u);
  // Delivered again; the replay state makes it a duplicate: the sink is not called again.
  EXPECT_EQ(results[0].outcome, gate_outcome::duplicate) << results[0].reason;
  EXPECT_EQ(results[0].serving_version, 1u);
  EXPECT_EQ(node.count_lines("apply "), 0u);
  EXPECT_EQ(node.serving().first, 1u);
  // And it goes on with the next version.
  ASSERT_TRUE(all_applied(roll_out(2), 1));
  EXPECT_EQ(node.serving().first, 2u);
}

TEST_F(FleetProcesses, ANodeKilledBetweenRecordingAndApplyingConvergesAfterRestart) {
  start_nodes(1, {"--ack-wait-ms", "1000"});
  auto& node = *nodes[0];
  ASSERT_TRUE(all_applied(roll_out(1), 1));
  node.stop();
  node.start(server.url(), key_file, module,
             {"--stall-before-apply-ms", "600000", "--ack-wait-ms", "1000"});
  ASSERT_TRUE(node.wait_line("ready")) << node.exit_text();
  control->publish(bundle(2), module);
  // The sink was called: v2 is in the replay state (pending), not promoted.
  ASSERT_TRUE(node.wait_line("apply 2")) << node.exit_text();
  node.kill();
  EXPECT_EQ(node.serving().first, 1u);
  node.start(server.url(), key_file, module, {"--ack-wait-ms", "1000"});
  // Delivered again, serving v1: the interrupted apply is resumed, not refused as a replay.
  const auto results = control->wait_for_results(module, 2, ids(), 60s);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].outcome, gate_outcome::applied)
      << results[0].reason << ": " << results[0].detail;
  EXPECT_EQ(results[0].serving_version, 2u);
  EXPECT_EQ(node.count_lines("promoted 2"), 1u);
  EXPECT_EQ(node.serving().first, 2u);
  // Settled: the same bundle again changes nothing.
  control->publish(bundle(2), module);
  EXPECT_TRUE(eventually([&] {
    const auto lines = node.lines();
    return std::any_of(lines.begin(), lines.end(), [](const std::string& line) {
      return matches(line, "record * duplicate 2 2 replayed_version");
    });
  })) << node.lines().back();
  EXPECT_EQ(node.count_lines("apply "), 1u);
}

TEST_F(FleetProcesses, TheServerKilledAndRestartedWithItsStoreEveryNodeConverges) {
  start_nodes(3);
  ASSERT_TRUE(all_applied(roll_out(1), 3));
  control->publish(bundle(2), module);  // stored (the publish waits for the stream's ack)
  control.reset();
  server.kill();
  for (const auto& n : nodes) EXPECT_TRUE(n->alive()) << n->id();  // they serve on
  server.start();
  connect();
  // The store was kept: the v1 records are still there; every node reaches v2 by itself.
  EXPECT_GE(control->last_results(module).size(), 3u);
  const auto results = control->wait_for_results(module, 2, ids(), 90s);
  ASSERT_TRUE(all_applied(results, 3));
  ASSERT_TRUE(all_applied(roll_out(3), 3));
  for (const auto& n : nodes) EXPECT_EQ(n->serving().first, 3u) << n->id();
}

TEST_F(FleetProcesses, ALateJoinerConverges) {
  start_nodes(2);
  ASSERT_TRUE(all_applied(roll_out(1), 2));
  ASSERT_TRUE(all_applied(roll_out(2), 2));
  start_nodes(1);  // joins after both rollouts: gets the current bundle only
  const auto results = control->wait_for_results(module, 2, std::vector<std::string>{"n03"}, 60s);
  ASSERT_TRUE(all_applied(results, 1));
  EXPECT_EQ(nodes[2]->serving().first, 2u);
  EXPECT_EQ(nodes[2]->count_lines("apply "), 1u);
}

TEST_F(FleetProcesses, BadMessagesAreRefusedAndChangeNothing) {
  start_nodes(1, {"--max-bundle-bytes", "65536"});
  auto& node = *nodes[0];
  ASSERT_TRUE(all_applied(roll_out(2), 1));
  const cubridge::keypair stranger = cubridge::generate_keypair();
  auto tampered = bundle(3);
  tampered[tampered.size() - 70] ^= std::byte{1};  // the payload
  auto unsigned_bundle = bundle(3);
  std::fill(unsigned_bundle.end() - 64, unsigned_bundle.end(), std::byte{0});
  const std::vector<std::pair<std::vector<std::byte>, std::string>> cases = {
      {bundle(2), "duplicate 2 2 replayed_version"},
      {bundle(1), "refused 1 2 older_version"},
      {tampered, "refused 0 * payload_mismatch"},
      {unsigned_bundle, "refused 0 * unsigned_bundle"},
      {cubridge::testing::source_bundle(module, 3, stranger.secret_key), "refused 0 * unknown_key"},
      {bundle(3, 100 << 10), "refused 0 * too_large"},
  };
  std::size_t record = 1;
  for (const auto& [message, expected] : cases) {
    control->publish(message, module);
    ++record;
    ASSERT_TRUE(node.wait_line("record " + std::to_string(record) + " "))
        << expected << ": " << node.exit_text();
    EXPECT_TRUE(matches(node.lines().back(), "record " + std::to_string(record) + " " + expected))
        << expected << "; got " << node.lines().back();
  }
  EXPECT_EQ(node.count_lines("apply "), 1u);
  EXPECT_EQ(node.serving(), (std::pair<std::uint64_t, std::uint64_t>{2, 0}));
  // Replayed after a restart (the replay state is on disk): still a duplicate, nothing applied.
  node.stop();
  EXPECT_EQ(node.exit_text(), "exited with status 0");  // SIGTERM: a clean stop
  node.start(server.url(), key_file, module);
  ASSERT_TRUE(node.wait_line("ready"));
  control->publish(bundle(2), module);
  ASSERT_TRUE(node.wait_line("record 1 duplicate 2 2 replayed_version")) << node.exit_text();
  EXPECT_EQ(node.count_lines("apply "), 0u);
  EXPECT_EQ(node.serving().first, 2u);
}

}  // namespace
