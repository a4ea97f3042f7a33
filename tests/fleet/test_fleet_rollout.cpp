// The control side and the node side together: a fleet controller (fleet_controller.hpp) rolls
// a module out to four real fleet_agents (fleet_agent.hpp) over memory sinks, through a real
// nats-server. Canaries first, then everyone; a canary whose sink fails halts the rollout, and
// the canary that had applied it is rolled back by the signed request.
#include "eventually.hpp"
#include "nats_server.hpp"
#include "tools/memory_sink.hpp"
#include "update/source_bundles.hpp"

#include <cubridge/fleet/agent.hpp>
#include <cubridge/fleet/controller.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <thread>

namespace {

using namespace std::chrono_literals;
using cubridge::fleet::controller;

using cubridge::testing::eventually;
using node_sink = cubridge::testing::memory_sink;

class FleetRolloutEndToEnd : public ::testing::Test {
 protected:
  static constexpr std::size_t node_count = 4;
  cubridge::testing::nats_server server;
  cubridge::keypair keys = cubridge::generate_keypair();
  std::array<node_sink, node_count> sinks;
  std::vector<std::unique_ptr<cubridge::fleet_agent>> agents;
  std::unique_ptr<controller> control;

  void SetUp() override {
    for (std::size_t i = 0; i < node_count; ++i) {
      cubridge::fleet_agent_options o;
      o.servers = server.url();
      o.node = "n" + std::to_string(i + 1);
      o.modules = {"filters"};
      o.gate.keys.add(keys.public_key);
      o.heartbeat_interval = 2s;  // live for 6 s: a slow machine does not lose a canary
      agents.push_back(std::make_unique<cubridge::fleet_agent>(sinks[i], o));
      agents.back()->start();
    }
    control = std::make_unique<controller>(cubridge::fleet::controller_options{server.url()});
    ASSERT_TRUE(eventually([&] {
      const auto nodes = control->nodes();
      return nodes.size() == node_count &&
             std::all_of(nodes.begin(), nodes.end(), [](const auto& n) { return n.live; });
    })) << "the agents' heartbeats never all arrived";
    // Everyone at v1 first.
    control->publish(bundle(1), "filters");
    control->set_desired("filters", "all", 1);
    ASSERT_TRUE(at_version(1));
  }
  std::vector<std::byte> bundle(std::uint64_t version) const {
    return cubridge::testing::source_bundle("filters", version, keys.secret_key);
  }
  bool at_version(std::uint64_t version) {
    return eventually([&] {
      return std::all_of(sinks.begin(), sinks.end(), [&](const node_sink& s) {
        return s.current_version("filters") == version;
      });
    });
  }
};

TEST_F(FleetRolloutEndToEnd, CanariesThenEveryNode) {
  cubridge::fleet::canary_policy policy;
  policy.canaries = 2;
  const auto report = control->rollout(bundle(2), "filters", 2, policy, keys.secret_key);
  ASSERT_TRUE(report.completed) << report.halt_reason;
  EXPECT_EQ(report.canaries, (std::vector<std::string>{"n1", "n2"}));
  EXPECT_TRUE(at_version(2));
  EXPECT_EQ(control->desired("filters", "all"), 2u);
  // Each node applied v1 and v2 once.
  for (const auto& sink : sinks) EXPECT_EQ(sink.applies, 2);
  EXPECT_TRUE(eventually([&] {
    const auto results = control->last_results("filters");
    return results.size() == node_count &&
           std::all_of(results.begin(), results.end(), [](const auto& r) {
             // The canaries see v2 again on `all`: a duplicate, nothing changed.
             return r.version == 2 && r.serving_version == 2 &&
                    (r.outcome == cubridge::gate_outcome::applied ||
                     r.outcome == cubridge::gate_outcome::duplicate);
           });
  }));
}

TEST_F(FleetRolloutEndToEnd, ACanaryFailureHaltsAndRollsTheOtherCanaryBack) {
  sinks[1].fail_version = 2;  // n2's smoke test fails
  cubridge::fleet::canary_policy policy;
  policy.canaries = 2;
  const auto report = control->rollout(bundle(2), "filters", 2, policy, keys.secret_key);
  ASSERT_FALSE(report.completed);
  EXPECT_NE(report.halt_reason.find("canary n2 failed v2"), std::string::npos)
      << report.halt_reason;
  EXPECT_EQ(report.rolled_back, std::vector<std::string>{"n1"});
  // n1 handles the rollback request after its bundle (stream order): rolled back when it had
  // applied v2 (the usual case), refused when the purge came before it fetched the bundle.
  EXPECT_TRUE(eventually([&] {
    const auto results = control->last_results("filters");
    return !results.empty() && results[0].node == "n1" &&
           (results[0].outcome == cubridge::gate_outcome::rolled_back ||
            results[0].reason == "version_mismatch");
  }));
  EXPECT_TRUE(at_version(1));
  EXPECT_EQ(sinks[2].applies, 1);
  EXPECT_EQ(sinks[3].applies, 1);
  const auto modules = control->modules();
  ASSERT_EQ(modules.size(), 1u);
  EXPECT_EQ(modules[0].halted_version, 2u);
  EXPECT_EQ(modules[0].desired_all, 1u);
  EXPECT_EQ(modules[0].desired_canary, 1u);
}

}  // namespace
