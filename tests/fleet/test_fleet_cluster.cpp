// The fleet's bus on a real 3-server JetStream cluster on loopback (tests/nats_server.hpp's
// nats_cluster): the servers elect a meta leader, an R3 stream and an R3 bucket are made; the
// stream's leader is killed and a client given the comma-separated list (parse_server_list,
// fleet/connection.hpp) goes on publishing and reading and updating the bucket through the
// other two; the killed server comes back and catches up. Raw libnats, every wait bounded.
#include "fleet/raw_nats.hpp"
#include "nats_server.hpp"

#include "eventually.hpp"

#include <cubridge/fleet/connection.hpp>
#include <cubridge/fleet/subjects.hpp>

#include <gtest/gtest.h>

#include <string>

namespace {

using namespace cubridge;
using namespace cubridge::testing;
using namespace std::chrono_literals;

// The stream's info, or null (during an election).
nats_owned<jsStreamInfo> stream_info(jsCtx* js, const std::string& stream) {
  jsStreamInfo* raw = nullptr;
  jsErrCode code = static_cast<jsErrCode>(0);
  if (js_GetStreamInfo(&raw, js, stream.c_str(), nullptr, &code) != NATS_OK) return nullptr;
  return nats_owned<jsStreamInfo>(raw);
}

// Which of the fixture's servers ("cubridge-test-N") leads `stream`; -1 when none does.
int leader_of(jsCtx* js, const std::string& stream) {
  const auto info = stream_info(js, stream);
  if (!info || !info->Cluster || !info->Cluster->Leader) return -1;
  const std::string name = info->Cluster->Leader;
  const std::string prefix = "cubridge-test-";
  if (!name.starts_with(prefix)) return -1;
  return std::stoi(name.substr(prefix.size())) - 1;
}

// Whether every replica of `stream` is current and holds `messages` (its leader says so).
bool caught_up(jsCtx* js, const std::string& stream, std::uint64_t messages) {
  const auto info = stream_info(js, stream);
  if (!info || !info->Cluster || !info->Cluster->Leader || info->State.Msgs != messages)
    return false;
  if (info->Cluster->ReplicasLen != nats_cluster::size - 1) return false;
  for (int i = 0; i < info->Cluster->ReplicasLen; ++i) {
    const auto* peer = info->Cluster->Replicas[i];
    if (!peer->Current || peer->Offline || peer->Lag != 0) return false;
  }
  return true;
}

// With the subject as the message id: a publish whose ack was lost (a wait cut short on a loaded
// machine) can be tried again without storing the message twice (the stream's duplicate window).
bool publish(jsCtx* js, const std::string& subject, const std::string& data) {
  jsPubAck* ack = nullptr;
  jsErrCode code = static_cast<jsErrCode>(0);
  jsPubOptions options;
  jsPubOptions_Init(&options);
  options.MsgId = subject.c_str();
  const auto s = js_Publish(&ack, js, subject.c_str(), data.data(), static_cast<int>(data.size()),
                            &options, &code);
  jsPubAck_Destroy(ack);
  return s == NATS_OK;
}

// A client of every server of the cluster, as the fleet's sides connect: the list parsed.
nats_client cluster_client(const nats_cluster& cluster) {
  connect_request request;
  request.urls = fleet::parse_server_list(cluster.urls());
  request.max_reconnect = 600;  // 100 ms apart: a minute of reconnecting
  return connect_to(request);
}

TEST(fleet_cluster, three_servers_make_r3_streams_and_an_r3_bucket) {
  nats_cluster cluster;
  EXPECT_EQ(fleet::parse_server_list(cluster.urls()).size(), 3u);
  auto client = cluster_client(cluster);
  ASSERT_TRUE(client.connected()) << client.error;
  const auto js = jetstream(client.get());
  const std::string stream(fleet::result_stream);
  // The meta leader answered; peers may still be registering: an R3 stream is made once they
  // are (bounded).
  ASSERT_TRUE(eventually(
      [&] { return add_stream(js.get(), stream, "cubridge.result.>", 16, 3) == NATS_OK; }, 30s))
      << cluster.log_text();
  ASSERT_EQ(add_bucket(js.get(), 3), NATS_OK);
  const auto info = stream_info(js.get(), stream);
  ASSERT_TRUE(info && info->Cluster);
  EXPECT_EQ(info->Config->Replicas, 3);
  EXPECT_EQ(info->Cluster->ReplicasLen, 2);
  EXPECT_GE(leader_of(js.get(), stream), 0);
  const auto bucket = stream_info(js.get(), std::string(fleet::control_bucket_stream));
  ASSERT_TRUE(bucket);
  EXPECT_EQ(bucket->Config->Replicas, 3);
  EXPECT_TRUE(eventually([&] { return caught_up(js.get(), stream, 0); }, 30s));
}

TEST(fleet_cluster, the_stream_leader_killed_publish_and_the_bucket_go_on_and_it_catches_up) {
  nats_cluster cluster;
  auto client = cluster_client(cluster);
  ASSERT_TRUE(client.connected()) << client.error;
  const auto js = jetstream(client.get(), 1000);  // short waits: an election is retried
  const std::string stream(fleet::result_stream);
  ASSERT_TRUE(eventually(
      [&] { return add_stream(js.get(), stream, "cubridge.result.>", 16, 3) == NATS_OK; }, 30s))
      << cluster.log_text();
  nats_owned<kvStore> kv;
  ASSERT_EQ(add_bucket(js.get(), 3, &kv), NATS_OK);
  const auto key = fleet::desired_key("m");
  std::uint64_t revision = 0;
  ASSERT_EQ(kvStore_PutString(&revision, kv.get(), key.c_str(), "v1"), NATS_OK);
  std::uint64_t published = 0;
  // Every request of the client waits 1 s: on a loaded machine one may time out and is tried
  // again (the message ids make that safe), within bounds.
  const auto published_once = [&](const std::string& node) {
    return eventually([&] { return publish(js.get(), fleet::result_subject("m", node), "r"); },
                      30s);
  };
  for (int i = 0; i < 5; ++i, ++published) ASSERT_TRUE(published_once("node-" + std::to_string(i)));
  ASSERT_TRUE(eventually([&] { return caught_up(js.get(), stream, published); }, 30s));

  const int leader = leader_of(js.get(), stream);
  ASSERT_GE(leader, 0);
  cluster.kill(static_cast<std::size_t>(leader));

  // Publishing goes on once the other two elected a leader (each attempt waits 1 s).
  ASSERT_TRUE(published_once("after")) << cluster.log_text();
  ++published;
  int new_leader = -1;
  EXPECT_TRUE(eventually([&] { return (new_leader = leader_of(js.get(), stream)) >= 0; }, 30s));
  EXPECT_NE(new_leader, leader);
  for (int i = 0; i < 3; ++i, ++published) ASSERT_TRUE(published_once("more-" + std::to_string(i)));
  // The bucket: read, and updated by compare-and-set, through the two servers left.
  ASSERT_TRUE(eventually([&] { return kv_text(kv.get(), key) == "v1"; }, 30s));
  std::uint64_t updated = 0;
  ASSERT_TRUE(eventually(
      [&] {
        return kvStore_UpdateString(&updated, kv.get(), key.c_str(), "v2", revision) == NATS_OK;
      },
      30s));
  EXPECT_GT(updated, revision);
  EXPECT_TRUE(eventually([&] { return kv_text(kv.get(), key) == "v2"; }, 30s));
  // A stale revision is still refused: compare-and-set holds across the failover.
  std::uint64_t stale = 0;
  EXPECT_NE(kvStore_UpdateString(&stale, kv.get(), key.c_str(), "v3", revision), NATS_OK);

  // The killed server comes back on its ports and store and catches up.
  cluster.start(static_cast<std::size_t>(leader));
  EXPECT_TRUE(eventually([&] { return caught_up(js.get(), stream, published); }, 30s))
      << cluster.log_text();
  EXPECT_TRUE(eventually(
      [&] { return caught_up(js.get(), std::string(fleet::control_bucket_stream), 2); }, 30s));
}

TEST(fleet_cluster, a_client_of_one_server_is_refused_when_it_is_gone) {
  // The comma-separated list is what survives a server: a client that knows only the killed
  // one has nowhere to go.
  nats_cluster cluster;
  cluster.stop(0);
  auto alone = connect_to({{cluster.url(0)}, "", "", {}});
  EXPECT_FALSE(alone.connected());
  auto listed = cluster_client(cluster);
  EXPECT_TRUE(listed.connected()) << listed.error;
  cluster.start(0);
  cluster.wait_for_meta_leader();
}

}  // namespace

