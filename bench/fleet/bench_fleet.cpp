// The fleet control plane's benchmark (docs/fleet.md, "Scale"; issue 22; CPU only): one
// nats-server with authentication on (secured_server.hpp: a user per node, subject permissions;
// TLS off), the operator's controller, and N nodes, each a fleet_agent over its own update_gate
// (its own fsync'd replay state), recording sink, Ed25519 key and credentials: node processes
// (tests/fleet/fleet_node.cpp) or agents inside this process (in_process_node.hpp) where
// processes do not fit. Bundles are signed CUDA-source bundles padded to the size, verified in
// full by every node; the sinks record the version and never load the payload.
//
// Measured, each cell `--repeats` times with a fresh version each run, medians reported:
//   1. publish to all converged: from controller::publish until wait_for_results has every
//      node's verified result for the new revision (bounded: 120 s, then reported as such);
//   2. what signing and checking records costs (record_costs.hpp), as a fraction of the
//      100-node rollouts;
//   3. where the time goes: the results' verify_ms and apply_ms, the server's CPU time
//      (/proc/<pid>/stat), the node processes' and this process's CPU time, a gate's state
//      writes, and the two ways of fetching a bundle (STREAM.MSG.GET, which the agent used,
//      against the direct get it uses now);
//   4. recovery under the agents' defaults: a node killed -9 mid-apply (and after its promote)
//      and restarted, the server killed -9 right after a publish and restarted.
//
//   bench_fleet [--nodes 1,10,100] [--in-process 100,1000] [--sizes 1M,10M] [--repeats 3]
//               [--skip 1000x10M] [--permissions exact|broad] [--recovery-nodes 10]
//               [--out DIR]
//
// Prints the table as it goes; writes DIR/fleet_control_plane.json, .txt and .svg.
#include "bundle/source_bundles.hpp"
#include "fleet/fleet_node_process.hpp"
#include "fleet_plot.hpp"
#include "in_process_node.hpp"
#include "record_costs.hpp"
#include "secured_server.hpp"

#include <cubridge/fleet/controller.hpp>
#include <cubridge/fleet/records.hpp>
#include <cubridge/fleet/signed_record.hpp>
#include <cubridge/fleet/subjects.hpp>

#include <nats/nats.h>
#include <signal.h>
#include <sys/utsname.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

namespace {

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;
using cubridge::bench::in_process_node;
using cubridge::bench::secured_server;
using cubridge::testing::fleet_node_process;
using json = nlohmann::json;

// How long one rollout may take before it is reported as not converged.
constexpr auto converge_deadline = 120s;
// The most resident memory the server or this process may take, and the least memory the
// machine must keep available, before a run is stopped (the server killed): the machine is
// shared, and a congested server queues every timed-out fetch's answer (seen: 22 GiB, and the
// kernel's OOM killer).
constexpr std::size_t memory_limit = std::size_t{8} << 30;
constexpr std::size_t memory_reserve = std::size_t{3} << 30;

// MemAvailable of /proc/meminfo, bytes.
std::size_t memory_available() {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("MemAvailable:", 0) == 0) return std::stoull(line.substr(13)) * 1024;
  return std::size_t{1} << 40;
}
// How long a group's nodes may take to connect.
constexpr auto ready_deadline = 120s;
// The agents' heartbeat interval (the default) and resync interval (the default), for counting
// the records a rollout makes.
constexpr double heartbeat_ms = 5000, resync_ms = 2000;

double ms_since(steady::time_point start) {
  return std::chrono::duration<double, std::milli>(steady::now() - start).count();
}
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}
double maximum(const std::vector<double>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string word; std::getline(in, word, ',');)
    if (!word.empty()) out.push_back(word);
  return out;
}
std::size_t parse_size(const std::string& text) {
  const char unit = text.empty() ? ' ' : text.back();
  const std::size_t scale = unit == 'K' ? 1024 : unit == 'M' ? 1024 * 1024 : 1;
  return static_cast<std::size_t>(
             std::stoull(scale == 1 ? text : text.substr(0, text.size() - 1))) *
         scale;
}
std::string size_label(std::size_t bytes) {
  if (bytes >= 1024 * 1024 && bytes % (1024 * 1024) == 0)
    return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes >> 10) + " KiB";
}
std::string format(const char* pattern, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, pattern, value);
  return buffer;
}

// The output of a shell command (uptime, nats-server --version), its last newline cut.
std::string command_output(const std::string& command) {
  std::string out;
  if (std::FILE* pipe = ::popen(command.c_str(), "r")) {
    char buffer[512];
    while (std::fgets(buffer, sizeof buffer, pipe)) out += buffer;
    ::pclose(pipe);
  }
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}
std::string first_line_with(const std::string& file, const std::string& key) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key, 0) == 0) {
      const auto colon = line.find(':');
      auto value = colon == std::string::npos ? line : line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(" \t"));
      return value;
    }
  return {};
}

// --- a raw operator connection: arrival times of results, fetch comparisons ------------------

void check(natsStatus status, const char* what) {
  if (status != NATS_OK)
    throw std::runtime_error(std::string("libnats ") + what + ": " + natsStatus_GetText(status));
}

class operator_link {
 public:
  explicit operator_link(const secured_server& server) {
    natsOptions* options = nullptr;
    check(natsOptions_Create(&options), "options");
    const auto url = server.url();
    natsOptions_SetURL(options, url.c_str());
    natsOptions_SetUserInfo(options, server.operator_user().c_str(),
                            server.operator_password().c_str());
    natsOptions_SetName(options, "bench_fleet listener");
    const auto status = natsConnection_Connect(&connection_, options);
    natsOptions_Destroy(options);
    check(status, "connect (operator)");
    check(natsConnection_JetStream(&js_, connection_, nullptr), "JetStream");
  }
  ~operator_link() {
    jsCtx_Destroy(js_);
    natsConnection_Destroy(connection_);
  }
  operator_link(const operator_link&) = delete;
  operator_link& operator=(const operator_link&) = delete;
  [[nodiscard]] natsConnection* connection() const noexcept { return connection_; }
  [[nodiscard]] jsCtx* js() const noexcept { return js_; }

 private:
  natsConnection* connection_ = nullptr;
  jsCtx* js_ = nullptr;
};

// The result records of one module as they arrive (a core subscription: JetStream publishes
// are ordinary messages on their subjects), stamped on arrival and afterwards checked as the
// controller checks them: signed by the enrolled key of the node the subject names, naming that
// node and module. The fleet's own view of when each node answered, beside wait_for_results.
class result_listener {
 public:
  using keys = std::map<std::string, cubridge::public_key, std::less<>>;
  result_listener(const operator_link& link, const std::string& module, const keys& nodes)
      : module_(module), nodes_(nodes) {
    const auto subject = cubridge::fleet::result_subject(module, "*");
    check(natsConnection_Subscribe(&subscription_, link.connection(), subject.c_str(), on_message,
                                   this),
          "subscribe");
    natsSubscription_SetPendingLimits(subscription_, -1, -1);
    check(natsConnection_FlushTimeout(link.connection(), 5000), "flush");
  }
  ~result_listener() {
    natsSubscription_Unsubscribe(subscription_);
    natsSubscription_Destroy(subscription_);
  }
  result_listener(const result_listener&) = delete;
  result_listener& operator=(const result_listener&) = delete;

  struct arrival {
    cubridge::fleet::result_record record;
    double ms = 0;  // since the start given to expect()
  };
  // From now on, results of `revision` and `digest` count, timed from `start`.
  void expect(std::uint64_t revision, std::string_view digest, steady::time_point start) {
    revision_ = revision;
    digest_ = digest;
    start_ = start;
  }
  // The first verified result of the expected revision and digest of each node so far, by
  // node (the messages not checked yet are checked now).
  const std::map<std::string, arrival>& verified() {
    std::vector<message> fresh;
    {
      std::lock_guard lock(mutex_);
      fresh.assign(
          std::make_move_iterator(messages_.begin() + static_cast<std::ptrdiff_t>(checked_)),
          std::make_move_iterator(messages_.end()));
      checked_ = messages_.size();
    }
    const auto prefix = cubridge::fleet::result_subject(module_, "");
    for (const auto& [at, subject, text] : fresh) {
      const auto node = std::string_view(subject).substr(prefix.size());
      const auto key = nodes_.find(node);
      if (key == nodes_.end() || first_.contains(std::string(node))) continue;
      const auto opened = cubridge::fleet::open_record(text, cubridge::fleet::record_kind::result,
                                                       cubridge::trusted_keys{key->second});
      if (!opened) continue;
      auto record = cubridge::fleet::parse_result_record(opened->body);
      if (!record || record->node != node || record->module != module_ ||
          record->revision != revision_ || record->digest != digest_)
        continue;
      first_.emplace(std::string(node),
                     arrival{std::move(*record),
                             std::chrono::duration<double, std::milli>(at - start_).count()});
    }
    return first_;
  }

