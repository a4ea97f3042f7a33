// Tests of the fleet agent (cubridge/fleet/agent.hpp) over a hot_module_sink holding a
// hot_module_group, on a GPU and a real nats-server (tests/nats_server.hpp), driven by the
// control side (controller.hpp): a bundle made desired serves on every member, one that a member
// refuses switches none, a rollback of the desired state returns every member (issues 16, 22).
// Three contexts of one GPU stand for the devices of a node.
#include <cubridge/core/context.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/fleet/agent.hpp>
#include <cubridge/fleet/controller.hpp>
#include <cubridge/swap/hot_module_group.hpp>
#include <cubridge/update_swap/hot_module_sink.hpp>

#include "eventually.hpp"
#include "hot_module_fixture.hpp"
#include "nats_server.hpp"
#include "temp_dir.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
using cubridge::gate_outcome;
using cubridge::fleet::result_record;
using cubridge::testing::eventually;
using cubridge::testing::hot_image;

constexpr std::size_t refusing_member = 2;

class FleetGroup : public ::testing::Test {
 protected:
  const std::string module = "grouped";
  const std::string node = "node-a";

  void SetUp() override {
    CUBRIDGE_REQUIRE_GPU();
    if (cubridge::device::get(0).capability().major != 9) GTEST_SKIP() << "test images are sm_90";
    std::vector<cubridge::context_arg> args;
    for (int i = 0; i < 3; ++i)
      contexts.push_back(cubridge::context::create(cubridge::device::get(0)));
    for (auto& c : contexts) args.emplace_back(c);
    group.emplace(
        cubridge::hot_module_group::load(module, args, hot_image("v1"), {.origin = {.label = 1}}));
    // Armed only for the v3 push (each test first applies v2 everywhere): then it refuses
    // the version staged in the refusing member's context alone.
    cubridge::stage_options stage;
    const CUcontext refusing = contexts[refusing_member].get();
    stage.smoke_test = [this, refusing](const cubridge::module& staged) {
      if (refuse_on_one_member.load() && staged.context().get() == refusing)
        throw std::runtime_error("this member's smoke test refuses the version");
    };
    sink = std::make_shared<cubridge::hot_module_sink>();
    sink->add(*group, std::move(stage));

    server.emplace();
    cubridge::fleet::controller_options c;
    c.bus.servers = server->url();
    c.operator_keys.add(keys.public_key);
    control = std::make_unique<cubridge::fleet::controller>(std::move(c));
    const auto node_keys = cubridge::generate_keypair();
    cubridge::write_key_file(dir.path / "node.key", node_keys.secret_key);
    control->enroll(node, node_keys.public_key, {}, keys.secret_key);
    cubridge::update_gate_options policy;
    policy.keys.add(keys.public_key);
    policy.persist_state = false;
    gate = cubridge::update_gate::create(sink, policy);
    cubridge::fleet_agent_options o;
    o.bus.servers = server->url();
    o.node = node;
    o.node_key_file = dir.path / "node.key";
    o.modules = {module};
    o.heartbeat_interval = 200ms;
    agent = std::make_unique<cubridge::fleet_agent>(gate, o);
    agent->start();
    ASSERT_TRUE(eventually([&] { return agent->connected(); })) << "agent never connected";
  }

  std::vector<std::byte> bundle(std::uint64_t version, const char* image) const {
    cubridge::bundle_manifest_input in{module, version, "sm_90", cubridge::payload_kind::cubin};
    return cubridge::sign_bundle(in, hot_image(image), keys.secret_key);
  }
  // The node's result for the desired state `report` wrote, as the control side reads it.
  result_record result_of(const cubridge::fleet::desired_state& desired) {
    const auto* target = desired.target_for(node);
    EXPECT_NE(target, nullptr);
    if (!target) return {};
    const std::vector<std::string> nodes{node};
    const auto results =
        control->wait_for_results(module, desired.revision, target->digest, nodes, 30s);
    EXPECT_EQ(results.size(), 1u) << "no result for revision " << desired.revision;
    return results.empty() ? result_record{} : results.front();
  }
  result_record publish(std::uint64_t version, const char* image) {
    return result_of(control->publish(bundle(version, image), keys.secret_key).desired);
  }