// --- the control plane on the cluster ---------------------------------------------------------

#include <cubridge/fleet/agent.hpp>
#include <cubridge/fleet/controller.hpp>

#include "bundle/source_bundles.hpp"
#include "temp_dir.hpp"

#include <future>
#include <map>
#include <mutex>

namespace {

// Counts each version's applies: a double apply shows as a count of 2.
class counting_sink final : public module_sink {
 public:
  std::optional<compute_capability> device_capability() const override {
    return compute_capability{9, 0};
  }
  std::uint64_t current_version(std::string_view) const override {
    std::lock_guard lock(mutex_);
    return serving_;
  }
  sink_result apply(const verified_bundle& bundle, apply_rule rule) override {
    std::lock_guard lock(mutex_);
    if (rule == apply_rule::above_serving && bundle.version() <= serving_)
      return not_newer_result(bundle.manifest.name, bundle.version(), serving_);
    serving_ = bundle.version();
    ++applies_[serving_];
    return {gate_reason::none, serving_, {}};
  }
  sink_result rollback(std::string_view) override {
    return {gate_reason::no_previous_version, current_version({}), "none"};
  }
  std::vector<module_report> status() const override { return {{"filters", current_version({})}}; }
  std::map<std::uint64_t, int> applies() const {
    std::lock_guard lock(mutex_);
    return applies_;
  }

