#pragma once
// The fleet tests' common ground (test_fleet_control_plane.cpp, test_fleet_waves.cpp): a
// fleet::controller as the operator and fleet_agents over update_gates and recording sinks,
// against one real nats-server per test (tests/nats_server.hpp); an attacker who can connect
// writes through raw libnats (src/fleet/nats.hpp).
#include "fleet/nats.hpp"

#include <cubridge/bundle/detail/signing.hpp>
#include <cubridge/fleet/agent.hpp>
#include <cubridge/fleet/controller.hpp>
#include <cubridge/fleet/desired_state.hpp>
#include <cubridge/fleet/error.hpp>
#include <cubridge/fleet/records.hpp>
#include <cubridge/fleet/signed_record.hpp>
#include <cubridge/fleet/subjects.hpp>
#include <cubridge/update/module_sink.hpp>
#include <cubridge/update/update_gate.hpp>

#include "bundle/source_bundles.hpp"
#include "eventually.hpp"
#include "nats_server.hpp"
#include "temp_dir.hpp"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <latch>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace cubridge::testing::fleet_fixture {

using namespace std::chrono_literals;
using cubridge::fleet_errc;
using cubridge::gate_outcome;
using cubridge::fleet::controller;
using cubridge::fleet::desired_state;
using cubridge::fleet::result_record;
using cubridge::fleet::rollout_phase;
using cubridge::testing::eventually;
namespace fleet = cubridge::fleet;
namespace nats = cubridge::fleet::detail;
using steady = std::chrono::steady_clock;
using versions = std::vector<std::uint64_t>;

// `statement` throws cubridge::error with fleet code `code` and a message holding `text`.
#define EXPECT_FLEET_ERROR(statement, code, text)                                           \
  do {                                                                                      \
    try {                                                                                   \
      (void)(statement);                                                                    \
      ADD_FAILURE() << #statement " did not throw; expected " << cubridge::to_string(code); \
    } catch (const cubridge::error& e_) {                                                   \
      EXPECT_TRUE(e_.is(code)) << "expected " << cubridge::to_string(code) << ", got "      \
                               << e_.what();                                                \
      EXPECT_NE(std::string(e_.what()).find(text), std::string::npos) << e_.what();         \
    }                                                                                       \
  } while (false)

std::string digest_of(std::span<const std::byte> bytes) {
  return cubridge::detail::sha256_hex(bytes);
}

std::span<const std::byte> bytes_of(const std::string& text) {
  return std::as_bytes(std::span(text.data(), text.size()));
}

bool never_goes_down(const versions& sequence) {
  return std::is_sorted(sequence.begin(), sequence.end());
}

bool holds(const versions& sequence, std::uint64_t version) {
  return std::find(sequence.begin(), sequence.end(), version) != sequence.end();
}

