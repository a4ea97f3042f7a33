// The control side (fleet_controller.hpp) against a real nats-server. The test plays the nodes:
// it publishes their heartbeats, and a fake fleet answers each canary bundle with a result.
#include "nats_server.hpp"
#include "fleet/nats.hpp"

#include <cubridge/fleet/controller.hpp>
#include <cubridge/fleet/subjects.hpp>
#include <cubridge/update/rollback_request.hpp>

#include <gtest/gtest.h>

#include <map>
#include <mutex>

namespace {

using namespace cubridge::fleet;
using namespace std::chrono_literals;
using cubridge::fleet_errc;
using cubridge::gate_outcome;
using cubridge::testing::nats_server;

std::vector<std::byte> bytes_of(std::string_view text) {
  const auto* data = reinterpret_cast<const std::byte*>(text.data());
  return {data, data + text.size()};
}

std::chrono::sys_seconds now_seconds() {
  return std::chrono::floor<std::chrono::seconds>(std::chrono::system_clock::now());
}

// The nodes' side of the server, played by the test.
class fake_fleet {
 public:
  explicit fake_fleet(const nats_server& server)
      : connection_(detail::connect({server.url(), "fake-fleet", false, false})),
        js_(detail::jetstream(connection_.get())) {}

  void heartbeat(const std::string& node, std::chrono::sys_seconds time = now_seconds(),
                 std::map<std::string, std::uint64_t, std::less<>> versions = {},
                 std::string subject = {}) {
    cubridge::fleet::heartbeat beat;
    beat.node = node;
    beat.interval = 5s;
    beat.time = time;
    beat.versions = std::move(versions);
    publish(subject.empty() ? heartbeat_subject(node) : subject, to_json(beat));
  }

  void result(const std::string& module, const std::string& node, std::uint64_t version,
              gate_outcome outcome, std::string reason = {}) {
    result_record r;
    r.node = node;
    r.module = module;
    r.version = version;
    r.serving_version = outcome == gate_outcome::applied ? version : 0;
    r.outcome = outcome;
    r.reason = std::move(reason);
    r.time = now_seconds();
    publish(result_subject(module, node), to_json(r));
  }

  void publish(const std::string& subject, std::string_view text) {
    detail::publish(js_.get(), connection_.get(), subject, bytes_of(text), "record");
  }

  // From now on each canary bundle of `module` is answered with answers_[node] (a node without
  // one stays silent). Answers go out in the order the bundles came.
  void answer(const std::string& module, std::map<std::string, gate_outcome> answers,
              std::uint64_t version) {
    module_ = module;
    answers_ = std::move(answers);
    version_ = version;
    natsSubscription* raw = nullptr;
    const auto subject = bundle_subject_node(module, "*");
    ASSERT_EQ(natsConnection_Subscribe(&raw, connection_.get(), subject.c_str(), on_bundle, this),
              NATS_OK);
    subscription_.reset(raw);
    ASSERT_EQ(natsConnection_FlushTimeout(connection_.get(), 5000), NATS_OK);
  }

  std::vector<std::string> bundles_seen() {
    std::lock_guard lock(mutex_);
    return seen_;
  }

 private:
  static void on_bundle(natsConnection* connection, natsSubscription*, natsMsg* raw, void* self) {
    const detail::message_ptr message(raw);
    auto& fleet = *static_cast<fake_fleet*>(self);
    const std::string subject = natsMsg_GetSubject(raw);
    const std::string node = subject.substr(subject.rfind('.') + 1);
    {
      std::lock_guard lock(fleet.mutex_);
      fleet.seen_.push_back(node);
    }
    const auto it = fleet.answers_.find(node);
    if (it == fleet.answers_.end()) return;
    result_record r;
    r.node = node;
    r.module = fleet.module_;
    r.version = fleet.version_;
    r.outcome = it->second;
    r.serving_version = it->second == gate_outcome::applied ? fleet.version_ : 0;
    if (it->second == gate_outcome::failed) r.reason = "apply_failed";
    r.time = now_seconds();
    const auto text = to_json(r);
    const auto reply = result_subject(fleet.module_, node);
    natsConnection_Publish(connection, reply.c_str(), text.data(), static_cast<int>(text.size()));
  }

