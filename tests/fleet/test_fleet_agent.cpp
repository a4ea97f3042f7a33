// Tests of cubridge/fleet/agent.hpp against a real nats-server (tests/nats_server.hpp)
// with a memory sink (no GPU): what reaches the agent is applied, refused or ignored as
// docs/fleet.md says, each with a result record, acknowledged once; the agent serves on while
// the server is down and converges when it is back.
#include <cubridge/fleet/agent.hpp>
#include <cubridge/fleet/subjects.hpp>
#include <cubridge/update/rollback_request.hpp>

#include "eventually.hpp"
#include "nats_server.hpp"
#include "tools/memory_sink.hpp"
#include "fleet/nats.hpp"
#include "update/source_bundles.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using cubridge::gate_outcome;
using cubridge::fleet::result_record;
namespace nats = cubridge::fleet::detail;

using cubridge::testing::eventually;
// The memory sink counts its applies.
using counting_sink = cubridge::testing::memory_sink;

class FleetAgentTest : public ::testing::Test {
 protected:
  const std::string module = "filters";
  const std::string node = "node-a";
  cubridge::testing::nats_server server;
  cubridge::keypair keys = cubridge::generate_keypair();
  cubridge::keypair stranger = cubridge::generate_keypair();
  counting_sink sink;
  nats::connection_ptr publisher;
  nats::jetstream_ptr js;
  std::unique_ptr<cubridge::fleet_agent> agent;

  void SetUp() override { connect_publisher(); }
  void connect_publisher() {
    publisher = nats::connect({server.url(), "test-publisher", true, false});
    js = nats::jetstream(publisher.get());
    nats::ensure_bundle_stream(js.get(), module);  // as `cubridge fleet publish` does
  }

  cubridge::fleet_agent_options options() const {
    cubridge::fleet_agent_options o;
    o.servers = server.url();
    o.node = node;
    o.modules = {module};
    o.gate.keys.add(keys.public_key);
    o.gate.max_bundle_bytes = 64 << 10;
    o.heartbeat_interval = 200ms;
    o.ack_wait = 2s;
    return o;
  }
  void start_agent() {
    agent = std::make_unique<cubridge::fleet_agent>(sink, options());
    agent->start();
    ASSERT_TRUE(eventually([&] { return agent->connected(); })) << "agent never connected";
  }

  std::vector<std::byte> bundle(std::uint64_t version) const {
    return cubridge::testing::source_bundle(module, version, keys.secret_key);
  }
  void publish(const std::string& subject, std::span<const std::byte> data) {
    nats::publish(js.get(), publisher.get(), subject, data, "test message");
  }
  void publish(const std::string& subject, const std::string& text) {
    publish(subject, std::as_bytes(std::span(text.data(), text.size())));
  }
  // Publishes on the module's subject for everyone and waits for the agent's next record.
  result_record deliver(std::span<const std::byte> data, std::string subject = {}) {
    const auto before = agent->stats().records_published;
    publish(subject.empty() ? cubridge::fleet::bundle_subject_all(module) : subject, data);
    EXPECT_TRUE(eventually([&] { return agent->stats().records_published > before; }))
        << "no result record";
    return stored_record().value_or(result_record{});
  }
  // The last record on the node's result subject, as the control side reads it.
  std::optional<result_record> stored_record() {
    auto message = nats::last_message(js.get(), cubridge::fleet::result_stream,
                                      cubridge::fleet::result_subject(module, node));
    if (!message) return std::nullopt;
    return cubridge::fleet::parse_result_record(nats::message_text(message.get()));
  }
};

void expect_refused(const result_record& r, const std::string& reason,
                    gate_outcome outcome = gate_outcome::refused) {
  EXPECT_EQ(r.outcome, outcome) << r.reason << ": " << r.detail;
  EXPECT_EQ(r.reason, reason) << r.detail;
  EXPECT_EQ(r.node, "node-a");
  EXPECT_EQ(r.module, "filters");
}

TEST_F(FleetAgentTest, APublishedBundleIsAppliedRecordedAndAckedOnce) {
  start_agent();
  const auto r = deliver(bundle(1));
  EXPECT_EQ(r.outcome, gate_outcome::applied) << r.reason << ": " << r.detail;
  EXPECT_EQ(r.version, 1u);
  EXPECT_EQ(r.serving_version, 1u);
  EXPECT_EQ(sink.current_version(module), 1u);
  EXPECT_TRUE(eventually([&] { return agent->stats().acked == 1; }));

  // A restarted agent resumes after what was acknowledged: v1 is not delivered again.
  agent.reset();
  start_agent();
  const auto next = deliver(bundle(2));
  EXPECT_EQ(next.outcome, gate_outcome::applied) << next.reason << ": " << next.detail;
  EXPECT_EQ(agent->stats().duplicates, 0u);
  EXPECT_EQ(agent->stats().records_published, 1u);
  EXPECT_EQ(sink.applies, 2);
}

