// The fleet under `cubridge fleet init`'s set-up (docs/fleet.md, "A connect storm" and "Scale";
// issue 33; CPU only): TLS on, a bus user per node with a bcrypt-hashed password, the nodes in an
// account of their own. One nats-server from the configuration init wrote, the operator's
// controller, and nodes that are processes (tests/fleet/fleet_node.cpp) or fleet_agents inside
// this process (in_process_node.hpp), all with the agent's default settings.
//
// Measured:
//   1. the storm: N node processes started at once, then M in-process agents started at once:
//      the time until every one is live (a heartbeat the server received), and again after the
//      server is killed -9 and started on the same store: until every node sent a heartbeat the
//      new server received;
//   2. rollouts: publish to every node's verified result, 100 processes x 1 MiB and x 10 MiB,
//      M in-process x 1 MiB, each `--repeats` times with a fresh version, medians reported.
//
//   bench_fleet_storm [--processes 300] [--in-process 1000] [--repeats 3] [--out DIR]
//
// Prints the results as it goes; writes DIR/fleet_storm.json and .txt.
#include "bundle/source_bundles.hpp"
#include "fleet/fleet_init.hpp"
#include "fleet/fleet_node_process.hpp"
#include "in_process_node.hpp"
#include "nats_server.hpp"

#include <cubridge/fleet/controller.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;
using cubridge::bench::in_process_node;
using cubridge::testing::fleet_node_process;
using json = nlohmann::json;

constexpr auto deadline = 120s;
const std::string module = "filters";

double seconds_since(steady::time_point start) {
  return std::chrono::duration<double>(steady::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0 : values[values.size() / 2];
}

std::string node_id(std::size_t i) {
  auto number = std::to_string(i + 1);
  return "p" + std::string(number.size() < 4 ? 4 - number.size() : 0, '0') + number;
}

struct bench {
  cubridge::testing::temp_dir dir;
  std::filesystem::path fleet = dir.path / "fleet";
  std::size_t enrolled_count = 0;
  std::unique_ptr<cubridge::testing::nats_server> server;
  std::unique_ptr<cubridge::fleet::controller> control;
  std::optional<cubridge::secret_key> operator_secret;
  cubridge::public_key operator_public{};
  std::uint64_t version = 0;
  json results = json::object();

  std::string url() const { return "tls://127.0.0.1:" + std::to_string(server->port()); }

  explicit bench(std::size_t nodes) {
    cubridge::tool::fleet_init_options o;
    o.dir = fleet;
    for (std::size_t i = 0; i < nodes; ++i) o.nodes.push_back(node_id(i));
    o.hosts = {"127.0.0.1"};
    const auto ports = cubridge::testing::free_ports(2);
    o.port = ports[0];
    o.cluster_port = ports[1];
    const auto init = steady::now();
    cubridge::tool::write_fleet_init(o);
    std::printf("fleet init of %zu nodes: %.2f s\n", nodes, seconds_since(init));
    server = std::make_unique<cubridge::testing::nats_server>(
        cubridge::testing::nats_config::from_file(fleet / "server.conf"), ports[0]);
    operator_secret.emplace(cubridge::read_secret_key_file(fleet / "operator.key"));
    operator_public = operator_secret->public_key();
    connect();
  }

  void connect() {
    auto o = cubridge::fleet::controller_options{};
    o.bus = cubridge::fleet::read_bus_profile(fleet / "operator.profile");
    o.bus.servers = url();
    o.operator_keys.add(operator_public);
    control = std::make_unique<cubridge::fleet::controller>(o);
  }

  void enroll(const std::string& id, const cubridge::public_key& key) {
    control->enroll(id, key, {}, *operator_secret);
    ++enrolled_count;
  }

  // Seconds until `count` nodes are live with a heartbeat received after `after`; -1 past the
  // deadline.
  double until_live(std::size_t count, std::chrono::system_clock::time_point after,
                    steady::time_point start) {
    while (steady::now() - start < deadline) {
      std::size_t live = 0;
      try {
        for (const auto& n : control->nodes()) live += n.live && n.received > after ? 1U : 0U;
      } catch (const cubridge::error& e) {  // a server too busy to answer: asked again
        std::printf("  (reading the nodes: %s)\n", e.what());
      }
      if (live >= count) return seconds_since(start);
      std::this_thread::sleep_for(200ms);
    }
    return -1;
  }

  // The server killed -9 and started again on its store: seconds until `count` nodes sent a
  // heartbeat the new server received.
  double restart_server(std::size_t count) {
    control.reset();
    server->kill();
    server->start();
    const auto start = steady::now();
    const auto restarted = std::chrono::system_clock::now();
    connect();
    return until_live(count, restarted, start);
  }

  // Seconds from publish to every node's verified result for the new revision.
  double roll_out(const std::vector<std::string>& nodes, std::size_t bytes) {
    const auto bundle =
        cubridge::testing::source_bundle(module, ++version, *operator_secret, "sm_90", bytes);
    const auto start = steady::now();
    const auto report = control->publish(bundle, *operator_secret);
    const auto results = control->wait_for_results(
        module, report.desired.revision, report.desired.stable->digest, nodes,
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline));
    const auto took = seconds_since(start);
    if (results.size() < nodes.size()) {
      std::printf("  v%llu: %zu of %zu results within %lld s\n",
                  static_cast<unsigned long long>(version), results.size(), nodes.size(),
                  static_cast<long long>(deadline.count()));
      return -1;
    }
    return took;
  }

  void rollouts(const std::string& name, const std::vector<std::string>& nodes, std::size_t bytes,
                int repeats) {
    std::vector<double> runs;
    for (int i = 0; i < repeats; ++i) runs.push_back(roll_out(nodes, bytes));
    const bool all = std::all_of(runs.begin(), runs.end(), [](double t) { return t >= 0; });
    std::printf("%-34s median %.3f s  runs", name.c_str(), all ? median(runs) : -1.0);
    for (const double t : runs) std::printf(" %.3f", t);
    std::printf("\n");
    results["rollouts"][name] = {{"median_s", all ? median(runs) : -1.0}, {"runs_s", runs}};
  }
};

