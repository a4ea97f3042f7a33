// The fleet with real processes: a real nats-server (tests/nats_server.hpp) and node processes
// (tests/fleet/fleet_node.cpp: a fleet_agent over a recording sink that keeps its versions in a
// file), driven by the control side (controller.hpp). Every wait is on a condition (a node's
// event line, its sink's file, a verified result) with a deadline. The faults are timed under
// the agent's default retry and resync settings: recovery must be within 5 s of the restart.
#include "bundle/source_bundles.hpp"
#include "fleet/fleet_node_process.hpp"
#include "nats_server.hpp"

#include <cubridge/fleet/controller.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <future>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
using cubridge::gate_outcome;
using cubridge::fleet::controller;
using cubridge::fleet::result_record;
using cubridge::fleet::rollout_report;
using cubridge::testing::eventually;
using cubridge::testing::fleet_node_process;
using steady = std::chrono::steady_clock;

class FleetProcesses : public ::testing::Test {
 protected:
  const std::string module = "filters";
  cubridge::testing::nats_server server;
  cubridge::testing::temp_dir dir;
  cubridge::keypair keys = cubridge::generate_keypair();
  std::filesystem::path key_file = dir.path / "operator.pub";
  std::vector<std::unique_ptr<fleet_node_process>> nodes;
  std::unique_ptr<controller> control;

  void SetUp() override {
    cubridge::write_key_file(key_file, keys.public_key);
    connect();
  }
  void connect() {
    cubridge::fleet::controller_options o;
    o.bus.servers = server.url();
    o.operator_keys.add(keys.public_key);
    control = std::make_unique<controller>(std::move(o));
  }