// A module_sink that keeps, per module, the serving and previous versions as a hot module does,
// and records every version handed to apply() and every version that served after a change. It
// can be told to refuse one version (as a failed smoke test), after a delay, and to lose what
// it serves (a service restarted empty).
class recording_sink final : public cubridge::module_sink {
 public:
  std::optional<cubridge::compute_capability> device_capability() const override {
    return cubridge::compute_capability{9, 0};
  }
  std::uint64_t current_version(std::string_view name) const override {
    std::lock_guard lock(mutex_);
    const auto it = modules_.find(name);
    return it == modules_.end() ? 0 : it->second.current;
  }
  cubridge::sink_result apply(const cubridge::verified_bundle& bundle,
                              cubridge::apply_rule rule) override {
    const auto& name = bundle.manifest.name;
    std::chrono::milliseconds delay{0};
    bool refuse = false;
    {
      std::lock_guard lock(mutex_);
      modules_[name].offered.push_back(bundle.version());
      refuse = bundle.version() == failing_;
      if (refuse) delay = failing_delay_;
    }
    if (delay.count() > 0) std::this_thread::sleep_for(delay);  // a slow smoke test
    std::lock_guard lock(mutex_);
    auto& m = modules_[name];
    if (refuse) return {cubridge::gate_reason::apply_failed, m.current, "smoke test failed"};
    if (rule == cubridge::apply_rule::above_serving && bundle.version() <= m.current)
      return cubridge::not_newer_result(name, bundle.version(), m.current);
    m.previous = m.current;
    m.current = bundle.version();
    m.served.push_back(m.current);
    m.first_served.try_emplace(m.current, std::chrono::system_clock::now());
    m.payloads.push_back(bundle.manifest.payload_sha256);
    return {cubridge::gate_reason::none, m.current, {}};
  }
  cubridge::sink_result rollback(std::string_view name) override {
    std::lock_guard lock(mutex_);
    const auto it = modules_.find(name);
    if (it == modules_.end()) return {cubridge::gate_reason::unknown_module, 0, "no such module"};
    auto& m = it->second;
    if (m.previous == 0) return {cubridge::gate_reason::no_previous_version, m.current, "none"};
    std::swap(m.current, m.previous);
    m.served.push_back(m.current);
    return {cubridge::gate_reason::none, m.current, {}};
  }
  std::vector<cubridge::module_report> status() const override {
    std::lock_guard lock(mutex_);
    std::vector<cubridge::module_report> out;
    for (const auto& [name, m] : modules_)
      out.push_back({name, m.current, {m.previous, m.current}, 0, {}});
    return out;
  }

  /// apply() refuses `version` (0: none), after `delay`.
  void fail(std::uint64_t version, std::chrono::milliseconds delay = {}) {
    std::lock_guard lock(mutex_);
    failing_ = version;
    failing_delay_ = delay;
  }
  /// The module serves nothing any more (its service lost it).
  void forget(const std::string& name) {
    std::lock_guard lock(mutex_);
    modules_[name].current = modules_[name].previous = 0;
  }
  /// Versions that served, in order, one per change.
  versions served(const std::string& name) const {
    std::lock_guard lock(mutex_);
    const auto it = modules_.find(name);
    return it == modules_.end() ? versions{} : it->second.served;
  }
  /// Versions handed to apply(), whatever became of them.
  versions offered(const std::string& name) const {
    std::lock_guard lock(mutex_);
    const auto it = modules_.find(name);
    return it == modules_.end() ? versions{} : it->second.offered;
  }
  /// When `version` first served; nullopt when it never did.
  std::optional<std::chrono::system_clock::time_point> first_served(const std::string& name,
                                                                    std::uint64_t version) const {
    std::lock_guard lock(mutex_);
    const auto it = modules_.find(name);
    if (it == modules_.end()) return std::nullopt;
    const auto at = it->second.first_served.find(version);
    return at == it->second.first_served.end() ? std::nullopt : std::optional(at->second);
  }
  /// SHA-256 of each payload applied, in order.
  std::vector<std::string> payloads(const std::string& name) const {
    std::lock_guard lock(mutex_);
    const auto it = modules_.find(name);
    return it == modules_.end() ? std::vector<std::string>{} : it->second.payloads;
  }

 private:
  struct module_state {
    std::uint64_t current = 0, previous = 0;
    versions served, offered;
    std::vector<std::string> payloads;
    std::map<std::uint64_t, std::chrono::system_clock::time_point> first_served;
  };
  mutable std::mutex mutex_;
  std::map<std::string, module_state, std::less<>> modules_;
  std::uint64_t failing_ = 0;
  std::chrono::milliseconds failing_delay_{0};
};

// One node: its key, its sink, its gate and its agent (declared so that the agent goes first).
struct fleet_node {
  std::string id;
  std::filesystem::path key_file;
  cubridge::public_key key;
  cubridge::fleet_agent_options options;
  cubridge::update_gate_options gate_options;
  std::shared_ptr<recording_sink> sink;
  std::shared_ptr<cubridge::update_gate> gate;
  std::unique_ptr<cubridge::fleet_agent> agent;
};