 private:
  mutable std::mutex mutex_;
  std::uint64_t serving_ = 0;
  std::map<std::uint64_t, int> applies_;
};

// The control side of `cluster` (R3 streams and bucket), made once the cluster takes them: the
// meta leader may answer while the peers still register for an R3 stream. Null (with why in
// `why`) when it cannot be made within 30 s.
std::unique_ptr<fleet::controller> cluster_controller(const nats_cluster& cluster,
                                                      const keypair& operator_keys,
                                                      std::string& why) {
  fleet::controller_options c;
  c.bus.servers = cluster.urls();
  c.bus.replicas = 3;
  c.operator_keys.add(operator_keys.public_key);
  std::unique_ptr<fleet::controller> control;
  (void)eventually(
      [&] {
        try {
          control = std::make_unique<fleet::controller>(c);
          return true;
        } catch (const std::exception& e) {
          why = e.what();
          return false;
        }
      },
      30s);
  return control;
}

// Nodes of the cluster, each an agent (default settings) over a counting sink, enrolled.
struct cluster_nodes {
  std::vector<std::shared_ptr<counting_sink>> sinks;
  std::vector<std::unique_ptr<fleet_agent>> agents;

  cluster_nodes(const nats_cluster& cluster, fleet::controller& control,
                const keypair& operator_keys, const temp_dir& dir,
                std::initializer_list<const char*> ids) {
    for (const char* node : ids) {
      const auto keys = generate_keypair();
      const auto key_file = dir.path / (std::string(node) + ".key");
      write_key_file(key_file, keys.secret_key);
      control.enroll(node, keys.public_key, {}, operator_keys.secret_key);
      sinks.push_back(std::make_shared<counting_sink>());
      update_gate_options policy;
      policy.keys.add(operator_keys.public_key);
      policy.persist_state = false;
      fleet_agent_options o;
      o.bus.servers = cluster.urls();
      o.node = node;
      o.node_key_file = key_file;
      o.modules = {"filters"};
      agents.push_back(std::make_unique<fleet_agent>(update_gate::create(sinks.back(), policy), o));
      agents.back()->start();
    }
  }
  ~cluster_nodes() {
    for (auto& a : agents) a->stop();
  }
  // Whether every node serves `v` within `within`.
  [[nodiscard]] bool serve(std::uint64_t v, std::chrono::milliseconds within) const {
    return eventually(
        [&] {
          for (const auto& s : sinks)
            if (s->current_version({}) != v) return false;
          return true;
        },
        within);
  }
};

TEST(fleet_cluster, the_bundle_streams_leader_killed_mid_rollout_every_node_converges_once) {
  nats_cluster cluster;
  temp_dir dir;
  const auto operator_keys = generate_keypair();
  std::string why;
  const auto control = cluster_controller(cluster, operator_keys, why);
  ASSERT_TRUE(control) << why;
  cluster_nodes nodes(cluster, *control, operator_keys, dir, {"n1", "n2"});
  auto& sinks = nodes.sinks;
  const auto serve = [&](std::uint64_t v, std::chrono::milliseconds within) {
    return nodes.serve(v, within);
  };
  (void)control->publish(cubridge::testing::source_bundle("filters", 1, operator_keys.secret_key),
                         operator_keys.secret_key);
  ASSERT_TRUE(serve(1, 30s));
  (void)control->publish(cubridge::testing::source_bundle("filters", 2, operator_keys.secret_key),
                         operator_keys.secret_key);
  // The bundle stream's leader dies at once, before the nodes fetched (or while they do).
  auto client = cluster_client(cluster);
  ASSERT_TRUE(client.connected()) << client.error;
  const auto js = jetstream(client.get(), 1000);
  const int leader = leader_of(js.get(), fleet::bundle_stream("filters"));
  ASSERT_GE(leader, 0);
  cluster.kill(static_cast<std::size_t>(leader));
  const auto killed = std::chrono::steady_clock::now();
  EXPECT_TRUE(serve(2, 10s)) << "not converged within 10 s of the leader's death";
  const auto took = std::chrono::steady_clock::now() - killed;
  std::printf("every node on v2 %.0f ms after the bundle stream's leader was killed\n",
              std::chrono::duration<double, std::milli>(took).count());
  EXPECT_LT(took, 10s);
  for (const auto& s : sinks) {
    const auto applies = s->applies();
    EXPECT_EQ(applies.at(1), 1);
    EXPECT_EQ(applies.at(2), 1) << "v2 applied twice";
  }
}

}  // namespace