 private:
  static void on_message(natsConnection*, natsSubscription*, natsMsg* message, void* self) {
    auto& listener = *static_cast<result_listener*>(self);
    const auto at = steady::now();
    std::string subject = natsMsg_GetSubject(message);
    std::string text(natsMsg_GetData(message),
                     static_cast<std::size_t>(natsMsg_GetDataLength(message)));
    natsMsg_Destroy(message);
    std::lock_guard lock(listener.mutex_);
    listener.messages_.push_back({at, std::move(subject), std::move(text)});
  }
  struct message {
    steady::time_point at;
    std::string subject, text;
  };
  std::string module_;
  const keys& nodes_;
  natsSubscription* subscription_ = nullptr;
  std::mutex mutex_;
  std::vector<message> messages_;  // under mutex_
  std::size_t checked_ = 0;        // under mutex_
  std::uint64_t revision_ = 0;
  std::string digest_;
  steady::time_point start_;
  std::map<std::string, arrival> first_;
};

// --- what is measured -------------------------------------------------------------------------

struct run_sample {
  bool published = false;  // publish returned, completed
  // wait_for_results held every node's verified result, each applied and serving the version
  bool converged = false;
  // the verifying subscriber saw the same (the fleet converged, whatever the operator's call did)
  bool fleet_converged = false;
  std::string error;     // the first error of publish or wait_for_results
  bool aborted = false;  // stopped by the memory watchdog (the server killed)
  std::size_t server_peak_rss = 0, bench_peak_rss = 0;
  std::size_t wait_errors = 0;  // wait_for_results calls that threw (each retried in the budget)
  double converged_ms = 0, publish_ms = 0, fleet_ms = 0;
  std::size_t results = 0, applied = 0, fleet_results = 0, fleet_applied = 0;
  // From the server's /varz: what it sent and took during the run.
  double server_out_mib = 0;
  std::uint64_t server_in_msgs = 0, server_out_msgs = 0;
  double arrival_p50_ms = 0, arrival_max_ms = 0;
  double verify_p50_ms = 0, verify_max_ms = 0, apply_p50_ms = 0, apply_max_ms = 0;
  double server_cpu_s = 0, nodes_cpu_s = 0, bench_cpu_s = 0;
  std::uint64_t retries = 0, publish_failures = 0;  // in-process agents only
};

struct cell {
  std::string mode;  // "processes" or "in-process"
  std::size_t nodes = 0, size = 0, bundle_bytes = 0;
  std::vector<run_sample> runs;
  std::string skipped;  // why the cell was not run
  std::string note;     // e.g. why repeats stopped
};

template <class F>
double cell_median(const cell& c, F field) {
  std::vector<double> v;
  for (const auto& r : c.runs) v.push_back(static_cast<double>(field(r)));
  return median(v);
}
std::size_t converged_runs(const cell& c) {
  return static_cast<std::size_t>(
      std::count_if(c.runs.begin(), c.runs.end(), [](const auto& r) { return r.converged; }));
}
bool all_succeeded(const cell& c) {
  return !c.runs.empty() && std::all_of(c.runs.begin(), c.runs.end(), [](const auto& r) {
    return r.published && r.converged && r.error.empty();
  });
}

struct group_summary {
  std::string mode, module;
  std::size_t nodes = 0;
  double settle_ms = 0, enroll_ms = 0, ready_ms = 0;
  double warm_ms = 0;  // the 1 KiB warm-up rollout (not in the table), converged
  double idle_server_cpu = 0, idle_nodes_cpu = 0, idle_bench_cpu = 0;  // fraction of a core
  std::size_t violations = 0, slow_consumers = 0;                      // server log, this group
};

struct recovery_report {
  std::size_t nodes = 0;
  // A node killed -9 inside its sink's apply (state recorded pending, not promoted).
  double mid_apply_ready_ms = -1, mid_apply_serving_ms = -1, mid_apply_result_ms = -1;
  std::string mid_apply_outcome;
  // A node killed -9 after its promote, before its result.
  double after_promote_ready_ms = -1, after_promote_result_ms = -1;
  std::string after_promote_outcome;
  // The server killed -9 right after a publish.
  std::size_t serving_at_kill = 0;
  double server_up_ms = -1, server_all_serving_ms = -1, server_all_results_ms = -1;
  std::size_t server_results = 0;
  std::vector<std::string> problems;
};

struct fetch_sample {
  std::size_t size = 0, response_bytes = 0;
  std::string error;
  double msg_get_request_ms = 0;  // STREAM.MSG.GET as a bare request: server and transfer
  double msg_get_ms = 0;          // js_GetLastMsg, as the agent fetched (+ JSON and base64)
  double direct_get_ms = 0;       // js_DirectGetMsg with LastBySubject: the bytes as stored
};

// --- the bench ----------------------------------------------------------------------------

struct options {
  std::vector<std::size_t> process_counts = {1, 10, 100};
  std::vector<std::size_t> in_process_counts = {100, 1000};
  std::vector<std::size_t> sizes = {1 << 20, 10 << 20};
  std::vector<std::pair<std::size_t, std::size_t>> skip = {{1000, 10 << 20}};
  std::size_t repeats = 3;
  std::size_t recovery_nodes = 10;
  cubridge::bench::node_permissions permissions = cubridge::bench::node_permissions::exact;
  std::filesystem::path out = ".";
};

struct group_plan {
  bool in_process = false;
  std::size_t count = 0;
  std::string module;
  std::vector<std::string> ids;
  std::vector<std::filesystem::path> credentials;
};

std::string node_id(const std::string& prefix, std::size_t i) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%s_%04zu", prefix.c_str(), i + 1);
  return buffer;
}

class bench {
 public:
  explicit bench(const options& o) : o_(o), server_(dir_.path / "server", o.permissions) {
    cubridge::write_key_file(operator_key_file_, keys_.public_key);
    for (const auto count : o_.process_counts) plan(false, count, "p" + std::to_string(count));
    for (const auto count : o_.in_process_counts) plan(true, count, "i" + std::to_string(count));
    if (o_.recovery_nodes > 0) plan(false, o_.recovery_nodes, "r");
    server_.start();
    std::cout << "# nats-server pid " << server_.pid() << ", " << server_.url() << ", monitoring "
              << "http://127.0.0.1:" << server_.monitor_port() << std::endl;
    connect();
    link_ = std::make_unique<operator_link>(server_);
  }

  [[nodiscard]] const std::vector<group_plan>& plans() const noexcept { return plans_; }
  [[nodiscard]] const secured_server& server() const noexcept { return server_; }
  [[nodiscard]] std::size_t enrolled_total() const noexcept { return server_.users(); }