  detail::connection_ptr connection_;
  detail::jetstream_ptr js_;
  detail::subscription_ptr subscription_;
  std::string module_;
  std::map<std::string, gate_outcome> answers_;
  std::uint64_t version_ = 0;
  std::mutex mutex_;
  std::vector<std::string> seen_;
};

controller_options options_for(const nats_server& server) {
  controller_options options;
  options.server_url = server.url();
  return options;
}

std::string last_text(const nats_server& server, const std::string& stream,
                      const std::string& subject) {
  const auto connection = detail::connect({server.url(), "check", false, false});
  const auto js = detail::jetstream(connection.get());
  const auto message = detail::last_message(js.get(), stream, subject);
  return message ? std::string(detail::message_text(message.get())) : std::string("(none)");
}

TEST(FleetController, PublishReachesASubscriber) {
  nats_server server;
  controller control(options_for(server));
  EXPECT_EQ(control.max_payload(), std::size_t{16} << 20);
  const auto connection = detail::connect({server.url(), "node", false, false});
  natsSubscription* raw = nullptr;
  ASSERT_EQ(natsConnection_SubscribeSync(&raw, connection.get(), "cubridge.bundle.filters.>"),
            NATS_OK);
  const detail::subscription_ptr subscription(raw);
  ASSERT_EQ(natsConnection_FlushTimeout(connection.get(), 5000), NATS_OK);

  control.publish(bytes_of("bundle v1"), "filters");
  const std::vector<std::string> two{"n1", "n2"};
  control.publish(bytes_of("bundle v2"), "filters", two);
  std::vector<std::pair<std::string, std::string>> got;
  for (int i = 0; i < 3; ++i) {
    natsMsg* message = nullptr;
    ASSERT_EQ(natsSubscription_NextMsg(&message, subscription.get(), 10000), NATS_OK);
    const detail::message_ptr owned(message);
    got.emplace_back(natsMsg_GetSubject(message), detail::message_text(message));
  }
  EXPECT_EQ(got[0].first, bundle_subject_all("filters"));
  EXPECT_EQ(got[0].second, "bundle v1");
  EXPECT_EQ(got[1].first, bundle_subject_node("filters", "n1"));
  EXPECT_EQ(got[2].first, bundle_subject_node("filters", "n2"));
  EXPECT_EQ(got[2].second, "bundle v2");
  // Kept for late joiners.
  EXPECT_EQ(last_text(server, bundle_stream("filters"), bundle_subject_all("filters")),
            "bundle v1");
}

TEST(FleetController, OversizedBundleIsRefusedBeforePublishing) {
  nats_server server;
  controller control(options_for(server));
  const std::vector<std::byte> over((std::size_t{16} << 20) + 1);
  try {
    control.publish(over, "filters");
    FAIL() << "published";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(fleet_errc::oversized)) << e.what();
    EXPECT_NE(std::string(e.what()).find("16777217 bytes"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("16777216 bytes"), std::string::npos) << e.what();
  }
  // Nothing reached the server: not even the module's stream was made.
  const auto connection = detail::connect({server.url(), "check", false, false});
  const auto js = detail::jetstream(connection.get());
  EXPECT_TRUE(detail::stream_subjects(js.get(), bundle_stream("filters"), ">").empty());
}

TEST(FleetController, BadNamesAreRefused) {
  nats_server server;
  controller control(options_for(server));
  EXPECT_THROW(control.publish(bytes_of("x"), "a.b"), cubridge::error);
  const std::vector<std::string> nodes{"n1", "n*"};
  EXPECT_THROW(control.publish(bytes_of("x"), "filters", nodes), cubridge::error);
}

TEST(FleetController, UnreachableServerFailsAtOnce) {
  std::string url;
  {
    nats_server server;
    url = server.url();
  }
  controller_options options;
  options.server_url = url;
  try {
    controller control(options);
    FAIL() << "connected";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(fleet_errc::unreachable)) << e.what();
  }
}

TEST(FleetController, NodesAndResultsFromTheStreams) {
  nats_server server;
  controller control(options_for(server));
  fake_fleet fleet(server);
  const auto now = now_seconds();
  fleet.heartbeat("n2", now - 4s, {{"filters", 3}});
  fleet.heartbeat("n1", now - 2s, {{"filters", 2}});
  fleet.heartbeat("n1", now - 1s, {{"filters", 3}});        // the last one counts
  fleet.heartbeat("n0", now - 60s);                         // silent for 12 intervals
  fleet.heartbeat("n1", now, {}, heartbeat_subject("n9"));  // speaking for another: ignored
  fleet.publish(heartbeat_subject("n8"), "not json");
  const auto nodes = control.nodes(now);
  ASSERT_EQ(nodes.size(), 3u);
  EXPECT_EQ(nodes[0].beat.node, "n0");
  EXPECT_FALSE(nodes[0].live);
  EXPECT_EQ(nodes[0].age, 60s);
  EXPECT_EQ(nodes[1].beat.node, "n1");
  EXPECT_TRUE(nodes[1].live);
  EXPECT_EQ(nodes[1].beat.versions.at("filters"), 3u);
  EXPECT_EQ(nodes[1].age, 1s);
  EXPECT_EQ(nodes[2].beat.node, "n2");

  fleet.result("filters", "n1", 3, gate_outcome::applied);
  fleet.result("filters", "n2", 4, gate_outcome::refused, "bad_signature");
  fleet.result("filters", "n2", 3, gate_outcome::applied);
  fleet.result("other", "n1", 9, gate_outcome::applied);
  const auto results = control.last_results("filters");
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].node, "n1");
  EXPECT_EQ(results[1].node, "n2");
  EXPECT_EQ(results[1].version, 3u);
  // Results already in the stream count for a wait.
  const std::vector<std::string> both{"n1", "n2"};
  EXPECT_EQ(control.wait_for_results("filters", 3, both, 10s).size(), 2u);

  control.set_desired("filters", "all", 3);
  control.set_desired("filters", "canary", 4);
  EXPECT_EQ(control.desired("filters", "all"), 3u);
  const auto modules = control.modules();
  ASSERT_EQ(modules.size(), 1u);
  EXPECT_EQ(modules[0].desired_canary, 4u);
  control.set_desired("filters", "canary", 0);
  EXPECT_EQ(control.desired("filters", "canary"), std::nullopt);
}