  // Starts nodes n<first>..n<first+count-1>, enrolled, and waits until each is connected.
  void start_nodes(std::size_t count, const std::vector<std::string>& extra = {}) {
    const auto first = nodes.size();
    for (std::size_t i = 0; i < count; ++i) {
      const auto number = first + i + 1;
      nodes.push_back(std::make_unique<fleet_node_process>(
          (number < 10 ? "n0" : "n") + std::to_string(number), dir.path));
      control->enroll(nodes.back()->id(), nodes.back()->public_key(), {}, keys.secret_key);
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
  std::vector<std::byte> bundle(std::uint64_t version) const {
    return cubridge::testing::source_bundle(module, version, keys.secret_key, "sm_90");
  }
  // Publishes `version` to every node and waits for every node's result for that revision.
  std::vector<result_record> roll_out(std::uint64_t version) {
    const auto report = control->publish(bundle(version), keys.secret_key);
    return control->wait_for_results(module, report.desired.revision, report.desired.stable->digest,
                                     ids(), 60s);
  }
  static bool all_applied(const std::vector<result_record>& results, std::size_t count) {
    return results.size() == count &&
           std::all_of(results.begin(), results.end(),
                       [](const result_record& r) { return r.outcome == gate_outcome::applied; });
  }
  // How long until every node's sink serves `version`, at most `deadline`.
  std::chrono::milliseconds time_to_serve(std::uint64_t version, std::chrono::seconds deadline) {
    const auto start = steady::now();
    const bool all = eventually(
        [&] {
          return std::all_of(nodes.begin(), nodes.end(),
                             [&](const auto& n) { return n->serving().first == version; });
        },
        deadline);
    EXPECT_TRUE(all) << "not every node serves v" << version << " within " << deadline.count()
                     << " s";
    return std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - start);
  }
};

TEST_F(FleetProcesses, RolloutToTenNodes) {
  start_nodes(10);
  const auto results = roll_out(1);
  ASSERT_EQ(results.size(), 10u);
  for (const auto& r : results) {
    EXPECT_EQ(r.outcome, gate_outcome::applied) << r.node << ": " << r.reason << " " << r.detail;
    EXPECT_EQ(r.serving_version, 1u);
  }
  for (const auto& n : nodes) {
    EXPECT_EQ(n->serving().first, 1u) << n->id();
    EXPECT_EQ(n->count_lines("apply "), 1u) << n->id();
  }
  // The status view, from the verified heartbeats: ten live nodes, each serving v1.
  EXPECT_TRUE(eventually([&] {
    const auto seen = control->nodes();
    return seen.size() == 10 && std::all_of(seen.begin(), seen.end(), [&](const auto& s) {
             return s.live && s.beat && s.beat->versions.count(module) &&
                    s.beat->versions.at(module) == 1;
           });
  })) << "the heartbeats never showed 10 live nodes at v1";
}

TEST_F(FleetProcesses, ACanaryFailureHaltsAndTheCanariesGoBackByThemselves) {
  start_nodes(1);
  start_nodes(1, {"--fail-version", "2"});  // n02's smoke test fails for v2
  start_nodes(2);
  ASSERT_TRUE(all_applied(roll_out(1), 4));
  ASSERT_TRUE(eventually([&] {
    const auto seen = control->nodes();
    return seen.size() == 4 && std::all_of(seen.begin(), seen.end(), [](const auto& s) {
             return s.live && s.beat && s.beat->versions.count("filters");
           });
  }));
  cubridge::fleet::canary_policy policy;
  policy.canaries = 2;
  policy.window = 60s;
  const rollout_report report = control->rollout(bundle(2), policy, keys.secret_key);
  ASSERT_FALSE(report.completed);
  EXPECT_EQ(report.canaries, (std::vector<std::string>{"n01", "n02"}));
  EXPECT_NE(report.halt_reason.find("canary n02 failed v2"), std::string::npos)
      << report.halt_reason;
  EXPECT_EQ(report.desired.phase, cubridge::fleet::rollout_phase::halted);
  // n01 may have applied v2 before the halt: the halted desired state takes it back to v1.
  time_to_serve(1, 30s);
  EXPECT_TRUE(nodes[1]->has_line("failed 2"));
  EXPECT_FALSE(nodes[2]->has_line("apply 2"));  // the rest never saw v2
  EXPECT_FALSE(nodes[3]->has_line("apply 2"));
}

TEST_F(FleetProcesses, ANodeKilledAfterThePromoteConvergesWithinFiveSecondsOfItsRestart) {
  start_nodes(1, {"--apply-delay-ms", "600000"});
  auto& node = *nodes[0];
  (void)control->publish(bundle(1), keys.secret_key);
  ASSERT_TRUE(node.wait_line("promoted 1"));  // in the sink, before the gate settled it
  node.kill();
  node.start(server.url(), key_file, module);
  const auto start = steady::now();
  const auto desired = control->desired(module);
  ASSERT_TRUE(desired);
  const auto results = control->wait_for_results(module, desired->state.revision,
                                                 desired->state.stable->digest, ids(), 30s);
  const auto took = steady::now() - start;
  ASSERT_EQ(results.size(), 1u);
  // It serves v1 already: a duplicate, the sink not called again.
  EXPECT_EQ(results[0].outcome, gate_outcome::duplicate) << results[0].reason;
  EXPECT_EQ(node.count_lines("apply "), 0u);
  EXPECT_LT(took, 5s) << "converged "
                      << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                      << " ms after the restart";
  ASSERT_TRUE(all_applied(roll_out(2), 1));  // and it goes on with the next version
}

TEST_F(FleetProcesses, ANodeKilledBeforeThePromoteConvergesWithinFiveSecondsOfItsRestart) {
  start_nodes(1);
  auto& node = *nodes[0];
  ASSERT_TRUE(all_applied(roll_out(1), 1));
  node.stop();
  node.start(server.url(), key_file, module, {"--stall-before-apply-ms", "600000"});
  ASSERT_TRUE(node.wait_line("ready")) << node.exit_text();
  (void)control->publish(bundle(2), keys.secret_key);
  ASSERT_TRUE(node.wait_line("apply 2")) << node.exit_text();  // recorded pending, not promoted
  node.kill();
  EXPECT_EQ(node.serving().first, 1u);
  node.start(server.url(), key_file, module);
  const auto took = time_to_serve(2, 30s);
  EXPECT_LT(took, 5s) << "converged " << took.count() << " ms after the restart";
  EXPECT_EQ(node.count_lines("promoted 2"), 1u);
}

TEST_F(FleetProcesses, TheServerKilledMidRolloutEveryNodeConvergesWithinFiveSecondsOfItsRestart) {
  start_nodes(3);
  ASSERT_TRUE(all_applied(roll_out(1), 3));
  (void)control->publish(bundle(2), keys.secret_key);  // stored and desired: then the crash
  control.reset();
  server.kill();
  for (const auto& n : nodes) EXPECT_TRUE(n->alive()) << n->id();  // they serve on
  server.start();
  const auto took = time_to_serve(2, 30s);
  EXPECT_LT(took, 5s) << "converged " << took.count() << " ms after the server's restart";
  connect();
  ASSERT_TRUE(all_applied(roll_out(3), 3));
}

TEST_F(FleetProcesses, AReimagedNodeAndALateJoinerConverge) {
  start_nodes(2);
  ASSERT_TRUE(all_applied(roll_out(1), 2));
  ASSERT_TRUE(all_applied(roll_out(2), 2));
  (void)control->rollback(module, 0, keys.secret_key);  // the fleet goes back to v1
  time_to_serve(1, 30s);
  start_nodes(1);  // joins after the rollback: runs the rolled-back-to version
  time_to_serve(1, 30s);
  EXPECT_EQ(nodes[2]->count_lines("apply 2"), 0u);
  // Reimaged: the same id, its state wiped.
  auto& node = *nodes[0];
  node.kill();
  std::filesystem::remove(dir.path / "n01.state");
  std::filesystem::remove(dir.path / "n01.state.serving");
  node.start(server.url(), key_file, module);
  const auto took = time_to_serve(1, 30s);
  EXPECT_LT(took, 5s) << "the reimaged node converged after " << took.count() << " ms";
}

// --- a wave passes only on evidence -------------------------------------------------------

class FleetDeadCanaries : public FleetProcesses {
 protected:
  // Three nodes on v1, each seen live by the controller; then a wave rollout of v2 with its
  // first wave of one node (n01) and a bake of `bake`, run on a thread of its own.
  std::future<rollout_report> start_waves(std::chrono::milliseconds bake) {
    start_nodes(3);
    EXPECT_TRUE(all_applied(roll_out(1), 3));
    EXPECT_TRUE(eventually([&] {
      const auto seen = control->nodes();
      return seen.size() == 3 && std::all_of(seen.begin(), seen.end(), [](const auto& s) {
               return s.live && s.beat && s.beat->versions.count("filters") &&
                      s.beat->versions.at("filters") == 1;
             });
    }));
    cubridge::fleet::wave_policy policy;  // default analysis settings: 3 missed intervals
    policy.waves = {"1", "100%"};
    policy.bake = bake;
    return std::async(std::launch::async, [this, policy] {
      return control->rollout_waves(bundle(2), policy, keys.secret_key);
    });
  }
  void expect_nobody_else_ran_v2() {
    for (std::size_t i = 1; i < nodes.size(); ++i)
      EXPECT_FALSE(nodes[i]->has_line("apply 2")) << nodes[i]->id();
  }
};

TEST_F(FleetDeadCanaries, ACanaryKilledOnceInItsBakeFailsTheWaveAsLost) {
  auto rollout = start_waves(30s);
  ASSERT_TRUE(nodes[0]->wait_line("promoted 2")) << nodes[0]->exit_text();
  nodes[0]->kill();  // and never comes back
  const auto killed = steady::now();
  ASSERT_EQ(rollout.wait_for(60s), std::future_status::ready);
  const auto report = rollout.get();
  const auto took = steady::now() - killed;
  EXPECT_FALSE(report.completed);
  EXPECT_EQ(report.halt_signal, cubridge::fleet::halt_signal::canary_lost) << report.halt_reason;
  EXPECT_EQ(report.halt_node, "n01");
  EXPECT_NE(report.halt_reason.find("canary n01 sent no heartbeat"), std::string::npos)
      << report.halt_reason;
  // 3 intervals of 1 s and a second allowed, then the next look: well inside the 30 s bake.
  EXPECT_LT(took, 15s);
  const auto state = control->desired(module);
  ASSERT_TRUE(state);
  EXPECT_EQ(state->state.phase, cubridge::fleet::rollout_phase::halted);
  EXPECT_EQ(state->state.stable->version, 1u);
  expect_nobody_else_ran_v2();
}

TEST_F(FleetDeadCanaries, ACanaryInACrashLoopFailsTheWaveAsRestarted) {
  auto rollout = start_waves(30s);
  ASSERT_TRUE(nodes[0]->wait_line("promoted 2")) << nodes[0]->exit_text();
  // Killed and started again at once, each time it serves the candidate, until the rollout
  // ends: every run sends a fresh "healthy" heartbeat on the candidate.
  while (rollout.wait_for(0s) != std::future_status::ready) {
    nodes[0]->kill();
    nodes[0]->start(server.url(), key_file, module);
    (void)eventually(
        [&] {
          return nodes[0]->has_line("promoted 2") || nodes[0]->has_line("duplicate") ||
                 rollout.wait_for(0s) == std::future_status::ready;
        },
        20s);
    (void)eventually([&] { return rollout.wait_for(0s) == std::future_status::ready; }, 1500ms);
  }
  const auto report = rollout.get();
  EXPECT_FALSE(report.completed);
  using cubridge::fleet::halt_signal;
  EXPECT_TRUE(report.halt_signal == halt_signal::canary_restarted ||
              report.halt_signal == halt_signal::canary_lost)
      << to_string(report.halt_signal) << ": " << report.halt_reason;
  EXPECT_EQ(report.halt_node, "n01");
  expect_nobody_else_ran_v2();
}

// --- nodes always come back -----------------------------------------------------------------

TEST_F(FleetProcesses, NodesStartedAllAtOnceAllConnectAndAllComeBackAfterAServerRestart) {
  // As many node processes as a loaded 2-core machine holds with room: all at once.
  constexpr std::size_t storm = 40;
  for (std::size_t i = 0; i < storm; ++i) {
    const auto number = i + 1;
    nodes.push_back(std::make_unique<fleet_node_process>(
        (number < 10 ? "n0" : "n") + std::to_string(number), dir.path));
    control->enroll(nodes.back()->id(), nodes.back()->public_key(), {}, keys.secret_key);
  }
  for (auto& n : nodes) n->start(server.url(), key_file, module);
  const auto all_live = [&] {
    const auto seen = control->nodes();
    return std::count_if(seen.begin(), seen.end(), [](const auto& s) { return s.live; }) ==
           static_cast<std::ptrdiff_t>(storm);
  };
  EXPECT_TRUE(eventually(all_live, 30s)) << "not every node of the storm connected within 30 s";
  control.reset();
  server.kill();
  server.start();
  connect();
  const auto restarted = std::chrono::system_clock::now();
  EXPECT_TRUE(eventually(
      [&] {
        const auto seen = control->nodes();
        return std::count_if(seen.begin(), seen.end(), [&](const auto& s) {
                 return s.live && s.received > restarted;
               }) == static_cast<std::ptrdiff_t>(storm);
      },
      30s))
      << "not every node came back within 30 s of the server's restart";
}

}  // namespace