  // Starts a group's nodes, measures every size, stops them.
  std::vector<cell> run_group(const group_plan& g, group_summary& summary) {
    summary.mode = g.in_process ? "in-process" : "processes";
    summary.module = g.module;
    summary.nodes = g.count;
    const auto violations = server_.log_lines_with("Violation");
    const auto slow = server_.log_lines_with("Slow Consumer");
    const auto group_dir = dir_.path / g.module;
    std::filesystem::create_directories(group_dir);
    std::vector<std::unique_ptr<fleet_node_process>> processes;
    std::vector<std::unique_ptr<in_process_node>> agents;
    result_listener::keys keys;
    auto start = steady::now();
    for (std::size_t i = 0; i < g.count; ++i) {
      if (g.in_process) {
        agents.push_back(std::make_unique<in_process_node>(
            g.ids[i], group_dir, g.module, keys_.public_key, server_.url(), g.credentials[i]));
        keys.emplace(g.ids[i], agents.back()->public_key());
      } else {
        processes.push_back(std::make_unique<fleet_node_process>(g.ids[i], group_dir));
        keys.emplace(g.ids[i], processes.back()->public_key());
      }
      control_->enroll(g.ids[i], keys.at(g.ids[i]), {}, keys_.secret_key);
    }
    summary.enroll_ms = ms_since(start);
    start = steady::now();
    for (std::size_t i = 0; i < g.count; ++i) {
      if (g.in_process)
        agents[i]->start();
      else
        processes[i]->start(server_.url(), operator_key_file_, g.module, node_arguments(g, i));
    }
    const auto ready_by = steady::now() + ready_deadline;
    for (std::size_t i = 0; i < g.count; ++i) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::max(ready_by - steady::now(), steady::duration::zero()));
      const bool ready =
          g.in_process ? cubridge::testing::eventually([&] { return agents[i]->connected(); }, left)
                       : processes[i]->wait_line("ready", left);
      if (!ready)
        throw std::runtime_error(
            g.ids[i] + " not connected within 120 s: " +
            (g.in_process ? agents[i]->last_problem() : processes[i]->exit_text()));
    }
    summary.ready_ms = ms_since(start);
    std::cout << "# " << summary.mode << " x" << g.count << ": enrolled in " << summary.enroll_ms
              << " ms, all connected " << summary.ready_ms << " ms after starting" << std::endl;

    // The background: what the idle fleet costs (heartbeats, resync reads, the agents' loops).
    const auto cpu = [&] {
      return std::array<double, 3>{server_.cpu_seconds(),
                                   cubridge::bench::children_cpu_seconds(server_.pid()),
                                   cubridge::bench::self_cpu_seconds()};
    };
    const auto idle_before = cpu();
    start = steady::now();
    std::this_thread::sleep_for(3s);  // a measurement window, not a synchronisation
    const auto idle_after = cpu();
    const double window = ms_since(start) / 1000;
    summary.idle_server_cpu = (idle_after[0] - idle_before[0]) / window;
    summary.idle_nodes_cpu = (idle_after[1] - idle_before[1]) / window;
    summary.idle_bench_cpu = (idle_after[2] - idle_before[2]) / window;

    // A first rollout, not reported: makes the bundle stream and shows the permissions hold.
    const auto warm = run_once(g, keys, agents, 1024);
    summary.warm_ms = warm.converged_ms;
    if (!warm.converged)
      throw std::runtime_error("the warm-up rollout to " + g.module + " did not converge: " +
                               (warm.error.empty() ? std::to_string(warm.results) + " of " +
                                                         std::to_string(g.count) + " results"
                                                   : warm.error) +
                               "\n" + server_.log_text().substr(0, 4000));

    std::vector<cell> cells;
    bool server_lost = false;
    for (const auto size : o_.sizes) {
      cell c;
      c.mode = summary.mode;
      c.nodes = g.count;
      c.size = size;
      if (std::find(o_.skip.begin(), o_.skip.end(), std::make_pair(g.count, size)) !=
          o_.skip.end()) {
        c.skipped = "skipped (--skip)";
        cells.push_back(std::move(c));
        continue;
      }
      for (std::size_t r = 0; r < o_.repeats; ++r) {
        c.runs.push_back(run_once(g, keys, agents, size));
        c.bundle_bytes = last_bundle_bytes_;
        const auto& s = c.runs.back();
        std::cout << "  " << summary.mode << " x" << g.count << " " << size_label(size) << " run "
                  << r + 1 << ": " << format("%.1f", s.converged_ms) << " ms, " << s.applied << "/"
                  << g.count << " applied by wait_for_results; the fleet's " << s.fleet_applied
                  << "/" << g.count << " by " << format("%.1f", s.fleet_ms) << " ms; server sent "
                  << format("%.0f", s.server_out_mib) << " MiB"
                  << (s.error.empty() ? "" : "; " + s.error) << std::endl;
        if (!s.converged) {
          c.note = "run " + std::to_string(r + 1) + ": " +
                   (s.fleet_converged
                        ? "every node applied (the fleet's view, " + format("%.0f", s.fleet_ms) +
                              " ms) but wait_for_results did not say so"
                        : std::to_string(s.fleet_applied) + " of " + std::to_string(g.count) +
                              " nodes applied by " + format("%.0f", s.fleet_ms) + " ms") +
                   (s.error.empty() ? "" : " (" + s.error + ")") + "; later runs skipped";
          break;
        }
        std::this_thread::sleep_for(500ms);  // a quiet gap between runs, not a synchronisation
      }
      const bool aborted = !c.runs.empty() && c.runs.back().aborted;
      cells.push_back(std::move(c));
      if (aborted) {
        server_lost = true;
        break;  // the server is gone: the group's other sizes are not run
      }
    }
    stop(processes, agents);
    if (server_lost) restart_server();
    summary.violations = server_.log_lines_with("Violation") - violations;
    summary.slow_consumers = server_.log_lines_with("Slow Consumer") - slow;
    return cells;
  }

  // Part 3: the old way of fetching a bundle (STREAM.MSG.GET) against the agent's direct get,
  // from this process, the bundles stored under a module no node follows.
  std::vector<fetch_sample> compare_fetches() {
    const std::string module = "bench_fetch";
    std::vector<fetch_sample> out;
    for (const auto size : o_.sizes) {
      try {
        out.push_back(compare_fetch(module, size));
      } catch (const std::exception& e) {
        fetch_sample f;
        f.size = size;
        f.error = e.what();
        out.push_back(f);
      }
    }
    return out;
  }

  fetch_sample compare_fetch(const std::string& module, std::size_t size) {
    {
      const auto data = make_bundle(module, size);
      const auto report = control_->publish(data, keys_.secret_key);
      const auto subject =
          cubridge::fleet::bundle_subject(module, report.version, report.desired.stable->digest);
      const auto stream = cubridge::fleet::bundle_stream(module);
      fetch_sample f;
      f.size = size;
      std::vector<double> bare, msg_get, direct;
      const std::string request = "{\"last_by_subj\":\"" + subject + "\"}";
      const std::string api = "$JS.API.STREAM.MSG.GET." + stream;
      jsOptions js_options;
      jsOptions_Init(&js_options);
      js_options.Wait = 30000;
      for (int i = 0; i < 5; ++i) {
        natsMsg* reply = nullptr;
        auto start = steady::now();
        check(natsConnection_Request(&reply, link_->connection(), api.c_str(), request.data(),
                                     static_cast<int>(request.size()), 30000),
              "STREAM.MSG.GET request");
        bare.push_back(ms_since(start));
        f.response_bytes = static_cast<std::size_t>(natsMsg_GetDataLength(reply));
        natsMsg_Destroy(reply);

        natsMsg* message = nullptr;
        start = steady::now();
        check(js_GetLastMsg(&message, link_->js(), stream.c_str(), subject.c_str(), &js_options,
                            nullptr),
              "js_GetLastMsg");
        msg_get.push_back(ms_since(start));
        natsMsg_Destroy(message);

        jsDirectGetMsgOptions by_subject;
        jsDirectGetMsgOptions_Init(&by_subject);
        by_subject.LastBySubject = subject.c_str();
        start = steady::now();
        check(js_DirectGetMsg(&message, link_->js(), stream.c_str(), &js_options, &by_subject),
              "js_DirectGetMsg");
        direct.push_back(ms_since(start));
        natsMsg_Destroy(message);
      }
      f.msg_get_request_ms = median(bare);
      f.msg_get_ms = median(msg_get);
      f.direct_get_ms = median(direct);
      return f;
    }
  }

  // Part 4, one run each under the agents' defaults.
  recovery_report run_recovery(const group_plan& g) {
    recovery_report rep;
    rep.nodes = g.count;
    const auto group_dir = dir_.path / g.module;
    std::filesystem::create_directories(group_dir);
    std::vector<std::unique_ptr<fleet_node_process>> nodes;
    result_listener::keys keys;
    for (std::size_t i = 0; i < g.count; ++i) {
      nodes.push_back(std::make_unique<fleet_node_process>(g.ids[i], group_dir));
      keys.emplace(g.ids[i], nodes.back()->public_key());
      control_->enroll(g.ids[i], nodes.back()->public_key(), {}, keys_.secret_key);
      nodes.back()->start(server_.url(), operator_key_file_, g.module, node_arguments(g, i));
    }
    for (auto& n : nodes)
      if (!n->wait_line("ready", ready_deadline))
        throw std::runtime_error(n->id() + " not ready: " + n->exit_text());
    std::vector<std::unique_ptr<in_process_node>> none;
    if (!run_once(g, keys, none, 1024).converged)
      throw std::runtime_error("recovery: the first rollout did not converge");
    auto& victim = *nodes[0];
    std::vector<std::string> others(g.ids.begin() + 1, g.ids.end());
    const std::vector<std::string> victim_id = {victim.id()};

    // (a) Killed inside the sink's apply: restarted, it resumes the pending apply.
    {
      victim.stop();
      auto extra = node_arguments(g, 0);
      extra.insert(extra.end(), {"--stall-before-apply-ms", "600000"});
      victim.start(server_.url(), operator_key_file_, g.module, extra);
      if (!victim.wait_line("ready", ready_deadline))
        throw std::runtime_error("recovery: " + victim.id() + " not ready");
      const auto data = make_bundle(g.module, 1 << 20);
      const auto report = control_->publish(data, keys_.secret_key);
      const auto version = report.version;
      if (!victim.wait_line("apply " + std::to_string(version), 60s))
        rep.problems.push_back("mid-apply: the victim never reached its sink");
      (void)control_->wait_for_results(g.module, report.desired.revision,
                                       report.desired.stable->digest, others, 60s);
      victim.kill();
      if (victim.serving().first == version)
        rep.problems.push_back("mid-apply: the victim served the version before the kill");
      const auto start = steady::now();
      victim.start(server_.url(), operator_key_file_, g.module, node_arguments(g, 0));
      bool ready = false, serving = false;
      (void)cubridge::testing::eventually(
          [&] {
            if (!ready && victim.has_line("ready")) {
              ready = true;
              rep.mid_apply_ready_ms = ms_since(start);
            }
            if (!serving && victim.serving().first == version) {
              serving = true;
              rep.mid_apply_serving_ms = ms_since(start);
            }
            return ready && serving;
          },
          converge_deadline);
      const auto results =
          control_->wait_for_results(g.module, report.desired.revision,
                                     report.desired.stable->digest, victim_id, converge_deadline);
      if (!results.empty()) {
        rep.mid_apply_result_ms = ms_since(start);
        rep.mid_apply_outcome = std::string(cubridge::to_string(results[0].outcome)) +
                                (results[0].detail.empty() ? "" : " (" + results[0].detail + ")");
      }
    }
    // (b) Killed after its promote, before its result: restarted, it finds the version serving.
    {
      victim.stop();
      auto extra = node_arguments(g, 0);
      extra.insert(extra.end(), {"--apply-delay-ms", "600000"});
      victim.start(server_.url(), operator_key_file_, g.module, extra);
      if (!victim.wait_line("ready", ready_deadline))
        throw std::runtime_error("recovery: " + victim.id() + " not ready");
      const auto data = make_bundle(g.module, 1 << 20);
      const auto report = control_->publish(data, keys_.secret_key);
      if (!victim.wait_line("promoted " + std::to_string(report.version), 60s))
        rep.problems.push_back("after-promote: the victim never promoted");
      (void)control_->wait_for_results(g.module, report.desired.revision,
                                       report.desired.stable->digest, others, 60s);
      victim.kill();
      const auto start = steady::now();
      victim.start(server_.url(), operator_key_file_, g.module, node_arguments(g, 0));
      if (victim.wait_line("ready", converge_deadline))
        rep.after_promote_ready_ms = ms_since(start);
      const auto results =
          control_->wait_for_results(g.module, report.desired.revision,
                                     report.desired.stable->digest, victim_id, converge_deadline);
      if (!results.empty()) {
        rep.after_promote_result_ms = ms_since(start);
        rep.after_promote_outcome = std::string(cubridge::to_string(results[0].outcome)) +
                                    (results[0].reason.empty() ? "" : " " + results[0].reason);
      }
    }
    // (c) The server killed right after a publish returned, and started again.
    {
      const auto data = make_bundle(g.module, 1 << 20);
      const auto report = control_->publish(data, keys_.secret_key);
      const auto version = report.version;
      for (const auto& n : nodes) rep.serving_at_kill += n->serving().first == version;
      control_.reset();
      link_.reset();
      server_.kill();
      const auto start = steady::now();
      server_.start();
      rep.server_up_ms = ms_since(start);
      if (cubridge::testing::eventually(
              [&] {
                return std::all_of(nodes.begin(), nodes.end(),
                                   [&](const auto& n) { return n->serving().first == version; });
              },
              converge_deadline))
        rep.server_all_serving_ms = ms_since(start);
      connect();
      const auto results =
          control_->wait_for_results(g.module, report.desired.revision,
                                     report.desired.stable->digest, g.ids, converge_deadline);
      rep.server_results = results.size();
      if (results.size() == g.ids.size()) rep.server_all_results_ms = ms_since(start);
      link_ = std::make_unique<operator_link>(server_);
    }
    std::vector<std::unique_ptr<in_process_node>> no_agents;
    stop(nodes, no_agents);
    return rep;
  }

 private:
  // After the watchdog killed the server: the same server again (its store kept), and the
  // operator's connections made again.
  void restart_server() {
    control_.reset();
    link_.reset();
    server_.kill();
    server_.start();
    connect();
    link_ = std::make_unique<operator_link>(server_);
    std::cout << "# nats-server started again: pid " << server_.pid() << std::endl;
  }

  void plan(bool in_process, std::size_t count, const std::string& prefix) {
    group_plan g;
    g.in_process = in_process;
    g.count = count;
    g.module = "bench_" + prefix;
    for (std::size_t i = 0; i < count; ++i) {
      g.ids.push_back(node_id(prefix, i));
      g.credentials.push_back(server_.add_node(g.ids.back(), g.module));
    }
    plans_.push_back(std::move(g));
  }

  void connect() {
    cubridge::fleet::controller_options c;
    c.bus.servers = server_.url();
    c.bus.credentials = server_.operator_credentials();
    c.operator_keys.add(keys_.public_key);
    c.client_name = "bench_fleet operator";
    control_ = std::make_unique<cubridge::fleet::controller>(std::move(c));
  }

  struct varz_counts {
    std::uint64_t out_bytes = 0, in_msgs = 0, out_msgs = 0;
  };
  [[nodiscard]] varz_counts varz() const {
    const auto page = json::parse(server_.monitor_page("/varz"), nullptr, false);
    if (!page.is_object()) return {};
    return {page.value("out_bytes", std::uint64_t{0}), page.value("in_msgs", std::uint64_t{0}),
            page.value("out_msgs", std::uint64_t{0})};
  }

 public:
  // Waits (at most 60 s) until the server uses under a tenth of a core over a second: each
  // group starts on a quiet server, not on the tail of the last one's work.
  double settle() const {
    const auto start = steady::now();
    for (int i = 0; i < 60; ++i) {
      const double before = server_.cpu_seconds();
      std::this_thread::sleep_for(1s);  // a measurement window, not a synchronisation
      if (server_.cpu_seconds() - before < 0.1) break;
    }
    return ms_since(start);
  }

 private:
  std::vector<std::string> node_arguments(const group_plan& g, std::size_t i) const {
    return {"--credentials", g.credentials[i].string(), "--heartbeat-ms", "5000"};
  }

  // A signed bundle of the next version, `size` bytes or a few over (the manifest varies).
  std::vector<std::byte> make_bundle(const std::string& module, std::size_t size) {
    const auto version = ++versions_[module];
    const auto bare = cubridge::testing::source_bundle(module, version, keys_.secret_key).size();
    auto data = cubridge::testing::source_bundle(module, version, keys_.secret_key, "sm_90",
                                                 size > bare ? size - bare : 0);
    last_bundle_bytes_ = data.size();
    return data;
  }

  run_sample run_once(const group_plan& g, const result_listener::keys& keys,
                      const std::vector<std::unique_ptr<in_process_node>>& agents,
                      std::size_t size) {
    run_sample s;
    const auto data = make_bundle(g.module, size);
    const auto version = versions_[g.module];
    result_listener listener(*link_, g.module, keys);
    std::uint64_t retries_before = 0, failures_before = 0;
    for (const auto& a : agents) {
      const auto st = a->stats();
      retries_before += st.retries;
      failures_before += st.publish_failures;
    }
    const double server_before = server_.cpu_seconds();
    const double nodes_before = cubridge::bench::children_cpu_seconds(server_.pid());
    const double self_before = cubridge::bench::self_cpu_seconds();
    const auto varz_before = varz();
    const auto start = steady::now();
    const auto deadline = start + converge_deadline;
    // The memory watchdog: samples both processes' memory; over the limit, kills the server
    // (the run then ends as not converged, the group stops, the server starts again).
    std::atomic<bool> aborted{false};
    std::atomic<std::size_t> server_peak{0}, bench_peak{0};
    std::string abort_reason;
    const pid_t server_pid = server_.pid();
    // The server's counters, sampled too: a server the watchdog killed answers no /varz after.
    std::mutex sampled_mutex;
    varz_counts sampled = varz_before;
    std::jthread watchdog([&](std::stop_token stop) {
      for (int tick = 0; !stop.stop_requested(); ++tick) {
        if (tick % 5 == 0)
          if (const auto v = varz(); v.out_bytes > 0) {
            std::lock_guard lock(sampled_mutex);
            sampled = v;
          }
        const auto server_rss = cubridge::bench::process_rss_bytes(server_pid);
        const auto bench_rss = cubridge::bench::process_rss_bytes(::getpid());
        server_peak = std::max(server_peak.load(), server_rss);
        bench_peak = std::max(bench_peak.load(), bench_rss);
        const auto available = memory_available();
        if (server_rss > memory_limit || bench_rss > memory_limit || available < memory_reserve) {
          abort_reason = "stopped at " + format("%.0f", ms_since(start)) + " ms: the server held " +
                         format("%.0f", server_rss / 1048576.0) + " MiB, this process " +
                         format("%.0f", bench_rss / 1048576.0) + " MiB, the machine had " +
                         format("%.0f", available / 1048576.0) +
                         " MiB available (limits: 8 GiB each, 3 GiB available); the server was "
                         "killed";
          aborted = true;
          ::kill(server_pid, SIGKILL);
          return;
        }
        std::this_thread::sleep_for(100ms);  // a sampling interval, not a synchronisation
      }
    });
    std::uint64_t revision = 0;
    std::string digest;
    std::vector<cubridge::fleet::result_record> results;
    try {
      const auto report = control_->publish(data, keys_.secret_key);
      s.publish_ms = ms_since(start);
      s.published = report.completed && !report.already_desired;
      revision = report.desired.revision;
      digest = report.desired.stable->digest;
    } catch (const std::exception& e) {
      s.error = std::string("publish: ") + e.what();
    }
    // The operator's view; when the call throws (or returns short), the fleet's view alone is
    // waited on, within the same budget (no second call: it would add to the server's load).
    if (s.published) {
      listener.expect(revision, digest, start);
      try {
        results = control_->wait_for_results(
            g.module, revision, digest, g.ids,
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady::now()));
      } catch (const std::exception& e) {
        s.error = std::string("wait_for_results: ") + e.what();
        ++s.wait_errors;
      }
    }
    s.converged_ms = ms_since(start);
    while (s.published && !aborted && listener.verified().size() < g.count &&
           steady::now() < deadline)
      std::this_thread::sleep_for(50ms);  // polling the subscriber, not a synchronisation
    const double waited_ms = ms_since(start);
    watchdog.request_stop();
    watchdog.join();
    s.aborted = aborted;
    s.server_peak_rss = server_peak;
    s.bench_peak_rss = bench_peak;
    if (s.aborted) s.error = abort_reason + (s.error.empty() ? "" : "; " + s.error);
    s.server_cpu_s = server_.cpu_seconds() - server_before;
    s.nodes_cpu_s = cubridge::bench::children_cpu_seconds(server_.pid()) - nodes_before;
    s.bench_cpu_s = cubridge::bench::self_cpu_seconds() - self_before;
    auto varz_after = varz();
    if (varz_after.out_bytes == 0) varz_after = sampled;  // the server is gone: its last sample
    s.server_out_mib =
        static_cast<double>(varz_after.out_bytes - varz_before.out_bytes) / (1 << 20);
    s.server_in_msgs = varz_after.in_msgs - varz_before.in_msgs;
    s.server_out_msgs = varz_after.out_msgs - varz_before.out_msgs;
    const auto succeeded = [version](const cubridge::fleet::result_record& r) {
      return r.outcome == cubridge::gate_outcome::applied && r.serving_version == version;
    };
    for (const auto& r : results) s.applied += succeeded(r);
    s.results = results.size();
    s.converged = s.published && s.applied == g.count;
    if (!s.converged) s.converged_ms = waited_ms;
    // The fleet's view, and the per-node times from it (it holds every node that answered).
    const auto& seen =
        s.published ? listener.verified() : std::map<std::string, result_listener::arrival>{};
    std::vector<double> arrivals, verify, apply;
    for (const auto& [node, a] : seen) {
      s.fleet_applied += succeeded(a.record);
      arrivals.push_back(a.ms);
      verify.push_back(a.record.verify_ms);
      apply.push_back(a.record.apply_ms);
    }
    s.fleet_results = seen.size();
    s.fleet_converged = s.published && s.fleet_applied == g.count;
    s.fleet_ms = s.fleet_converged ? maximum(arrivals) : waited_ms;
    s.arrival_p50_ms = median(arrivals);
    s.arrival_max_ms = maximum(arrivals);
    s.verify_p50_ms = median(verify);
    s.verify_max_ms = maximum(verify);
    s.apply_p50_ms = median(apply);
    s.apply_max_ms = maximum(apply);
    for (const auto& a : agents) {
      const auto st = a->stats();
      s.retries += st.retries;
      s.publish_failures += st.publish_failures;
    }
    s.retries -= retries_before;
    s.publish_failures -= failures_before;
    if (s.retries > 0) {  // what the agents that retried last saw, cut to its first 160 chars
      std::map<std::string, int> problems;
      for (const auto& a : agents)
        if (const auto p = a->last_problem(); !p.empty()) ++problems[p.substr(0, 160)];
      for (const auto& [problem, n] : problems)
        std::cout << "    the last problem of " << n << " agents: " << problem << std::endl;
    }
    return s;
  }

  static void stop(std::vector<std::unique_ptr<fleet_node_process>>& processes,
                   std::vector<std::unique_ptr<in_process_node>>& agents) {
    for (auto& p : processes) p->kill();
    processes.clear();
    // Each stop waits out its agent's watch poll (50 ms): many at once.
    std::vector<std::jthread> stoppers;
    constexpr std::size_t per_thread = 25;
    for (std::size_t first = 0; first < agents.size(); first += per_thread)
      stoppers.emplace_back([&agents, first] {
        for (std::size_t i = first; i < std::min(first + per_thread, agents.size()); ++i)
          agents[i]->stop();
      });
    stoppers.clear();
    agents.clear();
  }

  const options& o_;
  cubridge::testing::temp_dir dir_;
  secured_server server_;
  cubridge::keypair keys_ = cubridge::generate_keypair();
  std::filesystem::path operator_key_file_ = dir_.path / "operator.pub";
  std::unique_ptr<cubridge::fleet::controller> control_;
  std::unique_ptr<operator_link> link_;
  std::vector<group_plan> plans_;
  std::map<std::string, std::uint64_t> versions_;
  std::size_t last_bundle_bytes_ = 0;
};