struct FleetRollout : ::testing::Test {
  nats_server server;
  controller control{options_for(server)};
  fake_fleet fleet{server};
  cubridge::keypair keys = cubridge::generate_keypair();

  void SetUp() override {
    fleet.heartbeat("n0", now_seconds() - 60s);  // not live: never a canary
    for (const char* node : {"n3", "n1", "n2", "n4"}) fleet.heartbeat(node);
    control.set_desired("filters", "all", 6);
  }
  std::string all_bundle() {
    return last_text(server, bundle_stream("filters"), bundle_subject_all("filters"));
  }
};

TEST_F(FleetRollout, CanariesSucceedThenEveryNode) {
  fleet.answer("filters", {{"n1", gate_outcome::applied}, {"n2", gate_outcome::applied}}, 7);
  canary_policy policy;
  policy.canaries = 2;
  const auto report = control.rollout(bytes_of("v7"), "filters", 7, policy, keys.secret_key);
  EXPECT_TRUE(report.completed) << report.halt_reason;
  EXPECT_EQ(report.canaries, (std::vector<std::string>{"n1", "n2"}));
  EXPECT_EQ(report.results.size(), 2u);
  EXPECT_TRUE(report.rolled_back.empty());
  EXPECT_EQ(all_bundle(), "v7");
  EXPECT_EQ(control.desired("filters", "all"), 7u);
  EXPECT_EQ(control.desired("filters", "canary"), 7u);
  EXPECT_EQ(control.modules().at(0).halted_reason, "");
}

TEST_F(FleetRollout, OneFailureHaltsAndRollsTheCanariesBack) {
  fleet.answer(
      "filters",
      {{"n1", gate_outcome::applied}, {"n2", gate_outcome::failed}, {"n3", gate_outcome::applied}},
      7);
  canary_policy policy;
  policy.canaries = 3;
  const auto report = control.rollout(bytes_of("v7"), "filters", 7, policy, keys.secret_key);
  EXPECT_FALSE(report.completed);
  EXPECT_NE(report.halt_reason.find("canary n2 failed v7: apply_failed"), std::string::npos)
      << report.halt_reason;
  // n3's result came after the halt: it is rolled back too.
  EXPECT_EQ(report.rolled_back, (std::vector<std::string>{"n1", "n3"}));
  EXPECT_EQ(all_bundle(), "(none)");  // never published to everyone
  EXPECT_EQ(control.desired("filters", "all"), 6u);
  EXPECT_EQ(control.desired("filters", "canary"), 6u);
  const auto modules = control.modules();
  EXPECT_EQ(modules.at(0).halted_reason, report.halt_reason);
  EXPECT_EQ(modules.at(0).halted_version, 7u);
  // The canary subjects are purged; the rollback request is signed, for v7.
  EXPECT_EQ(last_text(server, bundle_stream("filters"), bundle_subject_node("filters", "n1")),
            "(none)");
  const auto request = cubridge::verify_rollback_request(
      last_text(server, bundle_stream("filters"), rollback_subject("filters")),
      cubridge::trusted_keys{keys.public_key});
  EXPECT_EQ(request.module, "filters");
  EXPECT_EQ(request.from_version, 7u);
}

TEST_F(FleetRollout, TooFewSuccessesInTheWindowHalts) {
  fleet.answer("filters", {{"n1", gate_outcome::applied}}, 7);  // n2 stays silent
  canary_policy policy;
  policy.canaries = 2;
  policy.window = 2s;  // n1's answer comes in milliseconds; n2's never
  const auto report = control.rollout(bytes_of("v7"), "filters", 7, policy, keys.secret_key);
  EXPECT_FALSE(report.completed);
  EXPECT_EQ(report.halt_reason, "1 of 2 canary results `applied` within 2 s");
  EXPECT_EQ(report.rolled_back, (std::vector<std::string>{"n1", "n2"}));  // n2 may apply late
  EXPECT_EQ(all_bundle(), "(none)");
  EXPECT_EQ(fleet.bundles_seen(), (std::vector<std::string>{"n1", "n2"}));
}

TEST_F(FleetRollout, TooFewLiveNodesPublishNothing) {
  canary_policy policy;
  policy.canaries = 5;  // four are live
  EXPECT_THROW((void)control.rollout(bytes_of("v7"), "filters", 7, policy, keys.secret_key),
               cubridge::error);
  EXPECT_EQ(last_text(server, bundle_stream("filters"), bundle_subject_node("filters", "n1")),
            "(none)");
}

}  // namespace