std::vector<std::string> argument_list(int argc, char** argv) {
  return {argv + 1, argv + argc};
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line as it comes, whatever ends the run
  std::size_t processes = 300, in_process = 1000;
  int repeats = 3;
  std::filesystem::path out = ".";
  const auto args = argument_list(argc, argv);
  for (std::size_t i = 0; i + 1 < args.size(); i += 2) {
    if (args[i] == "--processes")
      processes = std::stoul(args[i + 1]);
    else if (args[i] == "--in-process")
      in_process = std::stoul(args[i + 1]);
    else if (args[i] == "--repeats")
      repeats = std::stoi(args[i + 1]);
    else if (args[i] == "--out")
      out = args[i + 1];
    else {
      std::cerr << "bench_fleet_storm: unknown argument " << args[i] << "\n";
      return 64;
    }
  }
  try {
    bench b(std::max(processes, in_process));
    b.results["setup"] = {{"tls", true},
                          {"auth", "bcrypt cost 4, a user per node, nodes in their own account"},
                          {"processes", processes},
                          {"in_process", in_process}};
    (void)b.control->publish(
        cubridge::testing::source_bundle(module, ++b.version, *b.operator_secret, "sm_90", 1 << 10),
        *b.operator_secret);

    // 1. The storm of node processes.
    std::vector<std::unique_ptr<fleet_node_process>> nodes;
    for (std::size_t i = 0; i < processes; ++i) {
      nodes.push_back(std::make_unique<fleet_node_process>(node_id(i), b.dir.path));
      b.enroll(nodes.back()->id(), nodes.back()->public_key());
    }
    const auto storm = steady::now();
    const auto storm_wall = std::chrono::system_clock::now() - 1s;
    for (auto& n : nodes)
      n->start(b.url(), b.fleet / "operator.pub", module,
               {"--credentials", (b.fleet / "nodes" / (n->id() + ".creds")).string(), "--ca",
                (b.fleet / "ca.pem").string()});
    const double processes_live = b.until_live(processes, storm_wall, storm);
    std::printf("%zu node processes started at once: all live after %.2f s\n", processes,
                processes_live);
    const double processes_back = b.restart_server(processes);
    std::printf("  server killed and restarted: all %zu back after %.2f s\n", processes,
                processes_back);
    b.results["storm"]["processes"] = {
        {"nodes", processes}, {"all_live_s", processes_live}, {"all_back_s", processes_back}};

    // 2. Rollouts to 100 processes.
    while (nodes.size() > 100) nodes.pop_back();  // killed with the objects
    std::vector<std::string> hundred;
    for (const auto& n : nodes) hundred.push_back(n->id());
    b.rollouts("100 processes x 1 MiB", hundred, 1 << 20, repeats);
    b.rollouts("100 processes x 10 MiB", hundred, 10 << 20, repeats);
    nodes.clear();

    // 3. The storm of in-process agents, then rollouts to them.
    std::vector<std::unique_ptr<in_process_node>> agents;
    const auto agent_dir = b.dir.path / "agents";
    std::filesystem::create_directories(agent_dir);
    std::vector<std::string> ids;
    for (std::size_t i = 0; i < in_process; ++i) {
      const auto id = node_id(i);
      agents.push_back(std::make_unique<in_process_node>(
          id, agent_dir, module, b.operator_public, b.url(), b.fleet / "nodes" / (id + ".creds"),
          b.fleet / "ca.pem"));
      b.enroll(id, agents.back()->public_key());
      ids.push_back(id);
    }
    const auto agent_storm = steady::now();
    const auto agent_wall = std::chrono::system_clock::now() - 1s;
    // Started together, as nodes that boot at once do: each start() reads its key, writes and
    // fsyncs its gate's replay state and checks its CA and credentials (~80 ms here, one after
    // another 80 s for 1,000), so 32 threads start them.
    {
      std::atomic<std::size_t> next{0};
      std::vector<std::thread> starters;
      for (int t = 0; t < 32; ++t)
        starters.emplace_back([&] {
          for (std::size_t i = next++; i < agents.size(); i = next++) agents[i]->start();
        });
      for (auto& t : starters) t.join();
    }
    std::printf("  (start() of all %zu agents returned after %.2f s)\n", in_process,
                seconds_since(agent_storm));
    const double agents_live = b.until_live(in_process, agent_wall, agent_storm);
    std::printf("%zu in-process agents started at once: all live after %.2f s\n", in_process,
                agents_live);
    const double agents_back = b.restart_server(in_process);
    std::printf("  server killed and restarted: all %zu back after %.2f s\n", in_process,
                agents_back);
    b.results["storm"]["in_process"] = {
        {"nodes", in_process}, {"all_live_s", agents_live}, {"all_back_s", agents_back}};
    b.rollouts(std::to_string(in_process) + " in-process x 1 MiB", ids, 1 << 20, repeats);
    for (auto& a : agents) a->stop();

    std::filesystem::create_directories(out);
    std::ofstream(out / "fleet_storm.json") << b.results.dump(2) << "\n";
    std::printf("wrote %s\n", (out / "fleet_storm.json").c_str());
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_fleet_storm: " << e.what() << "\n";
    return 1;
  }
}