// --- reporting --------------------------------------------------------------------------------

std::size_t wait_errors(const cell& c) {
  std::size_t n = 0;
  for (const auto& r : c.runs) n += r.wait_errors;
  return n;
}

std::string table(const std::vector<cell>& cells) {
  std::ostringstream out;
  char line[512];
  std::snprintf(line, sizeof line,
                "%-10s %5s %7s | %9s %8s %8s | %8s | %8s %8s | %9s %9s | %7s %7s %7s | %s\n",
                "mode", "nodes", "bundle", "converged", "fleet", "publish", "res p50", "vrfy p50",
                "vrfy max", "apply p50", "apply max", "srv cpu", "nod cpu", "bch cpu",
                "ok / wait errors");
  out << line;
  for (const auto& c : cells) {
    if (!c.skipped.empty() || c.runs.empty()) {
      std::snprintf(line, sizeof line, "%-10s %5zu %7s | %s\n", c.mode.c_str(), c.nodes,
                    size_label(c.size).c_str(), c.skipped.empty() ? "no run" : c.skipped.c_str());
      out << line;
      continue;
    }
    const auto m = [&c](auto field) { return cell_median(c, field); };
    std::snprintf(
        line, sizeof line,
        "%-10s %5zu %7s | %9.1f %8.1f %8.1f | %8.1f | %8.2f %8.2f | %9.3f %9.3f | %7.2f %7.2f "
        "%7.2f | %zu/%zu, %zu%s\n",
        c.mode.c_str(), c.nodes, size_label(c.size).c_str(),
        m([](const run_sample& r) { return r.converged_ms; }),
        m([](const run_sample& r) { return r.fleet_ms; }),
        m([](const run_sample& r) { return r.publish_ms; }),
        m([](const run_sample& r) { return r.arrival_p50_ms; }),
        m([](const run_sample& r) { return r.verify_p50_ms; }),
        m([](const run_sample& r) { return r.verify_max_ms; }),
        m([](const run_sample& r) { return r.apply_p50_ms; }),
        m([](const run_sample& r) { return r.apply_max_ms; }),
        m([](const run_sample& r) { return r.server_cpu_s; }),
        m([](const run_sample& r) { return r.nodes_cpu_s; }),
        m([](const run_sample& r) { return r.bench_cpu_s; }), converged_runs(c), c.runs.size(),
        wait_errors(c), c.note.empty() ? "" : (" " + c.note).c_str());
    out << line;
  }
  return out.str();
}

