// The online-service demo's load: N threads, each with its own keep-alive connection, send
// POST /v1/infer {"seed": K} back to back for D seconds and record every request.
//
//   online_load_client --url http://127.0.0.1:8080 --threads 4 --duration 10 --out requests.csv
//
// CSV, one line per request: thread,send_unix,latency_us,status,version,ok,error
//   send_unix   when it was sent (system clock, as the service's log), seconds
//   latency_us  send to full answer, measured here
//   status      HTTP status; 0 when no answer came (error says why)
//   ok          1 when the answer is 200 with the right result (2 * seed + 2)
// Prints one summary line; exit 0 when every request was ok, 1 otherwise, 64 bad command line.
#include <httplib.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace {

using json = nlohmann::json;

struct record {
  double send_unix = 0;
  double latency_us = 0;
  int status = 0;
  unsigned version = 0;
  bool ok = false;
  std::string error;
};

// What one answer says, and whether it is right for `seed`.
void judge(const httplib::Response& response, unsigned seed, record& r) {
  r.status = response.status;
  const auto body = json::parse(response.body, nullptr, false);
  if (body.is_discarded() || !body.is_object()) {
    r.error = "not JSON";
    return;
  }
  if (response.status != 200) {
    r.error = body.value("error", "?") + ": " + body.value("detail", "");
    r.version = body.value("version", 0u);
    return;
  }
  r.version = body.value("version", 0u);
  const double result = body.value("result", -1.0);
  const double expected = 2.0 * seed + 2.0;
  r.ok = r.version != 0 && std::fabs(result - expected) <= 1e-3 * (1 + expected);
  if (!r.ok)
    r.error = "result " + std::to_string(result) + ", expected " + std::to_string(expected);
}

void run_thread(const std::string& url, unsigned index, std::chrono::steady_clock::time_point end,
                int timeout_s, std::vector<record>& out) {
  httplib::Client client(url);
  client.set_connection_timeout(timeout_s, 0);
  client.set_read_timeout(timeout_s, 0);
  client.set_write_timeout(timeout_s, 0);
  client.set_keep_alive(true);
  client.set_tcp_nodelay(true);
  for (unsigned i = 0; std::chrono::steady_clock::now() < end; ++i) {
    const unsigned seed = (index * 7919 + i) % 1000;
    record r;
    r.send_unix =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    const auto t0 = std::chrono::steady_clock::now();
    auto response =
        client.Post("/v1/infer", "{\"seed\":" + std::to_string(seed) + "}", "application/json");
    r.latency_us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (response)
      judge(*response, seed, r);
    else
      r.error = httplib::to_string(response.error());
    const bool answered = r.status != 0;
    out.push_back(std::move(r));
    // No answer: do not spin on a dead endpoint.
    if (!answered) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string url = "http://127.0.0.1:8080";
  unsigned threads = 4;
  double duration = 10;
  int timeout_s = 5;
  std::string out_path;
  CLI::App app{"online_load_client: requests against online_service, every one recorded"};
  app.add_option("--url", url, "The service, http://HOST:PORT");
  app.add_option("--threads", threads, "Client threads, one connection each")
      ->check(CLI::Range(1, 256));
  app.add_option("--duration", duration, "Seconds to send for")->check(CLI::PositiveNumber);
  app.add_option("--timeout", timeout_s, "Seconds to wait to connect, send, and for each answer")
      ->check(CLI::Range(1, 120));
  app.add_option("--out", out_path, "CSV file of every request")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 64;
  }
  std::signal(SIGPIPE, SIG_IGN);
  {
    httplib::Client probe(url);
    if (!probe.is_valid()) {
      std::fprintf(stderr, "online_load_client: '%s' is not an http://HOST:PORT URL\n",
                   url.c_str());
      return 64;
    }
  }
  std::FILE* file = std::fopen(out_path.c_str(), "w");
  if (!file) {
    std::fprintf(stderr, "online_load_client: cannot write %s\n", out_path.c_str());
    return 1;
  }

  std::vector<std::vector<record>> records(threads);
  const auto end = std::chrono::steady_clock::now() +
                   std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                       std::chrono::duration<double>(duration));
  {
    std::vector<std::thread> workers;
    for (unsigned t = 0; t < threads; ++t)
      workers.emplace_back(run_thread, std::cref(url), t, end, timeout_s, std::ref(records[t]));
    for (auto& w : workers) w.join();
  }

  std::fprintf(file, "thread,send_unix,latency_us,status,version,ok,error\n");
  std::size_t total = 0, failed = 0;
  std::map<unsigned, std::size_t> per_version;
  std::string first_error;
  for (unsigned t = 0; t < threads; ++t)
    for (const auto& r : records[t]) {
      std::string error = r.error;
      for (char& c : error)
        if (c == ',' || c == '\n' || c == '"') c = ' ';
      std::fprintf(file, "%u,%.6f,%.1f,%d,%u,%d,%s\n", t, r.send_unix, r.latency_us, r.status,
                   r.version, r.ok ? 1 : 0, error.c_str());
      ++total;
      if (r.ok)
        ++per_version[r.version];
      else if (++failed == 1)
        first_error = error;
    }
  const bool written = std::fclose(file) == 0;
  std::string versions;
  for (const auto& [v, n] : per_version)
    versions +=
        (versions.empty() ? "" : ", ") + ("v" + std::to_string(v)) + ": " + std::to_string(n);
  std::printf("online_load_client: %zu requests in %.1f s from %u threads, %zu failed (%s)%s%s\n",
              total, duration, threads, failed, versions.c_str(), failed ? "; first failure: " : "",
              first_error.c_str());
  if (!written) {
    std::fprintf(stderr, "online_load_client: writing %s failed\n", out_path.c_str());
    return 1;
  }
  return failed == 0 ? 0 : 1;
}
