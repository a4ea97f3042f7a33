// The fleet's scale benchmark (docs/fleet.md, "Scale"; CPU only): the time from one publish to
// every node acknowledged (every node's result record seen) for N node processes
// (tests/fleet/fleet_node.cpp) and bundle sizes, against the same bundle pushed over HTTP to each
// node's update endpoint, one after another and in parallel (a thread per node). The nodes'
// recording sink never loads the payload: a bundle is a signed CUDA-source bundle padded to the
// size (verified in full, SHA-256 and signature, as any bundle is).
//
//   bench_fleet [--nodes 1,10,50,100] [--sizes 100K,1M,10M] [--repeats 3] [--out DIR]
//
// Prints a table; writes DIR/fleet_scale.json, DIR/fleet_scale.txt and DIR/fleet_scale.svg.
#include "fleet/fleet_node_process.hpp"
#include "fleet_plot.hpp"
#include "nats_server.hpp"
#include "update/source_bundles.hpp"

#include <cubridge/fleet/controller.hpp>
#include <cubridge/fleet/records.hpp>

#include <httplib.h>
#include <nats/nats.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;
using cubridge::testing::fleet_node_process;
using json = nlohmann::json;

double ms_since(clock_type::time_point start) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - start).count();
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
  for (std::string word; std::getline(in, word, ',');) out.push_back(word);
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

// The result records of one module as they arrive (a core NATS subscription: JetStream
// publishes are ordinary messages on their subjects), stamped on arrival.
class result_listener {
 public:
  result_listener(const std::string& url, const std::string& module) {
    check(natsConnection_ConnectTo(&connection_, url.c_str()), "connect");
    check(natsConnection_SubscribeSync(&subscription_, connection_,
                                       ("cubridge.result." + module + ".*").c_str()),
          "subscribe");
    check(natsConnection_Flush(connection_), "flush");  // the server has it before we publish
  }
  ~result_listener() {
    natsSubscription_Destroy(subscription_);
    natsConnection_Destroy(connection_);
  }
  result_listener(const result_listener&) = delete;
  result_listener& operator=(const result_listener&) = delete;

  struct arrival {
    cubridge::fleet::result_record record;
    clock_type::time_point at;
  };
  // The first record of `version` from each of `nodes` nodes, until `deadline`.
  std::map<std::string, arrival> collect(std::uint64_t version, std::size_t nodes,
                                         clock_type::time_point deadline) {
    std::map<std::string, arrival> seen;
    while (seen.size() < nodes && clock_type::now() < deadline) {
      natsMsg* message = nullptr;
      if (natsSubscription_NextMsg(&message, subscription_, 200) != NATS_OK) continue;
      const auto at = clock_type::now();
      const std::string text(natsMsg_GetData(message),
                             static_cast<std::size_t>(natsMsg_GetDataLength(message)));
      natsMsg_Destroy(message);
      if (auto record = cubridge::fleet::parse_result_record(text);
          record && record->version == version) {
        std::string node = record->node;  // the key before the record moves
        seen.emplace(std::move(node), arrival{std::move(*record), at});
      }
    }
    return seen;
  }

 private:
  static void check(natsStatus status, const char* what) {
    if (status != NATS_OK)
      throw std::runtime_error(std::string("libnats ") + what + ": " + natsStatus_GetText(status));
  }
  natsConnection* connection_ = nullptr;
  natsSubscription* subscription_ = nullptr;
};

// One HTTP push of `bundle` to a node's endpoint; true when it was promoted (200).
bool push(int port, const std::string& module, const std::vector<std::byte>& bundle) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(10, 0);
  client.set_read_timeout(120, 0);
  client.set_write_timeout(120, 0);
  const auto answer =
      client.Put("/v1/modules/" + module, reinterpret_cast<const char*>(bundle.data()),
                 bundle.size(), "application/octet-stream");
  return answer && answer->status == 200;
}

struct cell {
  std::size_t nodes = 0, size = 0, bundle_bytes = 0;
  std::vector<double> fleet_ms, http_sequential_ms, http_parallel_ms;
  std::vector<double> ack_p50_ms, ack_max_ms, apply_p50_ms, apply_max_ms, verify_p50_ms,
      verify_max_ms;
  std::size_t failures = 0;
};

class bench {
 public:
  bench(std::size_t repeats) : repeats_(repeats) {
    cubridge::write_key_file(key_file_, keys_.public_key);
    control_ = std::make_unique<cubridge::fleet::controller>(
        cubridge::fleet::controller_options{server_.url()});
  }