json to_json(const run_sample& r) {
  return {{"published", r.published},
          {"converged", r.converged},
          {"fleet_converged", r.fleet_converged},
          {"error", r.error},
          {"wait_for_results_errors", r.wait_errors},
          {"converged_ms", r.converged_ms},
          {"fleet_last_verified_result_ms", r.fleet_ms},
          {"aborted_by_memory_watchdog", r.aborted},
          {"server_peak_rss_mib", static_cast<double>(r.server_peak_rss) / (1 << 20)},
          {"bench_peak_rss_mib", static_cast<double>(r.bench_peak_rss) / (1 << 20)},
          {"fleet_results", r.fleet_results},
          {"fleet_applied", r.fleet_applied},
          {"server_out_mib", r.server_out_mib},
          {"server_in_msgs", r.server_in_msgs},
          {"server_out_msgs", r.server_out_msgs},
          {"publish_ms", r.publish_ms},
          {"results", r.results},
          {"applied", r.applied},
          {"result_arrival_p50_ms", r.arrival_p50_ms},
          {"result_arrival_max_ms", r.arrival_max_ms},
          {"verify_p50_ms", r.verify_p50_ms},
          {"verify_max_ms", r.verify_max_ms},
          {"apply_p50_ms", r.apply_p50_ms},
          {"apply_max_ms", r.apply_max_ms},
          {"server_cpu_s", r.server_cpu_s},
          {"node_processes_cpu_s", r.nodes_cpu_s},
          {"bench_process_cpu_s", r.bench_cpu_s},
          {"agent_retries", r.retries},
          {"agent_publish_failures", r.publish_failures}};
}