  // What write_version, launched through the group on each member's context, writes there.
  std::vector<unsigned> written_by_every_member() {
    std::vector<unsigned> written;
    const auto kernel = group->get_kernel("write_version");
    for (auto& c : contexts) {
      cubridge::scoped_current current(c);
      auto out = cubridge::driver_buffer<unsigned>::allocate(c, 256);
      (void)kernel.launch({.block = {256}, .stream = cubridge::stream_ref::legacy_default()},
                          out.span());
      EXPECT_EQ(cubridge::driver::api().cuCtxSynchronize(), CUDA_SUCCESS);
      written.push_back(cubridge::testing::read_back(out, 255));
    }
    return written;
  }
  void expect_applied_v2() {
    const auto r = publish(2, "v2");
    EXPECT_EQ(r.outcome, gate_outcome::applied) << r.reason << ": " << r.detail;
    EXPECT_EQ(r.node, node);
    EXPECT_EQ(r.module, module);
    EXPECT_EQ(r.version, 2u);
    EXPECT_EQ(r.serving_version, 2u);
  }

  cubridge::keypair keys = cubridge::generate_keypair();
  std::atomic<bool> refuse_on_one_member{false};
  cubridge::testing::temp_dir dir;
  // Declared in the order they depend on each other: the agent goes first, the contexts last.
  std::vector<cubridge::context> contexts;
  std::optional<cubridge::hot_module_group> group;
  std::shared_ptr<cubridge::hot_module_sink> sink;
  std::optional<cubridge::testing::nats_server> server;
  std::unique_ptr<cubridge::fleet::controller> control;
  std::shared_ptr<cubridge::update_gate> gate;
  std::unique_ptr<cubridge::fleet_agent> agent;
};

TEST_F(FleetGroup, ADesiredBundleServesOnEveryMember) {
  EXPECT_EQ(written_by_every_member(), (std::vector<unsigned>{1, 1, 1}));
  expect_applied_v2();
  EXPECT_EQ(written_by_every_member(), (std::vector<unsigned>{2, 2, 2}));
  EXPECT_EQ(sink->current_version(module), 2u);
  for (std::size_t i = 0; i < group->size(); ++i)
    EXPECT_EQ(group->member(i).versions().serving.origin.label, 2u) << "member " << i;
  EXPECT_EQ(group->stats().promotions, 1u);
  EXPECT_TRUE(agent->converged());
}

TEST_F(FleetGroup, ABundleOneMemberRefusesSwitchesNone) {
  expect_applied_v2();
  const auto serving = group->serving().id;
  refuse_on_one_member = true;
  const auto r = publish(3, "v1");  // would write 1 wherever it served
  EXPECT_EQ(r.outcome, gate_outcome::refused) << r.reason << ": " << r.detail;
  EXPECT_EQ(r.reason, "stage_refused") << r.detail;
  EXPECT_NE(r.detail.find("member " + std::to_string(refusing_member)), std::string::npos)
      << r.detail;
  EXPECT_NE(r.detail.find("smoke test"), std::string::npos) << r.detail;
  EXPECT_EQ(r.version, 3u);
  EXPECT_EQ(r.serving_version, 2u);
  EXPECT_EQ(written_by_every_member(), (std::vector<unsigned>{2, 2, 2}));
  EXPECT_EQ(group->serving().id, serving);
  EXPECT_EQ(sink->current_version(module), 2u);
  const auto stats = group->stats();
  EXPECT_EQ(stats.promotions, 1u) << "only v2";
  EXPECT_EQ(stats.rejected, 1u);
  for (std::size_t i = 0; i < group->size(); ++i)
    EXPECT_EQ(group->member(i).versions().serving.origin.label, 2u) << "member " << i;
  EXPECT_EQ(agent->stats().refused, 1u);  // recorded once, not retried
}

TEST_F(FleetGroup, ARollbackOfTheDesiredStateReturnsEveryMember) {
  const auto first =
      publish(1, "v1");  // v1 serves already: desired, so that it can be gone back to
  EXPECT_EQ(first.outcome, gate_outcome::duplicate) << first.reason << ": " << first.detail;
  expect_applied_v2();
  const auto back = control->rollback(module, 0, keys.secret_key);
  ASSERT_EQ(back.stable->version, 1u);
  const auto r = result_of(back);
  EXPECT_EQ(r.outcome, gate_outcome::applied) << r.reason << ": " << r.detail;
  EXPECT_EQ(r.serving_version, 1u);
  EXPECT_EQ(written_by_every_member(), (std::vector<unsigned>{1, 1, 1}));
  EXPECT_EQ(sink->current_version(module), 1u);
  for (std::size_t i = 0; i < group->size(); ++i)
    EXPECT_EQ(group->member(i).versions().serving.origin.label, 1u) << "member " << i;
  EXPECT_EQ(group->stats().promotions, 2u) << "v2 and v1 again";
}

}  // namespace