// What a node is made with.
struct node_spec {
  std::string id;
  std::vector<std::string> modules;
  std::chrono::milliseconds heartbeat{5000};
  std::filesystem::path state_file;  // empty: the replay state in memory only
  cubridge::health_probe_fn probe;   // none: healthy
};

// Someone who can connect to the server but holds no operator key: raw libnats.
struct raw_bus {
  nats::connection_ptr connection;
  nats::jetstream_ptr js;
  nats::kv_store_ptr bucket;

  explicit raw_bus(const std::string& url) {
    nats::connect_options o;
    o.bus.servers = url;
    o.name = "attacker";
    o.reconnect = false;
    connection = nats::connect(o);
    js = nats::jetstream(connection.get());
    bucket = nats::bind_control_bucket(js.get());
  }
  void publish(const std::string& subject, std::span<const std::byte> data) {
    nats::publish(js.get(), connection.get(), subject, data, "attacker's message");
  }
  void publish(const std::string& subject, const std::string& text) {
    publish(subject, bytes_of(text));
  }
  void put(const std::string& key, const std::string& value) {
    std::uint64_t revision = 0;
    nats::check(kvStore_Put(&revision, bucket.get(), key.c_str(), value.data(),
                            static_cast<int>(value.size())),
                "kvStore_Put", "key " + key);
  }
  std::optional<std::string> get(const std::string& key) {
    const auto value = nats::kv_get(bucket.get(), key);
    return value ? std::optional(value->value) : std::nullopt;
  }
};

class FleetControlPlane : public ::testing::Test {
 protected:
  // Declared in the order they depend on each other: nodes go first, the server and the
  // directory last.
  cubridge::testing::temp_dir dir;
  cubridge::testing::nats_server server;
  cubridge::keypair operator_keys = cubridge::generate_keypair();
  cubridge::keypair stranger = cubridge::generate_keypair();
  std::vector<cubridge::public_key> more_operators;  // trusted besides operator_keys
  std::unique_ptr<controller> control;
  std::vector<std::unique_ptr<fleet_node>> nodes;

  void SetUp() override { control = make_controller(); }
  // What the server said, when a test failed.
  void TearDown() override {
    if (!HasFailure()) return;
    const auto log = server.log_text();
    std::fprintf(stderr, "--- nats-server log (last 16 KiB) ---\n%s\n",
                 log.substr(log.size() > 16384 ? log.size() - 16384 : 0).c_str());
  }

  std::unique_ptr<controller> make_controller() const {
    fleet::controller_options o;
    o.bus.servers = server.url();
    o.operator_keys.add(operator_keys.public_key);
    for (const auto& key : more_operators) o.operator_keys.add(key);
    return std::make_unique<controller>(std::move(o));
  }
  cubridge::trusted_keys operator_trust() const {
    cubridge::trusted_keys keys;
    keys.add(operator_keys.public_key);
    for (const auto& key : more_operators) keys.add(key);
    return keys;
  }

  std::vector<std::byte> bundle(const std::string& module, std::uint64_t version,
                                std::size_t padding = 0) const {
    return cubridge::testing::source_bundle(module, version, operator_keys.secret_key, "sm_90",
                                            padding);
  }

  // A node with its own key (0600), enrolled, over a fresh gate and sink; its agent started and
  // connected.
  fleet_node& add_node(const node_spec& spec) {
    auto node = std::make_unique<fleet_node>();
    node->id = spec.id;
    node->key_file = dir.path / (spec.id + ".key");
    auto pair = cubridge::generate_keypair();
    cubridge::write_key_file(node->key_file, pair.secret_key);
    node->key = pair.public_key;
    control->enroll(spec.id, node->key, {}, operator_keys.secret_key);
    node->options.bus.servers = server.url();
    node->options.node = spec.id;
    node->options.node_key_file = node->key_file;
    node->options.modules = spec.modules;
    node->options.heartbeat_interval = spec.heartbeat;
    node->options.health_probe = spec.probe;
    node->gate_options.keys = operator_trust();
    node->gate_options.persist_state = false;
    node->gate_options.state_file = spec.state_file;
    renew_gate(*node);
    start_agent(*node);
    nodes.push_back(std::move(node));
    return *nodes.back();
  }
  // A fresh sink and gate (the node's service restarted; its state file, if any, kept).
  static void renew_gate(fleet_node& node) {
    node.agent.reset();
    node.gate.reset();
    node.sink = std::make_shared<recording_sink>();
    node.gate = cubridge::update_gate::create(node.sink, node.gate_options);
  }
  // A new agent over the node's gate, started and connected.
  static void start_agent(fleet_node& node) {
    node.agent.reset();
    node.agent = std::make_unique<cubridge::fleet_agent>(node.gate, node.options);
    node.agent->start();
    EXPECT_TRUE(eventually([&] { return node.agent->connected(); }, 10s))
        << node.id << " never connected: " << node.agent->last_problem();
  }