json to_json(const cell& c) {
  json runs = json::array();
  for (const auto& r : c.runs) runs.push_back(to_json(r));
  json j = {{"mode", c.mode},        {"nodes", c.nodes},
            {"bundle_size", c.size}, {"bundle_bytes", c.bundle_bytes},
            {"runs", runs},          {"skipped", c.skipped},
            {"note", c.note}};
  if (!c.runs.empty()) {
    j["converged_ms_median"] = cell_median(c, [](const run_sample& r) { return r.converged_ms; });
    j["publish_ms_median"] = cell_median(c, [](const run_sample& r) { return r.publish_ms; });
    j["fleet_ms_median"] = cell_median(c, [](const run_sample& r) { return r.fleet_ms; });
    j["all_runs_succeeded"] = all_succeeded(c);
  }
  return j;
}

const cell* find_cell(const std::vector<cell>& cells, const std::string& mode, std::size_t nodes,
                      std::size_t size) {
  for (const auto& c : cells)
    if (c.mode == mode && c.nodes == nodes && c.size == size && !c.runs.empty()) return &c;
  return nullptr;
}

// Part 2: the records one rollout of `c` makes, and what signing and checking them costs.
struct record_share {
  double results = 0, heartbeats = 0, desired_reads = 0;
  double cpu_ms = 0, rollout_ms = 0;
  [[nodiscard]] double fraction() const { return rollout_ms > 0 ? cpu_ms / rollout_ms : 0; }
};
record_share share_of(const cell& c, const cubridge::bench::record_costs& k) {
  record_share s;
  s.rollout_ms = cell_median(c, [](const run_sample& r) { return r.converged_ms; });
  const auto n = static_cast<double>(c.nodes);
  s.results = n;                                         // signed, opened, parsed once each
  s.heartbeats = n * s.rollout_ms / heartbeat_ms;        // as if a status read each
  s.desired_reads = n * (1 + s.rollout_ms / resync_ms);  // the watch's, then a resync's
  const double us = s.results * k.result.all_us() + s.heartbeats * k.heartbeat.all_us() +
                    s.desired_reads * k.desired.check_us() +
                    // the controller: the current state read and the new one signed (publish),
                    // the registry read (wait_for_results)
                    k.desired.check_us() + k.desired.sign_us + k.registry.check_us();
  s.cpu_ms = us / 1000;
  return s;
}

std::string plot(const std::vector<cell>& cells, std::size_t repeats) {
  struct line {
    std::string mode;
    std::size_t size;
    std::string colour;
    bool dashed;
  };
  const std::vector<line> lines = {{"processes", 1 << 20, "#2171b5", false},
                                   {"processes", 10 << 20, "#08306b", false},
                                   {"in-process", 1 << 20, "#f16913", true},
                                   {"in-process", 10 << 20, "#a63603", true}};
  std::vector<cubridge::bench::plot_series> series;
  for (const auto& l : lines) {
    cubridge::bench::plot_series s{l.mode + ", " + size_label(l.size), l.colour, l.dashed, {}};
    for (const auto& c : cells)
      if (c.mode == l.mode && c.size == l.size && !c.runs.empty() &&
          converged_runs(c) == c.runs.size())
        s.points.emplace_back(static_cast<double>(c.nodes),
                              cell_median(c, [](const run_sample& r) { return r.converged_ms; }));
    std::sort(s.points.begin(), s.points.end());
    if (!s.points.empty()) series.push_back(std::move(s));
  }
  cubridge::bench::plot_axes axes;
  axes.x_label = "nodes (log scale)";
  axes.y_label = "ms from publish to all converged (median, log scale)";
  axes.log_y = true;
  return cubridge::bench::render_plot(
      "Fleet control plane: publish to every node's verified result",
      "one nats-server (users and permissions, no TLS), nodes and publisher on 2 cores; median "
      "of " +
          std::to_string(repeats) + " runs; cells that did not converge are left out",
      series, axes);
}

std::string command_line(int argc, char** argv) {
  std::string out;
  for (int i = 0; i < argc; ++i) out += (i ? " " : "") + std::string(argv[i]);
  return out;
}

options parse_options(int argc, char** argv) {
  options o;
  const auto counts = [](const std::string& value) {
    std::vector<std::size_t> out;
    for (const auto& w : split(value)) out.push_back(std::stoul(w));
    return out;
  };
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
    const std::string value = argv[i + 1];
    if (flag == "--nodes") {
      o.process_counts = value == "none" ? std::vector<std::size_t>{} : counts(value);
    } else if (flag == "--in-process") {
      o.in_process_counts = value == "none" ? std::vector<std::size_t>{} : counts(value);
    } else if (flag == "--sizes") {
      o.sizes.clear();
      for (const auto& w : split(value)) o.sizes.push_back(parse_size(w));
    } else if (flag == "--skip") {
      o.skip.clear();
      for (const auto& w : split(value)) {
        const auto x = w.find('x');
        if (x == std::string::npos) throw std::invalid_argument("--skip takes NODESxSIZE,...");
        o.skip.emplace_back(std::stoul(w.substr(0, x)), parse_size(w.substr(x + 1)));
      }
    } else if (flag == "--repeats") {
      o.repeats = std::stoul(value);
    } else if (flag == "--recovery-nodes") {
      o.recovery_nodes = std::stoul(value);
    } else if (flag == "--permissions") {
      if (value != "exact" && value != "broad")
        throw std::invalid_argument("--permissions is exact or broad");
      o.permissions = value == "exact" ? cubridge::bench::node_permissions::exact
                                       : cubridge::bench::node_permissions::broad;
    } else if (flag == "--out") {
      o.out = value;
    } else {
      throw std::invalid_argument("unknown option " + flag);
    }
  }
  return o;
}