namespace {

// Failover under default settings (docs/fleet.md, "Failover"): the times are printed for the
// record and asserted with a loaded CI machine's margin.
TEST(fleet_cluster, a_publish_with_the_first_server_of_the_list_down) {
  nats_cluster cluster;
  const auto operator_keys = generate_keypair();
  std::string why;
  auto control = cluster_controller(cluster, operator_keys, why);
  ASSERT_TRUE(control) << why;
  (void)control->publish(cubridge::testing::source_bundle("filters", 1, operator_keys.secret_key),
                         operator_keys.secret_key);
  control.reset();
  cluster.kill(0);  // the first of the list
  // The cluster carries on with two servers (a meta leader among them) before the clock starts:
  // what is timed is a publish while a server is down, not an election.
  cluster.wait_for_meta_leader();
  auto client = cluster_client(cluster);
  ASSERT_TRUE(client.connected()) << client.error;
  const auto js = jetstream(client.get(), 1000);
  const auto killed = std::chrono::steady_clock::now();
  for (const auto& stream :
       {std::string(fleet::result_stream), std::string(fleet::heartbeat_stream),
        std::string(fleet::control_bucket_stream), fleet::bundle_stream("filters")}) {
    ASSERT_TRUE(eventually([&] { return leader_of(js.get(), stream) > 0; }, 30s)) << stream;
    std::printf("%s has a leader %.0f ms after the kill\n", stream.c_str(),
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - killed)
                    .count());
  }
  const auto bundle = cubridge::testing::source_bundle("filters", 2, operator_keys.secret_key);
  const auto start = std::chrono::steady_clock::now();
  fleet::controller_options c;
  c.bus.servers = cluster.urls();
  c.bus.replicas = 3;
  c.operator_keys.add(operator_keys.public_key);
  fleet::controller again(c);
  const auto report = again.publish(bundle, operator_keys.secret_key);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(report.completed);
  std::printf("publish with the first server down: %.0f ms (connect, streams, store, write)\n",
              std::chrono::duration<double, std::milli>(took).count());
  // 9 ms when the cluster has settled; one JetStream request's timeout (5 s) when a request
  // still met a group electing its leader (the streams' leaders as reported can be a moment
  // ahead of the groups): the server's election, not the client's failover, which the hung
  // first server of FleetCli.AServerListWhoseFirstServerHangsConnectsWithinASecond times.
  EXPECT_LT(took, 12s);
}

