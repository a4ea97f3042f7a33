// Tests of the fleet agent (cubridge/fleet/agent.hpp) over a hot_module_sink holding a
// hot_module_group, on a GPU and a real nats-server (tests/nats_server.hpp): a bundle published
// for the module serves on every member, one that a member refuses switches none, a rollback
// returns every member (issue 16). Three contexts of one GPU stand for the devices of a node.
#include <cubridge/core/context.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/swap/hot_module_group.hpp>
#include <cubridge/fleet/agent.hpp>
#include <cubridge/fleet/subjects.hpp>
#include <cubridge/update/hot_module_sink.hpp>
#include <cubridge/update/rollback_request.hpp>

#include "eventually.hpp"
#include "hot_module_fixture.hpp"
#include "nats_server.hpp"
#include "fleet/nats.hpp"

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
namespace nats = cubridge::fleet::detail;

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
    group.emplace(cubridge::hot_module_group::load(module, args, hot_image("v1"),
                                                   {.origin = {.bundle_version = 1}}));
    // Armed only for the v3 push (each test first applies v2 everywhere): then it refuses
    // the version staged in the refusing member's context alone.
    cubridge::stage_options stage;
    const CUcontext refusing = contexts[refusing_member].get();
    stage.smoke_test = [this, refusing](const cubridge::module& staged) {
      if (refuse_on_one_member.load() && staged.context().get() == refusing)
        throw std::runtime_error("this member's smoke test refuses the version");
    };
    sink.emplace();
    sink->add(*group, std::move(stage));

    server.emplace();
    publisher = nats::connect({server->url(), "test-publisher", true, false});
    js = nats::jetstream(publisher.get());
    nats::ensure_bundle_stream(js.get(), module);  // as `cubridge fleet publish` does
    agent = std::make_unique<cubridge::fleet_agent>(*sink, options());
    agent->start();
    ASSERT_TRUE(eventually([&] { return agent->connected(); })) << "agent never connected";
  }

  cubridge::fleet_agent_options options() const {
    cubridge::fleet_agent_options o;
    o.servers = server->url();
    o.node = node;
    o.modules = {module};
    o.gate.keys.add(keys.public_key);
    o.heartbeat_interval = 200ms;
    o.ack_wait = 10s;
    return o;
  }

  std::vector<std::byte> bundle(std::uint64_t version, const char* image) const {
    cubridge::bundle_manifest_input in{module, version, "sm_90", cubridge::payload_kind::cubin};
    return cubridge::sign_bundle(in, hot_image(image), keys.secret_key);
  }
  // Publishes on `subject` (default: the module's subject for every node) and returns the
  // agent's next result record, as the control side reads it.
  result_record deliver(std::span<const std::byte> data, std::string subject = {}) {
    const auto before = agent->stats().records_published;
    nats::publish(js.get(), publisher.get(),
                  subject.empty() ? cubridge::fleet::bundle_subject_all(module) : subject, data,
                  "test message");
    EXPECT_TRUE(eventually([&] { return agent->stats().records_published > before; }))
        << "no result record";
    auto message = nats::last_message(js.get(), cubridge::fleet::result_stream,
                                      cubridge::fleet::result_subject(module, node));
    if (!message) return {};
    return cubridge::fleet::parse_result_record(nats::message_text(message.get()))
        .value_or(result_record{});
  }
  result_record deliver_rollback(std::uint64_t from_version) {
    const auto request = cubridge::sign_rollback_request(module, from_version, keys.secret_key);
    return deliver(std::as_bytes(std::span(request.data(), request.size())),
                   cubridge::fleet::rollback_subject(module));
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
    const auto r = deliver(bundle(2, "v2"));
    EXPECT_EQ(r.outcome, gate_outcome::applied) << r.reason << ": " << r.detail;
    EXPECT_EQ(r.node, node);
    EXPECT_EQ(r.module, module);
    EXPECT_EQ(r.version, 2u);
    EXPECT_EQ(r.serving_version, 2u);
  }

  cubridge::keypair keys = cubridge::generate_keypair();
  std::atomic<bool> refuse_on_one_member{false};
  // Declared in the order they depend on each other: the agent goes first, the contexts last.
  std::vector<cubridge::context> contexts;
  std::optional<cubridge::hot_module_group> group;
  std::optional<cubridge::hot_module_sink> sink;
  std::optional<cubridge::testing::nats_server> server;
  nats::connection_ptr publisher;
  nats::jetstream_ptr js;
  std::unique_ptr<cubridge::fleet_agent> agent;
};

TEST_F(FleetGroup, APublishedBundleServesOnEveryMember) {
  EXPECT_EQ(written_by_every_member(), (std::vector<unsigned>{1, 1, 1}));
  expect_applied_v2();
  EXPECT_EQ(written_by_every_member(), (std::vector<unsigned>{2, 2, 2}));
  EXPECT_EQ(sink->current_version(module), 2u);
  for (std::size_t i = 0; i < group->size(); ++i)
    EXPECT_EQ(group->member(i).versions().serving.origin.bundle_version, 2u) << "member " << i;
  EXPECT_EQ(group->stats().promotions, 1u);
  EXPECT_TRUE(eventually([&] { return agent->stats().acked == 1; }));
}

TEST_F(FleetGroup, ABundleOneMemberRefusesSwitchesNone) {
  expect_applied_v2();
  const auto serving = group->serving().id;
  refuse_on_one_member = true;
  const auto r = deliver(bundle(3, "v1"));  // would write 1 wherever it served
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
    EXPECT_EQ(group->member(i).versions().serving.origin.bundle_version, 2u) << "member " << i;
  EXPECT_EQ(agent->stats().refused, 1u);
}

TEST_F(FleetGroup, ASignedRollbackReturnsEveryMember) {
  expect_applied_v2();
  const auto r = deliver_rollback(2);
  EXPECT_EQ(r.outcome, gate_outcome::rolled_back) << r.reason << ": " << r.detail;
  EXPECT_EQ(r.version, 1u);
  EXPECT_EQ(r.serving_version, 1u);
  EXPECT_EQ(written_by_every_member(), (std::vector<unsigned>{1, 1, 1}));
  EXPECT_EQ(sink->current_version(module), 1u);
  for (std::size_t i = 0; i < group->size(); ++i)
    EXPECT_EQ(group->member(i).versions().serving.origin.bundle_version, 1u) << "member " << i;
  const auto stats = group->stats();
  EXPECT_EQ(stats.promotions, 2u) << "v2 and the rollback";
  EXPECT_EQ(stats.rollbacks, 1u);
  EXPECT_EQ(agent->stats().rolled_back, 1u);
}

}  // namespace