int run(int argc, char** argv) {
  const auto o = parse_options(argc, argv);
  const auto uptime_before = command_output("uptime");
  const auto wall_start = steady::now();
  std::ostringstream text;  // the .txt besides the table
  json doc;

  utsname host{};
  ::uname(&host);
  const auto nproc = std::thread::hardware_concurrency();
  const auto cpu_model = first_line_with("/proc/cpuinfo", "model name");
  const auto memory = first_line_with("/proc/meminfo", "MemTotal");
  const auto server_version = command_output("/usr/sbin/nats-server --version 2>&1");
  doc["machine"] = {{"nproc", nproc},
                    {"cpu_model", cpu_model},
                    {"memory", memory},
                    {"kernel", std::string(host.release)},
                    {"nats_server", server_version},
                    {"libnats", nats_GetVersion()}};

  // Part 2 first, on an idle machine (no nodes yet).
  std::size_t total_nodes = o.recovery_nodes;
  for (const auto n : o.process_counts) total_nodes += n;
  for (const auto n : o.in_process_counts) total_nodes += n;
  std::cout << "# record costs (registry of " << total_nodes << " nodes)" << std::endl;
  const auto costs = cubridge::bench::measure_record_costs(total_nodes, 7);
  cubridge::testing::temp_dir gate_dir;
  const auto gate_cost = cubridge::bench::measure_gate_push(gate_dir.path, 21);

  bench b(o);
  const auto& one = b.plans().front();
  const auto allow =
      cubridge::bench::node_publish_allow(one.ids.front(), one.module, o.permissions);
  std::string allow_text;
  for (const auto& a : allow) allow_text += (allow_text.empty() ? "" : ", ") + a;

  std::vector<cell> cells;
  std::vector<group_summary> groups;
  for (const auto& g : b.plans()) {
    if (g.module == "bench_r") continue;
    group_summary summary;
    summary.settle_ms = b.settle();
    auto measured = b.run_group(g, summary);
    std::cout << table(measured) << std::flush;
    cells.insert(cells.end(), measured.begin(), measured.end());
    groups.push_back(summary);
  }
  (void)b.settle();
  std::cout << "# fetch: STREAM.MSG.GET (the old fetch) against a direct get (the agent's)"
            << std::endl;
  const auto fetches = b.compare_fetches();
  std::optional<recovery_report> recovery;
  for (const auto& g : b.plans())
    if (g.module == "bench_r") {
      (void)b.settle();
      std::cout << "# recovery, " << g.count << " node processes" << std::endl;
      recovery = b.run_recovery(g);
    }
  const double wall_s = ms_since(wall_start) / 1000;
  const auto uptime_after = command_output("uptime");

  // --- the text ---
  const auto results_table = table(cells);
  text << "command: " << command_line(argc, argv) << "\n"
       << "machine: nproc " << nproc << ", " << cpu_model << ", " << memory << ", Linux "
       << host.release << "\n"
       << "server:  " << server_version << " (JetStream, file store, max_payload 16MB), libnats "
       << nats_GetVersion() << "\n"
       << "uptime before: " << uptime_before << "\n"
       << "uptime after:  " << uptime_after << "\n"
       << "wall time: " << format("%.0f", wall_s) << " s\n\n"
       << "Authentication ON: an `authorization { users = [...] }` block of " << b.enrolled_total()
       << " node users and one operator user (every permission), plain passwords, one credentials\n"
       << "file each (agents: bus.credentials; node processes: --credentials). TLS OFF.\n"
       << "Node permissions (" << to_string(o.permissions) << "): publish allow [" << allow_text
       << "] (for node " << one.ids.front() << " of module " << one.module
       << "); subscribe allow [_INBOX.>].\n"
       << "Signed records on (always). Agents at their defaults: heartbeat 5 s, resync 2 s, "
          "retries 100 ms doubling to 2 s.\n"
       << "Every node verifies each bundle in full (SHA-256 of the whole bundle at fetch, then "
          "verify_bundle)\n"
       << "and writes its replay state (fsync'd) before and after its sink; the sink records the "
          "version only.\n\n"
       << "## 1. Publish to all converged (ms, medians of " << o.repeats << " runs)\n"
       << "converged: controller::publish until wait_for_results returned every node's "
          "verified result (the\n"
       << "operator's view; a call that threw is counted under wait errors and not made again: "
          "the fleet's\nview is then waited on alone, within the same 120 s);\n"
       << "fleet: when the last node's verified result reached a subscriber of this process "
          "(checked as the\n"
       << "controller checks: the enrolled key of the subject's node); publish: the publish call "
          "alone (bundle\n"
       << "stored, desired state written); res p50: the median node's result; vrfy/apply: the "
          "results' verify_ms\n"
       << "and apply_ms; srv/nod/bch cpu: CPU seconds of the nats-server, of the node processes, "
          "of this process\n"
       << "(publisher; in-process: every agent too) during the run; ok: runs where every node "
          "applied and\n"
       << "wait_for_results said so.\n\n"
       << results_table << "\n";
  for (const auto& g : groups)
    text << "group " << g.mode << " x" << g.nodes << " (" << g.module << "): server quiet after "
         << format("%.0f", g.settle_ms) << " ms, enrol " << format("%.0f", g.enroll_ms)
         << " ms, connected " << format("%.0f", g.ready_ms) << " ms, a 1 KiB warm-up rollout "
         << format("%.0f", g.warm_ms) << " ms; idle CPU (cores): server "
         << format("%.3f", g.idle_server_cpu) << ", node processes "
         << format("%.3f", g.idle_nodes_cpu) << ", bench " << format("%.3f", g.idle_bench_cpu)
         << "; server log: " << g.violations << " permission violations, " << g.slow_consumers
         << " slow consumers\n";

  // Targets.
  text << "\n## Targets\n";
  json targets = json::array();
  const auto target = [&](const std::string& name, const cell* c, double limit_ms,
                          bool need_success) {
    if (!c) {
      text << name << ": not measured\n";
      targets.push_back({{"target", name}, {"measured", false}});
      return;
    }
    const double ms = cell_median(*c, [](const run_sample& r) { return r.converged_ms; });
    const double fleet = cell_median(*c, [](const run_sample& r) { return r.fleet_ms; });
    const bool success = all_succeeded(*c);
    const bool met = ms <= limit_ms && (!need_success || success);
    const bool fleet_all = std::all_of(c->runs.begin(), c->runs.end(),
                                       [](const run_sample& r) { return r.fleet_converged; });
    std::size_t fleet_applied = 0;
    for (const auto& r : c->runs) fleet_applied = std::max(fleet_applied, r.fleet_applied);
    text << name << ": " << format("%.0f", ms) << " ms against " << format("%.0f", limit_ms)
         << " ms: " << (met ? "MET" : "MISSED") << " ("
         << (converged_runs(*c) == c->runs.size()
                 ? (ms <= limit_ms ? format("%.0f", limit_ms - ms) + " ms under"
                                   : format("%.0f", ms - limit_ms) + " ms over")
                 : std::string("not converged by then"))
         << "; the fleet's view: "
         << (fleet_all ? "every node's verified result by " + format("%.0f", fleet) + " ms"
                       : std::to_string(fleet_applied) + " of " + std::to_string(c->nodes) +
                             " nodes applied by " + format("%.0f", fleet) + " ms")
         << "; "
         << (success ? "every publish and wait_for_results reported success, every node applied"
                     : "NOT every run reported success: " + std::to_string(wait_errors(*c)) +
                           " wait_for_results errors, " + std::to_string(converged_runs(*c)) +
                           " of " + std::to_string(c->runs.size()) + " runs converged")
         << ")\n";
    targets.push_back({{"target", name},
                       {"measured", true},
                       {"median_ms", ms},
                       {"limit_ms", limit_ms},
                       {"fleet_median_ms", fleet},
                       {"all_succeeded", success},
                       {"met", met}});
  };
  target("100 node processes x 1 MiB within 1 s", find_cell(cells, "processes", 100, 1 << 20), 1000,
         false);
  target("100 in-process agents x 1 MiB within 1 s", find_cell(cells, "in-process", 100, 1 << 20),
         1000, false);
  target("100 node processes x 10 MiB within 10 s, reported as success",
         find_cell(cells, "processes", 100, 10 << 20), 10000, true);
  target("100 in-process agents x 10 MiB within 10 s, reported as success",
         find_cell(cells, "in-process", 100, 10 << 20), 10000, true);
  target("1,000 in-process agents x 1 MiB within 10 s",
         find_cell(cells, "in-process", 1000, 1 << 20), 10000, false);

  // Part 2.
  text << "\n## 2. Signing and checking records (us per record, median of " << costs.repeats
       << " loops)\n";
  const auto cost_line = [&](const char* name, const cubridge::bench::record_cost& k) {
    char line[256];
    std::snprintf(line, sizeof line,
                  "%-34s sign %8.1f  open %8.1f  parse %8.1f  (%zu bytes signed)\n", name,
                  k.sign_us, k.open_us, k.parse_us, k.bytes);
    text << line;
  };
  cost_line("result record", costs.result);
  cost_line("heartbeat (with its last result)", costs.heartbeat);
  cost_line("desired state (8 earlier versions)", costs.desired);
  cost_line(("registry of " + std::to_string(costs.registry_nodes) + " nodes").c_str(),
            costs.registry);
  text << "Per rollout of N nodes taking T ms: N results (sign + open + parse), N*T/5000 "
          "heartbeats (sign +\nopen + parse, as if read), N*(1 + T/2000) desired-state reads "
          "(open + parse: the watch's, then\nthe resync's), and the controller's desired read + "
          "sign and registry read.\n";
  json shares = json::array();
  for (const auto& c : cells) {
    if (c.nodes != 100 || c.runs.empty()) continue;
    const auto s = share_of(c, costs);
    char line[256];
    std::snprintf(line, sizeof line,
                  "%-10s 100 x %-7s: %5.0f results, %6.1f heartbeats, %6.1f desired reads: %7.2f "
                  "ms CPU of %8.1f ms = %5.2f %% (target <= 5 %%: %s)\n",
                  c.mode.c_str(), size_label(c.size).c_str(), s.results, s.heartbeats,
                  s.desired_reads, s.cpu_ms, s.rollout_ms, 100 * s.fraction(),
                  s.fraction() <= 0.05 ? "MET" : "MISSED");
    text << line;
    shares.push_back({{"mode", c.mode},
                      {"bundle_size", c.size},
                      {"results", s.results},
                      {"heartbeats", s.heartbeats},
                      {"desired_reads", s.desired_reads},
                      {"cpu_ms", s.cpu_ms},
                      {"rollout_ms", s.rollout_ms},
                      {"fraction", s.fraction()}});
  }

  // Part 3.
  text << "\n## 3. Where the time goes\n"
       << "Per cell, medians of the runs: what the server sent (its /varz out_bytes) against one "
          "bundle\nper node as the agent's direct get sends it (the bytes as stored) plus the "
          "bundle once into\nits stream; the messages it took\n(requests, publishes); CPU seconds "
          "of the server, the node processes "
          "and this process, against\nthe 2 cores' wall time; the agents' transient retries "
          "(fetches that timed out or failed) and\nresult publishes retried (in-process only).\n";
  {
    char line[320];
    std::snprintf(line, sizeof line,
                  "%-10s %5s %7s | %9s %9s %6s | %9s | %7s %7s %7s %8s | %8s %8s | %8s\n", "mode",
                  "nodes", "bundle", "sent MiB", "one each", "x", "msgs in", "srv cpu", "nod cpu",
                  "bch cpu", "of 2xwall", "retries", "res fail", "srv RSS");
    text << line;
    for (const auto& c : cells) {
      if (c.runs.empty()) continue;
      const auto m = [&c](auto field) { return cell_median(c, field); };
      const double sent = m([](const run_sample& r) { return r.server_out_mib; });
      // One copy per node (a direct get), and the bundle once into its stream (counted as sent).
      const double ideal =
          static_cast<double>(c.nodes * c.bundle_bytes + c.bundle_bytes) / (1 << 20);
      const double cpu =
          m([](const run_sample& r) { return r.server_cpu_s + r.nodes_cpu_s + r.bench_cpu_s; });
      const double wall = m([](const run_sample& r) { return r.converged_ms; }) / 1000;
      std::snprintf(line, sizeof line,
                    "%-10s %5zu %7s | %9.0f %9.0f %6.2f | %9.0f | %7.2f %7.2f %7.2f %7.0f%% | "
                    "%8.0f %8.0f | %7.0fM\n",
                    c.mode.c_str(), c.nodes, size_label(c.size).c_str(), sent, ideal,
                    ideal > 0 ? sent / ideal : 0,
                    m([](const run_sample& r) { return static_cast<double>(r.server_in_msgs); }),
                    m([](const run_sample& r) { return r.server_cpu_s; }),
                    m([](const run_sample& r) { return r.nodes_cpu_s; }),
                    m([](const run_sample& r) { return r.bench_cpu_s; }),
                    wall > 0 ? 100 * cpu / (2 * wall) : 0,
                    m([](const run_sample& r) { return static_cast<double>(r.retries); }),
                    m([](const run_sample& r) { return static_cast<double>(r.publish_failures); }),
                    m([](const run_sample& r) {
                      return static_cast<double>(r.server_peak_rss) / (1 << 20);
                    }));
      text << line;
    }
  }
  text << "A gate's apply (update_gate::push of a 1 KiB bundle, state file on the bench's disk, "
          "median of "
       << gate_cost.pushes << "):\n  push " << format("%.3f", gate_cost.push_ms) << " ms = verify "
       << format("%.3f", gate_cost.verify_ms) << " + sink " << format("%.3f", gate_cost.apply_ms)
       << " + state writes and checks " << format("%.3f", gate_cost.state_ms())
       << " ms (two fsync'd writes: in neither verify_ms nor apply_ms)\n"
       << "Fetching a bundle from this process (medians of 5), the nodes idle:\n";
  for (const auto& f : fetches) {
    char line[256];
    std::snprintf(line, sizeof line,
                  "  %-7s STREAM.MSG.GET request %7.1f ms (%zu bytes: JSON, base64), "
                  "js_GetLastMsg %7.1f ms, direct get %7.1f ms\n",
                  size_label(f.size).c_str(), f.msg_get_request_ms, f.response_bytes, f.msg_get_ms,
                  f.direct_get_ms);
    text << line;
  }

  // Part 4.
  if (recovery) {
    const auto& r = *recovery;
    const auto ms = [](double v) { return v < 0 ? std::string("never") : format("%.0f", v); };
    text << "\n## 4. Recovery (one run each, " << r.nodes
         << " node processes, agents' defaults; times from the restart)\n"
         << "node killed -9 inside its sink's apply (pending, not promoted): connected "
         << ms(r.mid_apply_ready_ms) << " ms, serving " << ms(r.mid_apply_serving_ms)
         << " ms, verified result " << ms(r.mid_apply_result_ms) << " ms (" << r.mid_apply_outcome
         << ")\n"
         << "node killed -9 after its promote, before its result: connected "
         << ms(r.after_promote_ready_ms) << " ms, verified result " << ms(r.after_promote_result_ms)
         << " ms (" << r.after_promote_outcome << ")\n"
         << "server killed -9 right after a publish (" << r.serving_at_kill << " of " << r.nodes
         << " nodes serving it at the kill): server up " << ms(r.server_up_ms)
         << " ms, all serving " << ms(r.server_all_serving_ms) << " ms, all verified results "
         << ms(r.server_all_results_ms) << " ms (" << r.server_results << " of " << r.nodes
         << ")\n";
    for (const auto& p : r.problems) text << "problem: " << p << "\n";
    doc["recovery"] = {{"nodes", r.nodes},
                       {"mid_apply_connected_ms", r.mid_apply_ready_ms},
                       {"mid_apply_serving_ms", r.mid_apply_serving_ms},
                       {"mid_apply_result_ms", r.mid_apply_result_ms},
                       {"mid_apply_outcome", r.mid_apply_outcome},
                       {"after_promote_connected_ms", r.after_promote_ready_ms},
                       {"after_promote_result_ms", r.after_promote_result_ms},
                       {"after_promote_outcome", r.after_promote_outcome},
                       {"server_serving_at_kill", r.serving_at_kill},
                       {"server_up_ms", r.server_up_ms},
                       {"server_all_serving_ms", r.server_all_serving_ms},
                       {"server_all_results_ms", r.server_all_results_ms},
                       {"server_results", r.server_results},
                       {"problems", r.problems}};
  }
  text << "\nserver log over the whole run: " << b.server().log_lines_with("Violation")
       << " permission violations, " << b.server().log_lines_with("Slow Consumer")
       << " slow consumers\n";

  // --- files ---
  json all = json::array();
  for (const auto& c : cells) all.push_back(to_json(c));
  json group_list = json::array();
  for (const auto& g : groups)
    group_list.push_back({{"mode", g.mode},
                          {"module", g.module},
                          {"nodes", g.nodes},
                          {"settle_ms", g.settle_ms},
                          {"warm_up_1kib_converged_ms", g.warm_ms},
                          {"enroll_ms", g.enroll_ms},
                          {"connected_ms", g.ready_ms},
                          {"idle_server_cores", g.idle_server_cpu},
                          {"idle_node_processes_cores", g.idle_nodes_cpu},
                          {"idle_bench_cores", g.idle_bench_cpu},
                          {"permission_violations", g.violations},
                          {"slow_consumers", g.slow_consumers}});
  const auto cost_json = [](const cubridge::bench::record_cost& k) {
    return json{{"sign_us", k.sign_us},
                {"open_us", k.open_us},
                {"parse_us", k.parse_us},
                {"bytes", k.bytes}};
  };
  json fetch_list = json::array();
  for (const auto& f : fetches)
    fetch_list.push_back({{"bundle_size", f.size},
                          {"error", f.error},
                          {"msg_get_response_bytes", f.response_bytes},
                          {"msg_get_request_ms", f.msg_get_request_ms},
                          {"js_get_last_msg_ms", f.msg_get_ms},
                          {"direct_get_ms", f.direct_get_ms}});
  doc["command"] = command_line(argc, argv);
  doc["uptime_before"] = uptime_before;
  doc["uptime_after"] = uptime_after;
  doc["wall_s"] = wall_s;
  doc["repeats"] = o.repeats;
  doc["authentication"] = {{"users", b.enrolled_total() + 1},
                           {"node_permissions", to_string(o.permissions)},
                           {"example_publish_allow", allow},
                           {"subscribe_allow", {"_INBOX.>"}},
                           {"tls", false}};
  doc["cells"] = all;
  doc["groups"] = group_list;
  doc["targets"] = targets;
  doc["record_costs"] = {{"repeats", costs.repeats},
                         {"registry_nodes", costs.registry_nodes},
                         {"result", cost_json(costs.result)},
                         {"heartbeat", cost_json(costs.heartbeat)},
                         {"desired_state", cost_json(costs.desired)},
                         {"registry", cost_json(costs.registry)},
                         {"share_of_100_node_rollouts", shares}};
  doc["gate_push"] = {{"pushes", gate_cost.pushes},
                      {"push_ms", gate_cost.push_ms},
                      {"verify_ms", gate_cost.verify_ms},
                      {"apply_ms", gate_cost.apply_ms},
                      {"state_writes_ms", gate_cost.state_ms()}};
  doc["fetch"] = fetch_list;

  std::filesystem::create_directories(o.out);
  std::ofstream(o.out / "fleet_control_plane.json") << doc.dump(2) << "\n";
  std::ofstream(o.out / "fleet_control_plane.txt") << text.str();
  std::ofstream(o.out / "fleet_control_plane.svg") << plot(cells, o.repeats);
  std::cout << "\n" << text.str();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::invalid_argument& e) {
    std::cerr << "bench_fleet: " << e.what() << "\n";
    return 64;
  } catch (const std::exception& e) {
    std::cerr << "bench_fleet: " << e.what() << "\n";
    return 1;
  }
}
