// A fleet node for the process tests (tests/update/test_fleet_processes.cpp) and the scale
// benchmark (bench/fleet/bench_fleet.cpp): a fleet_agent over a recording sink, optionally
// with an update_endpoint over the same sink (the HTTP comparison). No GPU: the sink records
// versions and payload sizes and never loads a payload.
//
//   cubridge_test_fleet_node --server URL --node ID --trusted-key FILE --node-key FILE
//       --state-file F --module NAME [--apply-delay-ms N] [--stall-before-apply-ms N]
//       [--fail-version V] [--http-port P] [--credentials FILE] [--ca FILE] [--api-prefix P]
//       [--heartbeat-ms N] [--max-bundle-bytes N] [--output FILE] [--unhealthy-version V]
//
// --unhealthy-version V: the node's health probe says unhealthy while V serves (a version that
// passed its smoke test and gives wrong answers).
// The agent and the endpoint share one update_gate: one lock per module, one replay record.
//
// The sink keeps its serving and previous versions in F.serving, written atomically at each
// promote, as a service reloads what it promoted last: a node killed and restarted comes back
// serving what it served. --apply-delay-ms waits after the promote, before the sink returns (a
// kill then lands between the promote and the record and ack); --stall-before-apply-ms waits
// before the promote, after the gate recorded the version (a kill then lands between the
// state write and the promote). One line per event, flushed:
//   ready node=ID http=PORT             the agent is connected and watching
//   apply VERSION                       the sink was called
//   promoted VERSION                    the sink serves it (F.serving written)
//   failed VERSION                      the sink refused it (--fail-version)
//   rolled_back VERSION                 the sink went back to VERSION
//   record N OUTCOME VERSION SERVING REASON   the agent's N-th result record
// (records are polled: when two come within one poll, only the second is printed, with its N).
// Exits 0 on SIGTERM or SIGINT after stopping the agent and the endpoint.
#include <cubridge/fleet/agent.hpp>
#include <cubridge/fleet/connection.hpp>
#include <cubridge/update/update_endpoint.hpp>

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace {

using namespace std::chrono_literals;

std::atomic<bool> stop_requested{false};
extern "C" void on_stop_signal(int) {
  stop_requested = true;
}

// Where event lines go: stdout or --output, line by line, flushed (the tests read them).
class event_log {
 public:
  void open(const std::string& path) {
    if (path.empty()) return;
    file_ = std::fopen(path.c_str(), "a");
    if (!file_) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  }
  void line(const std::string& text) {
    std::lock_guard lock(mutex_);
    std::FILE* out = file_ ? file_ : stdout;
    std::fputs((text + "\n").c_str(), out);
    std::fflush(out);
  }

 private:
  std::mutex mutex_;
  std::FILE* file_ = nullptr;
};

// A sink that records versions durably (file `serving_file`) and never loads anything.
class recording_sink final : public cubridge::module_sink {
 public:
  recording_sink(std::string module, std::filesystem::path serving_file, event_log& log,
                 std::chrono::milliseconds apply_delay, std::chrono::milliseconds stall,
                 std::uint64_t fail_version)
      : module_(std::move(module)),
        file_(std::move(serving_file)),
        log_(log),
        apply_delay_(apply_delay),
        stall_(stall),
        fail_version_(fail_version) {
    std::ifstream in(file_);
    in >> current_ >> previous_;
    if (!in) current_ = previous_ = 0;
  }
  std::optional<cubridge::compute_capability> device_capability() const override {
    return cubridge::compute_capability{9, 0};
  }
  std::uint64_t current_version(std::string_view name) const override {
    std::lock_guard lock(mutex_);
    return name == module_ ? current_ : 0;
  }
  cubridge::sink_result apply(const cubridge::verified_bundle& bundle,
                              cubridge::apply_rule rule) override {
    const auto version = bundle.version();
    log_.line("apply " + std::to_string(version));
    if (bundle.manifest.name != module_)
      return {cubridge::gate_reason::unknown_module, 0, "this node serves " + module_};
    if (stall_.count() > 0) std::this_thread::sleep_for(stall_);  // the kill window before it
    if (version == fail_version_) {
      log_.line("failed " + std::to_string(version));
      return {cubridge::gate_reason::apply_failed, current_version(module_),
              "smoke test failed (--fail-version)"};
    }
    {
      std::lock_guard lock(mutex_);
      // The compare of compare-and-apply, under the lock the switch is made in.
      if (rule == cubridge::apply_rule::above_serving && version <= current_)
        return cubridge::not_newer_result(module_, version, current_);
      previous_ = current_;
      current_ = version;
      if (!store())
        return {cubridge::gate_reason::apply_failed, previous_, "cannot write " + file_.string()};
    }
    log_.line("promoted " + std::to_string(version));
    if (apply_delay_.count() > 0) std::this_thread::sleep_for(apply_delay_);  // the kill window
    return {cubridge::gate_reason::none, version, {}};
  }
  cubridge::sink_result rollback(std::string_view name) override {
    std::lock_guard lock(mutex_);
    if (name != module_) return {cubridge::gate_reason::unknown_module, 0, "no such module"};
    if (previous_ == 0) return {cubridge::gate_reason::no_previous_version, current_, "none"};
    std::swap(current_, previous_);
    if (!store())
      return {cubridge::gate_reason::apply_failed, previous_, "cannot write " + file_.string()};
    log_.line("rolled_back " + std::to_string(current_));
    return {cubridge::gate_reason::none, current_, {}};
  }
  std::vector<cubridge::module_report> status() const override {
    std::lock_guard lock(mutex_);
    return {{module_, current_, {previous_, current_}, 0, {}}};
  }

 private:
  // Written to a temporary file and renamed: a kill leaves the old or the new versions.
  bool store() const {
    const auto temporary = file_.string() + ".tmp";
    {
      std::ofstream out(temporary, std::ios::trunc);
      out << current_ << ' ' << previous_ << '\n';
      if (!out.flush()) return false;
    }
    std::error_code failed;
    std::filesystem::rename(temporary, file_, failed);
    return !failed;
  }

  const std::string module_;
  const std::filesystem::path file_;
  event_log& log_;
  const std::chrono::milliseconds apply_delay_;
  const std::chrono::milliseconds stall_;
  const std::uint64_t fail_version_;
  mutable std::mutex mutex_;
  std::uint64_t current_ = 0;
  std::uint64_t previous_ = 0;
};

struct node_options {
  std::string server, node, trusted_key, node_key, state_file, module, output, credentials, ca,
      api_prefix;
  long apply_delay_ms = 0, stall_before_apply_ms = 0, heartbeat_ms = 5000;
  std::uint64_t fail_version = 0, unhealthy_version = 0, max_bundle_bytes = std::uint64_t{16} << 20;
  long http_port = -1;  // -1: no endpoint; 0: any free port
};

node_options parse(int argc, char** argv) {
  node_options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--server")
      o.server = value;
    else if (flag == "--node")
      o.node = value;
    else if (flag == "--trusted-key")
      o.trusted_key = value;
    else if (flag == "--node-key")
      o.node_key = value;
    else if (flag == "--credentials")
      o.credentials = value;
    else if (flag == "--ca")
      o.ca = value;
    else if (flag == "--api-prefix")
      o.api_prefix = value;
    else if (flag == "--state-file")
      o.state_file = value;
    else if (flag == "--module")
      o.module = value;
    else if (flag == "--output")
      o.output = value;
    else if (flag == "--apply-delay-ms")
      o.apply_delay_ms = std::stol(value);
    else if (flag == "--stall-before-apply-ms")
      o.stall_before_apply_ms = std::stol(value);
    else if (flag == "--heartbeat-ms")
      o.heartbeat_ms = std::stol(value);
    else if (flag == "--fail-version")
      o.fail_version = std::stoull(value);
    else if (flag == "--unhealthy-version")
      o.unhealthy_version = std::stoull(value);
    else if (flag == "--max-bundle-bytes")
      o.max_bundle_bytes = std::stoull(value);
    else if (flag == "--http-port")
      o.http_port = std::stol(value);
    else
      throw std::invalid_argument("unknown option " + flag);
  }
  if (o.server.empty() || o.node.empty() || o.trusted_key.empty() || o.node_key.empty() ||
      o.state_file.empty() || o.module.empty())
    throw std::invalid_argument(
        "--server, --node, --trusted-key, --node-key, --state-file and --module are needed");
  return o;
}