TEST_F(FleetAgentTest, ALateJoinerGetsTheCurrentBundle) {
  publish(cubridge::fleet::bundle_subject_all(module), bundle(3));
  start_agent();
  ASSERT_TRUE(eventually([&] { return sink.current_version(module) == 3; }));
  ASSERT_TRUE(eventually([&] { return agent->stats().acked == 1; }));
  EXPECT_EQ(stored_record().value_or(result_record{}).outcome, gate_outcome::applied);
}

TEST_F(FleetAgentTest, BadMessagesAreRefusedWithARecordAndChangeNothing) {
  start_agent();
  ASSERT_EQ(deliver(bundle(2)).outcome, gate_outcome::applied);
  auto tampered = bundle(3);
  tampered[tampered.size() - 70] ^= std::byte{1};  // the payload
  auto unsigned_bundle = bundle(3);
  std::fill(unsigned_bundle.end() - 64, unsigned_bundle.end(), std::byte{0});
  const auto wrong_key = cubridge::testing::source_bundle(module, 3, stranger.secret_key);
  const auto oversized =
      cubridge::testing::source_bundle(module, 3, keys.secret_key, "sm_90", 100 << 10);

  expect_refused(deliver(bundle(2)), "replayed_version", gate_outcome::duplicate);
  expect_refused(deliver(bundle(1)), "older_version");
  expect_refused(deliver(tampered), "payload_mismatch");
  expect_refused(deliver(unsigned_bundle), "unsigned_bundle");
  expect_refused(deliver(wrong_key), "unknown_key");
  const auto too_large = deliver(oversized);
  expect_refused(too_large, "too_large");
  EXPECT_EQ(too_large.version, 0u);
  expect_refused(deliver(cubridge::testing::source_bundle("other", 9, keys.secret_key)),
                 "name_mismatch");

  EXPECT_EQ(sink.current_version(module), 2u);
  EXPECT_EQ(sink.applies, 1);
  EXPECT_TRUE(eventually([&] { return agent->stats().acked == 8; }));
  const auto metrics = agent->metrics_text();
  EXPECT_NE(metrics.find("cubridge_module_version{module=\"filters\"} 2\n"), std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("cubridge_fleet_rejects_total{reason=\"unknown_key\"} 1\n"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("cubridge_fleet_agent_connected 1\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("cubridge_fleet_agent_connects_total 1\n"), std::string::npos) << metrics;
  for (const char* family :
       {"cubridge_fleet_promotions_total", "cubridge_fleet_rollbacks_total",
        "cubridge_fleet_agent_heartbeats_total", "cubridge_fleet_agent_publish_failures_total"})
    EXPECT_NE(metrics.find("# TYPE " + std::string(family) + " counter\n"), std::string::npos)
        << family << " in " << metrics;
}

TEST_F(FleetAgentTest, ACanaryBundleForThisNodeIsAppliedAnotherNodesIgnored) {
  start_agent();
  publish(cubridge::fleet::bundle_subject_node(module, "node-b"), bundle(4));
  ASSERT_TRUE(eventually([&] { return agent->stats().ignored == 1; }));
  EXPECT_EQ(sink.current_version(module), 0u);
  const auto r = deliver(bundle(5), cubridge::fleet::bundle_subject_node(module, node));
  EXPECT_EQ(r.outcome, gate_outcome::applied) << r.reason << ": " << r.detail;
  EXPECT_EQ(sink.current_version(module), 5u);
  EXPECT_EQ(agent->stats().records_published, 1u);
}

TEST_F(FleetAgentTest, ASignedRollbackRollsBackOnce) {
  start_agent();
  ASSERT_EQ(deliver(bundle(1)).outcome, gate_outcome::applied);
  ASSERT_EQ(deliver(bundle(2)).outcome, gate_outcome::applied);
  const auto request = cubridge::sign_rollback_request(module, 2, keys.secret_key);
  const auto bytes = std::as_bytes(std::span(request.data(), request.size()));
  const auto r = deliver(bytes, cubridge::fleet::rollback_subject(module));
  EXPECT_EQ(r.outcome, gate_outcome::rolled_back) << r.reason << ": " << r.detail;
  EXPECT_EQ(r.version, 1u);
  EXPECT_EQ(sink.current_version(module), 1u);
  expect_refused(deliver(bytes, cubridge::fleet::rollback_subject(module)), "replayed_request");
  const auto forged = cubridge::sign_rollback_request(module, 1, stranger.secret_key);
  expect_refused(deliver(std::as_bytes(std::span(forged.data(), forged.size())),
                         cubridge::fleet::rollback_subject(module)),
                 "unknown_key");
  EXPECT_EQ(sink.current_version(module), 1u);
}

TEST_F(FleetAgentTest, ServesOnWhileTheServerIsDownAndConvergesWhenItIsBack) {
  start_agent();
  ASSERT_EQ(deliver(bundle(1)).outcome, gate_outcome::applied);
  publisher.reset();
  server.stop();
  ASSERT_TRUE(eventually([&] { return !agent->connected(); }));
  EXPECT_EQ(sink.current_version(module), 1u);  // nothing unloaded
  server.start();
  connect_publisher();
  ASSERT_TRUE(eventually([&] { return agent->connected(); })) << "agent never reconnected";
  const auto r = deliver(bundle(2));
  EXPECT_EQ(r.outcome, gate_outcome::applied) << r.reason << ": " << r.detail;
  EXPECT_EQ(sink.current_version(module), 2u);
  EXPECT_EQ(agent->stats().duplicates, 0u);  // v1 was acknowledged before the server went
}

TEST_F(FleetAgentTest, HeartbeatsCarryTheVersions) {
  start_agent();
  ASSERT_EQ(deliver(bundle(7)).outcome, gate_outcome::applied);
  std::optional<cubridge::fleet::heartbeat> beat;
  ASSERT_TRUE(eventually([&] {
    auto message = nats::last_message(js.get(), cubridge::fleet::heartbeat_stream,
                                      cubridge::fleet::heartbeat_subject(node));
    if (!message) return false;
    beat = cubridge::fleet::parse_heartbeat(nats::message_text(message.get()));
    return beat && beat->versions[module] == 7 && beat->last_result;
  }));
  EXPECT_EQ(beat->node, node);
  EXPECT_EQ(beat->gpu, "sm_90");
  EXPECT_EQ(beat->interval, 200ms);
  EXPECT_EQ(beat->last_result->outcome, gate_outcome::applied);
}

TEST(FleetAgent, RefusesABadNodeIdOrNoModule) {
  counting_sink sink;
  cubridge::fleet_agent_options o;
  o.node = "a.b";
  o.modules = {"filters"};
  EXPECT_THROW(cubridge::fleet_agent(sink, o).start(), cubridge::error);
  o.node = "a";
  o.modules.clear();  // and the sink has none
  EXPECT_THROW(cubridge::fleet_agent(sink, o).start(), cubridge::error);
}

TEST(FleetRecords, RoundTripAndHostileTextEscaped) {
  result_record r;
  r.node = "n1";
  r.module = "filters";
  r.version = 3;
  r.serving_version = 2;
  r.outcome = gate_outcome::refused;
  r.reason = "bad_signature";
  r.detail = "evil \x1b[31m text";
  r.time = std::chrono::sys_seconds{std::chrono::seconds{1700000000}};
  const auto back = cubridge::fleet::parse_result_record(cubridge::fleet::to_json(r));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->version, 3u);
  EXPECT_EQ(back->outcome, gate_outcome::refused);
  EXPECT_EQ(back->detail, "evil ?[31m text");
  EXPECT_EQ(back->time, r.time);
  EXPECT_EQ(cubridge::fleet::to_json(*back), cubridge::fleet::to_json(r));
  // A record written by someone else: raw control bytes never come out.
  auto hostile = cubridge::fleet::to_json(r);
  hostile.replace(hostile.find("evil"), 4, "\\u001b[2J");  // JSON for ESC [2J
  const auto read = cubridge::fleet::parse_result_record(hostile);
  ASSERT_TRUE(read) << hostile;
  EXPECT_EQ(read->detail.find('\x1b'), std::string::npos) << read->detail;
  EXPECT_FALSE(cubridge::fleet::parse_result_record("{\"node\":\"a.b\"}"));
  EXPECT_FALSE(cubridge::fleet::parse_result_record("not json"));
  EXPECT_FALSE(cubridge::fleet::parse_heartbeat("[]"));
}

}  // namespace