  std::vector<std::string> ids(const std::vector<fleet_node*>& some) const {
    std::vector<std::string> out;
    for (const auto* n : some) out.push_back(n->id);
    return out;
  }
  std::vector<fleet_node*> all_nodes() const {
    std::vector<fleet_node*> out;
    for (const auto& n : nodes) out.push_back(n.get());
    return out;
  }
  static bool serve(const std::vector<fleet_node*>& some, const std::string& module,
                    std::uint64_t version) {
    return std::all_of(some.begin(), some.end(), [&](const fleet_node* n) {
      return n->sink->current_version(module) == version;
    });
  }
  // Whether every node of `some` serves `version` of `module` within `deadline`.
  static bool converge(const std::vector<fleet_node*>& some, const std::string& module,
                       std::uint64_t version, std::chrono::milliseconds deadline = 10s) {
    return eventually([&] { return serve(some, module, version); }, deadline);
  }
  static std::string serving_text(const std::vector<fleet_node*>& some, const std::string& module) {
    std::string text;
    for (const auto* n : some)
      text += n->id + "=v" + std::to_string(n->sink->current_version(module)) + " (" +
              n->agent->last_problem() + ") ";
    return text;
  }

  // Every value the bucket still holds for the module's desired state, oldest first, verified.
  std::vector<desired_state> desired_history(raw_bus& bus, const std::string& module) const {
    kvEntryList list{};
    kvWatchOptions o;
    kvWatchOptions_Init(&o);
    o.Timeout = 5000;
    nats::check(kvStore_History(&list, bus.bucket.get(), fleet::desired_key(module).c_str(), &o),
                "kvStore_History", module);
    std::vector<desired_state> out;
    const auto keys = operator_trust();
    for (int i = 0; i < list.Count; ++i) {
      kvEntry* e = list.Entries[i];
      if (kvEntry_Operation(e) != kvOp_Put) continue;
      const std::string_view value(static_cast<const char*>(kvEntry_Value(e)),
                                   static_cast<std::size_t>(kvEntry_ValueLen(e)));
      const auto opened = fleet::open_record(value, fleet::record_kind::desired_state, keys);
      auto state = opened ? fleet::parse_desired_state(opened->body) : std::nullopt;
      EXPECT_TRUE(state) << "the bucket holds a desired state of " << module << " that is refused";
      if (state) out.push_back(std::move(*state));
    }
    kvEntryList_Destroy(&list);
    return out;
  }

  // A heartbeat of `node`, saying it follows `module` at `version`, signed with `key`; `named`
  // is the node its body names (default: `node`).
  static std::string heartbeat_of(const std::string& node, const std::string& module,
                                  std::uint64_t version, const cubridge::secret_key& key,
                                  const std::string& named = {}) {
    fleet::heartbeat h;
    h.node = named.empty() ? node : named;
    h.gpu = "sm_90";
    h.interval = 1h;
    h.time = std::chrono::floor<std::chrono::seconds>(std::chrono::system_clock::now());
    h.versions[module] = version;
    return fleet::sign_record(fleet::record_kind::heartbeat, fleet::to_json(h), key);
  }
};

}  // namespace cubridge::testing::fleet_fixture