std::string record_line(std::uint64_t count, const cubridge::fleet::result_record& r) {
  return "record " + std::to_string(count) + " " + std::string(cubridge::to_string(r.outcome)) +
         " " + std::to_string(r.version) + " " + std::to_string(r.serving_version) + " " +
         (r.reason.empty() ? "-" : r.reason);
}

int run(const node_options& o) {
  event_log log;
  log.open(o.output);
  const auto sink = std::make_shared<recording_sink>(
      o.module, o.state_file + ".serving", log, std::chrono::milliseconds(o.apply_delay_ms),
      std::chrono::milliseconds(o.stall_before_apply_ms), o.fail_version);
  const auto key = cubridge::read_public_key_file(o.trusted_key);

  // One update authority for both doors.
  cubridge::update_gate_options policy;
  policy.keys.add(key);
  policy.state_file = o.state_file;
  policy.max_bundle_bytes = o.max_bundle_bytes;
  const auto gate = cubridge::update_gate::create(sink, policy);

  cubridge::fleet_agent_options agent_options;
  agent_options.bus.servers = o.server;
  agent_options.bus.credentials = o.credentials;
  agent_options.bus.ca_file = o.ca;
  agent_options.bus.api_prefix = o.api_prefix;
  agent_options.node = o.node;
  agent_options.node_key_file = o.node_key;
  agent_options.modules = {o.module};
  agent_options.heartbeat_interval = std::chrono::milliseconds(o.heartbeat_ms);
  if (o.unhealthy_version != 0)
    agent_options.health_probe = [bad = o.unhealthy_version](std::string_view,
                                                             std::uint64_t version) {
      cubridge::health_report r;
      r.healthy = version != bad;
      r.values["wrong_answers"] = r.healthy ? 0 : 10;
      if (!r.healthy) r.detail = "output check: wrong answers on sampled requests";
      return r;
    };
  cubridge::fleet_agent agent(gate, agent_options);

  std::optional<cubridge::update_endpoint> endpoint;
  if (o.http_port >= 0) {
    cubridge::update_endpoint_options http;
    http.port = static_cast<std::uint16_t>(o.http_port);
    http.threads = 1;
    endpoint.emplace(gate, http);
    endpoint->start();
  }
  agent.start();
  const auto http_port = endpoint ? std::to_string(endpoint->port()) : std::string("-");
  bool ready = false;
  std::uint64_t records_seen = 0;
  while (!stop_requested) {
    if (!ready && agent.connected()) {
      ready = true;
      log.line("ready node=" + o.node + " http=" + http_port);
    }
    if (const auto count = agent.stats().records_published; count > records_seen) {
      records_seen = count;
      if (const auto last = agent.last_result()) log.line(record_line(count, *last));
    }
    std::this_thread::sleep_for(5ms);  // polling the agent's counters, not a synchronisation
  }
  agent.stop();
  if (endpoint) endpoint->stop();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  struct sigaction stop {};
  stop.sa_handler = on_stop_signal;
  ::sigaction(SIGTERM, &stop, nullptr);
  ::sigaction(SIGINT, &stop, nullptr);
  try {
    return run(parse(argc, argv));
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "cubridge_test_fleet_node: %s\n", e.what());
    return 64;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cubridge_test_fleet_node: %s\n", e.what());
    return 1;
  }
}