// The leader of the desired state's bucket killed mid-rollout, as the nodes (re)start: each
// reads the desired state and fetches the bundle through the two servers left, under default
// settings. The time from the kill to every node serving the new version is printed.
TEST(fleet_cluster, the_buckets_leader_killed_mid_rollout_every_node_converges) {
  nats_cluster cluster;
  temp_dir dir;
  const auto operator_keys = generate_keypair();
  std::string why;
  const auto control = cluster_controller(cluster, operator_keys, why);
  ASSERT_TRUE(control) << why;
  cluster_nodes nodes(cluster, *control, operator_keys, dir, {"n1", "n2", "n3"});
  auto& agents = nodes.agents;
  const auto serve = [&](std::uint64_t v, std::chrono::milliseconds within) {
    return nodes.serve(v, within);
  };
  (void)control->publish(cubridge::testing::source_bundle("filters", 1, operator_keys.secret_key),
                         operator_keys.secret_key);
  ASSERT_TRUE(serve(1, 30s));
  for (auto& a : agents) a->stop();  // the nodes go down for a moment ...
  (void)control->publish(cubridge::testing::source_bundle("filters", 2, operator_keys.secret_key),
                         operator_keys.secret_key);
  auto client = cluster_client(cluster);
  ASSERT_TRUE(client.connected()) << client.error;
  const auto js = jetstream(client.get(), 1000);
  const int leader = leader_of(js.get(), std::string(fleet::control_bucket_stream));
  ASSERT_GE(leader, 0);
  cluster.kill(static_cast<std::size_t>(leader));  // ... and the bucket's leader dies
  const auto killed = std::chrono::steady_clock::now();
  for (auto& a : agents) a->start();  // ... as they come back
  // When the bucket has its new leader (the cluster's election, which no client shortens).
  auto elected = std::async(std::launch::async, [&] {
    const auto watcher = jetstream(client.get(), 200);
    (void)eventually(
        [&] {
          const int now_leading =
              leader_of(watcher.get(), std::string(fleet::control_bucket_stream));
          return now_leading >= 0 && now_leading != leader;
        },
        30s);
    return std::chrono::steady_clock::now() - killed;
  });
  EXPECT_TRUE(serve(2, 30s)) << "not converged within 30 s of the leader's death";
  const auto took = std::chrono::steady_clock::now() - killed;
  const auto election = elected.get();
  std::printf(
      "every node on v2 %.0f ms after the bucket's leader (server %d) was killed; "
      "the new leader was elected after %.0f ms\n",
      std::chrono::duration<double, std::milli>(took).count(), leader + 1,
      std::chrono::duration<double, std::milli>(election).count());
  // The goal is 5 s from the kill (docs/fleet.md, "Failover"); the nodes need no leader (direct
  // gets, which any replica answers), so they converge before the 5-6 s election of nats-server
  // 2.9.10 ends: ~2 s here. A loaded CI machine's margin on top.
  EXPECT_LT(took, 10s);
  (void)election;
}

}  // namespace