  // Starts `count` nodes for a module of their own, measures every size, stops them.
  std::vector<cell> run_node_count(std::size_t count, const std::vector<std::size_t>& sizes) {
    const std::string module = "bench_n" + std::to_string(count);
    std::vector<std::unique_ptr<fleet_node_process>> nodes;
    std::vector<int> ports;
    for (std::size_t i = 0; i < count; ++i) {
      nodes.push_back(
          std::make_unique<fleet_node_process>(module + "_" + std::to_string(i), dir_.path));
      nodes.back()->start(server_.url(), key_file_, module,
                          {"--http-port", "0", "--heartbeat-ms", "5000"});
    }
    for (auto& node : nodes) {
      if (!node->wait_line("ready", 120s))
        throw std::runtime_error(node->id() + " never ready: " + node->exit_text());
      const auto line = node->lines().front();
      ports.push_back(std::stoi(line.substr(line.find("http=") + 5)));
    }
    std::vector<cell> cells;
    for (const auto size : sizes) cells.push_back(measure(module, nodes.size(), ports, size));
    for (auto& node : nodes) node->stop();
    return cells;
  }

 private:
  cell measure(const std::string& module, std::size_t count, const std::vector<int>& ports,
               std::size_t size) {
    cell c;
    c.nodes = count;
    c.size = size;
    for (std::size_t r = 0; r < repeats_; ++r) {
      // Each way gets a version of its own: the fleet's and the endpoint's replay floors both
      // refuse a version that serves.
      const auto fleet_bundle = bundle(module, size);
      c.bundle_bytes = fleet_bundle.size();
      fleet_round(module, count, fleet_bundle, c);
      const auto sequential = bundle(module, size);
      auto start = clock_type::now();
      for (const int port : ports) c.failures += push(port, module, sequential) ? 0 : 1;
      c.http_sequential_ms.push_back(ms_since(start));
      const auto parallel = bundle(module, size);
      std::atomic<std::size_t> failed{0};
      start = clock_type::now();
      {
        std::vector<std::jthread> pushers;
        for (const int port : ports)
          pushers.emplace_back([&, port] { failed += push(port, module, parallel) ? 0 : 1; });
      }
      c.http_parallel_ms.push_back(ms_since(start));
      c.failures += failed;
    }
    return c;
  }

  void fleet_round(const std::string& module, std::size_t count, const std::vector<std::byte>& data,
                   cell& c) {
    result_listener listener(server_.url(), module);
    const auto start = clock_type::now();
    control_->publish(data, module);
    const auto seen = listener.collect(version_, count, start + 180s);
    std::vector<double> ack, apply, verify;
    for (const auto& [node, arrival] : seen) {
      if (arrival.record.outcome != cubridge::gate_outcome::applied) ++c.failures;
      ack.push_back(std::chrono::duration<double, std::milli>(arrival.at - start).count());
      apply.push_back(arrival.record.apply_ms);
      verify.push_back(arrival.record.verify_ms);
    }
    c.failures += count - seen.size();
    c.fleet_ms.push_back(maximum(ack));
    c.ack_p50_ms.push_back(median(ack));
    c.ack_max_ms.push_back(maximum(ack));
    c.apply_p50_ms.push_back(median(apply));
    c.apply_max_ms.push_back(maximum(apply));
    c.verify_p50_ms.push_back(median(verify));
    c.verify_max_ms.push_back(maximum(verify));
  }

  // A signed bundle of the next version, `size` bytes or a few over (the manifest varies).
  std::vector<std::byte> bundle(const std::string& module, std::size_t size) {
    ++version_;
    const auto bare = cubridge::testing::source_bundle(module, version_, keys_.secret_key).size();
    return cubridge::testing::source_bundle(module, version_, keys_.secret_key, "sm_90",
                                            size > bare ? size - bare : 0);
  }

  std::size_t repeats_;
  cubridge::testing::nats_server server_;
  cubridge::testing::temp_dir dir_;
  cubridge::keypair keys_ = cubridge::generate_keypair();
  std::filesystem::path key_file_ = dir_.path / "trusted.pub";
  std::unique_ptr<cubridge::fleet::controller> control_;
  std::uint64_t version_ = 0;
};

json to_json(const cell& c) {
  return {{"nodes", c.nodes},
          {"bundle_size", c.size},
          {"bundle_bytes", c.bundle_bytes},
          {"fleet_all_acked_ms", median(c.fleet_ms)},
          {"fleet_all_acked_ms_runs", c.fleet_ms},
          {"http_sequential_ms", median(c.http_sequential_ms)},
          {"http_sequential_ms_runs", c.http_sequential_ms},
          {"http_parallel_ms", median(c.http_parallel_ms)},
          {"http_parallel_ms_runs", c.http_parallel_ms},
          {"node_ack_p50_ms", median(c.ack_p50_ms)},
          {"node_ack_max_ms", median(c.ack_max_ms)},
          {"node_apply_p50_ms", median(c.apply_p50_ms)},
          {"node_apply_max_ms", median(c.apply_max_ms)},
          {"node_verify_p50_ms", median(c.verify_p50_ms)},
          {"node_verify_max_ms", median(c.verify_max_ms)},
          {"failures", c.failures}};
}

std::string table(const std::vector<cell>& cells) {
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof line, "%6s %8s | %10s %9s %9s | %8s %8s | %8s %8s | %9s %9s | %s\n",
                "nodes", "bundle", "fleet ms", "http seq", "http par", "ack p50", "ack max",
                "vrfy p50", "vrfy max", "apply p50", "apply max", "fail");
  out << line;
  for (const auto& c : cells) {
    std::snprintf(line, sizeof line,
                  "%6zu %8s | %10.1f %9.1f %9.1f | %8.1f %8.1f | %8.2f %8.2f | %9.3f %9.3f | %zu\n",
                  c.nodes, size_label(c.size).c_str(), median(c.fleet_ms),
                  median(c.http_sequential_ms), median(c.http_parallel_ms), median(c.ack_p50_ms),
                  median(c.ack_max_ms), median(c.verify_p50_ms), median(c.verify_max_ms),
                  median(c.apply_p50_ms), median(c.apply_max_ms), c.failures);
    out << line;
  }
  return out.str();
}

std::string plot(const std::vector<cell>& cells, std::size_t repeats) {
  const std::vector<std::pair<std::size_t, std::string>> colours = {
      {100 << 10, "#6baed6"}, {1 << 20, "#2171b5"}, {10 << 20, "#08306b"}};
  std::vector<cubridge::bench::plot_series> series;
  for (const auto& [size, colour] : colours) {
    cubridge::bench::plot_series s{"fleet, " + size_label(size), colour, false, {}};
    for (const auto& c : cells)
      if (c.size == size) s.points.emplace_back(c.nodes, median(c.fleet_ms));
    if (!s.points.empty()) series.push_back(std::move(s));
  }
  cubridge::bench::plot_series sequential{"HTTP one by one, 1 MiB", "#d94801", true, {}};
  cubridge::bench::plot_series parallel{"HTTP in parallel, 1 MiB", "#f16913", true, {}};
  for (const auto& c : cells)
    if (c.size == (1 << 20)) {
      sequential.points.emplace_back(c.nodes, median(c.http_sequential_ms));
      parallel.points.emplace_back(c.nodes, median(c.http_parallel_ms));
    }
  series.push_back(std::move(sequential));
  series.push_back(std::move(parallel));
  return cubridge::bench::render_plot(
      "Fleet rollout: publish to every node acknowledged",
      "one nats-server and N node processes on one 2-core machine; median of " +
          std::to_string(repeats) + " runs",
      series);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::size_t> counts = {1, 10, 50, 100};
  std::vector<std::size_t> sizes = {100 << 10, 1 << 20, 10 << 20};
  std::size_t repeats = 3;
  std::filesystem::path out = ".";
  try {
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string flag = argv[i], value = argv[i + 1];
      if (flag == "--nodes") {
        counts.clear();
        for (const auto& w : split(value)) counts.push_back(std::stoul(w));
      } else if (flag == "--sizes") {
        sizes.clear();
        for (const auto& w : split(value)) sizes.push_back(parse_size(w));
      } else if (flag == "--repeats") {
        repeats = std::stoul(value);
      } else if (flag == "--out") {
        out = value;
      } else {
        throw std::invalid_argument("unknown option " + flag);
      }
    }
    bench b(repeats);
    std::vector<cell> cells;
    for (const auto count : counts) {
      auto measured = b.run_node_count(count, sizes);
      std::cout << table(measured) << std::flush;
      cells.insert(cells.end(), measured.begin(), measured.end());
    }
    std::filesystem::create_directories(out);
    const auto text = table(cells);
    std::cout << "\n" << text;
    json all = json::array();
    for (const auto& c : cells) all.push_back(to_json(c));
    std::ofstream(out / "fleet_scale.json")
        << json{{"repeats", repeats}, {"cells", all}}.dump(2) << "\n";
    std::ofstream(out / "fleet_scale.txt") << text;
    std::ofstream(out / "fleet_scale.svg") << plot(cells, repeats);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_fleet: " << e.what() << "\n";
    return 1;
  }
}
