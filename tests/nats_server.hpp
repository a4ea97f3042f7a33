#pragma once
// A real nats-server for the fleet tests (docs/fleet.md, Testing): Debian's nats-server as a
// child process with JetStream on, `max_payload: 16MB`, its own store directory and a free
// loopback port. It can be stopped and started again on the same port and store (the
// server-down tests), and is killed when the object goes. A server can also be started from a
// configuration of the test's own (nats_config: `cubridge fleet init`'s, with TLS and users),
// and nats_cluster runs three of them as one JetStream cluster on loopback.

#include "temp_dir.hpp"

#include <cubridge/core/detail/child_process.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#if __has_include(<nats/nats.h>)
#include <nats/nats.h>
#define CUBRIDGE_TESTING_HAS_NATS 1
#endif

namespace cubridge::testing {

/// The server program: $CUBRIDGE_NATS_SERVER, else Debian's /usr/sbin/nats-server, else
/// /usr/bin/nats-server (an upstream install).
inline std::string nats_server_program() {
  if (const char* chosen = std::getenv("CUBRIDGE_NATS_SERVER"); chosen && *chosen) return chosen;
  if (::access("/usr/sbin/nats-server", X_OK) == 0) return "/usr/sbin/nats-server";
  return "/usr/bin/nats-server";
}

/// A configuration of the test's own for nats_server: its text (written into the server's
/// directory) or a file (used where it is). Either way the server listens where the fixture
/// says: `-a 127.0.0.1 -p PORT` on its command line replace the configuration's host and port.
struct nats_config {
  std::string text;
  std::filesystem::path file;
  /// More command-line arguments, after the fixture's (e.g. `--cluster`, `--routes`).
  std::vector<std::string> arguments;

  [[nodiscard]] static nats_config from_text(std::string text) {
    nats_config c;
    c.text = std::move(text);
    return c;
  }
  [[nodiscard]] static nats_config from_file(std::filesystem::path file) {
    nats_config c;
    c.file = std::move(file);
    return c;
  }
};

/// Free loopback ports, `count` distinct ones (each held open until all are picked).
inline std::vector<int> free_ports(std::size_t count) {
  std::vector<int> fds, ports;
  std::string problem;
  for (std::size_t i = 0; i < count && problem.empty(); ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0)
      problem = std::strerror(errno);
    if (fd >= 0) fds.push_back(fd);
    ports.push_back(ntohs(address.sin_port));
  }
  for (const int fd : fds) ::close(fd);
  if (!problem.empty()) throw std::runtime_error("no free loopback port: " + problem);
  return ports;
}

/// A nats-server on 127.0.0.1, started by the constructor.
class nats_server {
 public:
  /// How long start() waits for the server to take connections.
  static constexpr std::chrono::seconds start_deadline{30};

  /// Starts a server on a free port; `max_payload` goes into its configuration as written.
  /// @throws std::runtime_error with the server's log when it does not start.
  explicit nats_server(std::string max_payload = "16MB") : max_payload_(std::move(max_payload)) {
    write_text(config_file(), "max_payload: " + max_payload_ + "\njetstream {\n  store_dir: \"" +
                                  (dir_.path / "store").string() + "\"\n}\n");
    start_on_free_port();
  }

  /// Starts a server from `config` on `port`, or on a free port when 0.
  /// @throws std::runtime_error with the server's log when it does not start.
  explicit nats_server(const nats_config& config, int port = 0) : arguments_(config.arguments) {
    if (!config.file.empty())
      config_ = config.file;
    else
      write_text(config_file(), config.text);
    if (port == 0) {
      start_on_free_port();
    } else {
      port_ = port;
      start();
    }
  }
  nats_server(const nats_server&) = delete;
  nats_server& operator=(const nats_server&) = delete;
  ~nats_server() { (void)process_.kill(); }

  /// "nats://127.0.0.1:PORT".
  [[nodiscard]] std::string url() const { return "nats://127.0.0.1:" + std::to_string(port_); }
  /// "tls://127.0.0.1:PORT" (a configuration with `tls { }`).
  [[nodiscard]] std::string tls_url() const { return "tls://127.0.0.1:" + std::to_string(port_); }
  [[nodiscard]] int port() const noexcept { return port_; }
  [[nodiscard]] bool running() const noexcept { return process_.running(); }
  [[nodiscard]] const std::filesystem::path& store_dir() const noexcept { return dir_.path; }

  /// Starts the server (again) on the same port and store; returns once it takes connections.
  /// @throws std::runtime_error with its log when it exits or does not answer in time.
  void start() {
    if (process_.running()) return;
    const auto log_path = dir_.path / "server.log";
    const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    detail::child_spec spec;
    spec.program = nats_server_program();
    spec.args = {"-js",       "-c", config_file().string(), "-a",
                 "127.0.0.1", "-p", std::to_string(port_)};
    spec.args.insert(spec.args.end(), arguments_.begin(), arguments_.end());
    spec.environment = detail::current_environment();
    spec.fds = {{0, null}, {1, log}, {2, log}};
    try {
      process_ = detail::child_process::spawn(spec);
    } catch (...) {
      ::close(log);
      ::close(null);
      throw;
    }
    ::close(log);
    ::close(null);
    const auto deadline = std::chrono::steady_clock::now() + start_deadline;
    while (!answers()) {
      if (auto ended = process_.try_wait())
        throw std::runtime_error("nats-server on port " + std::to_string(port_) + " " +
                                 ended->describe() + ":\n" + log_text());
      if (std::chrono::steady_clock::now() > deadline) {
        (void)process_.kill();
        throw std::runtime_error("nats-server on port " + std::to_string(port_) +
                                 " took no connection in 30 s:\n" + log_text());
      }
      ::poll(nullptr, 0, 20);  // between connection attempts, not a synchronisation
    }
  }

  /// Stops the server as an operator does (SIGTERM: it flushes the store), or kills it when it
  /// does not end within 10 s.
  void stop() {
    if (!process_.running()) return;
    ::kill(process_.pid(), SIGTERM);
    if (!process_.wait_for(std::chrono::seconds(10))) (void)process_.kill();
  }

  /// Kills the server at once (SIGKILL), as a crash would.
  void kill() { (void)process_.kill(); }
  /// Freezes the server (SIGSTOP): its port still takes connections, which it never answers,
  /// as a hung host does; thaw() goes on (SIGCONT).
  void freeze() { ::kill(process_.pid(), SIGSTOP); }
  void thaw() { ::kill(process_.pid(), SIGCONT); }

  /// What the server wrote so far.
  [[nodiscard]] std::string log_text() const {
    std::ifstream in(dir_.path / "server.log");
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  /// The configuration file the server runs with.
  [[nodiscard]] std::filesystem::path config_file() const {
    return config_.empty() ? dir_.path / "nats.conf" : config_;
  }

 private:
  static int free_port() { return free_ports(1).front(); }

  void start_on_free_port() {
    // The port is free when picked, but another process may take it before the server binds
    // it: try again with another one.
    for (int attempt = 0;; ++attempt) {
      port_ = free_port();
      try {
        start();
        return;
      } catch (const std::runtime_error&) {
        if (attempt == 4) throw;
      }
    }
  }

  // True when the server accepts a connection and greets it with INFO (it then takes clients;
  // JetStream is enabled before the client port opens).
  [[nodiscard]] bool answers() const {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<uint16_t>(port_));
    bool greeted = false;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) {
      pollfd readable{fd, POLLIN, 0};
      char greeting[5] = {};
      if (::poll(&readable, 1, 2000) == 1 && ::recv(fd, greeting, 4, MSG_WAITALL) == 4)
        greeted = std::string_view(greeting, 4) == "INFO";
    }
    ::close(fd);
    return greeted;
  }

  temp_dir dir_;
  std::string max_payload_;
  std::filesystem::path config_;  // a configuration file of the test's; empty: dir_/nats.conf
  std::vector<std::string> arguments_;
  int port_ = 0;
  detail::child_process process_;
};

#ifdef CUBRIDGE_TESTING_HAS_NATS

/// Who a fixture's readiness check connects as: nobody (an open server), or a user of the
/// configuration and, for TLS, the CA that signed the servers' certificates.
struct nats_client_identity {
  std::string user, password;
  std::filesystem::path ca_file;
};

/// Whether the JetStream of the servers at `urls` (a list) answers an account-info request
/// within `deadline` (tried every 100 ms): a standalone server's JetStream is up, a cluster
/// has a meta leader. Returns the last error otherwise.
inline std::string wait_for_jetstream(const std::vector<std::string>& urls,
                                      const nats_client_identity& who,
                                      std::chrono::milliseconds deadline) {
  std::vector<const char*> raw;
  for (const auto& url : urls) raw.push_back(url.c_str());
  const auto until = std::chrono::steady_clock::now() + deadline;
  std::string problem = "not tried";
  while (true) {
    natsOptions* options = nullptr;
    natsConnection* connection = nullptr;
    jsCtx* js = nullptr;
    jsAccountInfo* info = nullptr;
    natsStatus status = natsOptions_Create(&options);
    if (status == NATS_OK)
      status = natsOptions_SetServers(options, raw.data(), static_cast<int>(raw.size()));
    if (status == NATS_OK) status = natsOptions_SetTimeout(options, 2000);
    if (status == NATS_OK && !who.user.empty())
      status = natsOptions_SetUserInfo(options, who.user.c_str(), who.password.c_str());
    if (status == NATS_OK && !who.ca_file.empty()) {
      status = natsOptions_SetSecure(options, true);
      if (status == NATS_OK)
        status = natsOptions_LoadCATrustedCertificates(options, who.ca_file.c_str());
    }
    if (status == NATS_OK) status = natsConnection_Connect(&connection, options);
    if (status == NATS_OK) {
      jsOptions js_options;
      jsOptions_Init(&js_options);
      js_options.Wait = 2000;
      status = natsConnection_JetStream(&js, connection, &js_options);
    }
    jsErrCode js_code = static_cast<jsErrCode>(0);
    if (status == NATS_OK) status = js_GetAccountInfo(&info, js, nullptr, &js_code);
    if (status != NATS_OK) {
      const char* last = nats_GetLastError(nullptr);
      problem = std::string(natsStatus_GetText(status)) + (last ? std::string(": ") + last : "") +
                (js_code ? " (JetStream error " + std::to_string(js_code) + ")" : "");
    }
    jsAccountInfo_Destroy(info);
    jsCtx_Destroy(js);
    natsConnection_Destroy(connection);
    natsOptions_Destroy(options);
    if (status == NATS_OK) return {};
    if (std::chrono::steady_clock::now() > until) return problem;
    ::poll(nullptr, 0, 100);  // between attempts, not a synchronisation
  }
}

/// Three nats-servers of one JetStream cluster on loopback: each its own store, client port and
/// cluster port, with routes to the other two. Started by the constructor, which returns once
/// the cluster has a JetStream meta leader; each server can be killed, stopped and started
/// again on its ports and store.
class nats_cluster {
 public:
  static constexpr std::size_t size = 3;
  /// How long the constructor waits for a meta leader.
  static constexpr std::chrono::seconds ready_deadline{30};

  /// Three servers of the fixture's own configuration (JetStream, `max_payload: 16MB`, no
  /// authentication, cluster "cubridge_test").
  /// @throws std::runtime_error with the servers' logs when they do not start or elect a leader.
  nats_cluster() {
    start_all([this](std::size_t i) {
      std::string routes;
      for (std::size_t other = 0; other < size; ++other)
        if (other != i)
          routes +=
              "    \"nats-route://127.0.0.1:" + std::to_string(cluster_ports_[other]) + "\"\n";
      const auto store = dir_.path / ("store-" + std::to_string(i + 1));
      return nats_config::from_text(
          "server_name: \"cubridge-test-" + std::to_string(i + 1) +
          "\"\nmax_payload: 16MB\njetstream {\n  store_dir: \"" + store.string() +
          "\"\n  max_memory_store: 64MB\n  max_file_store: 1GB\n}\ncluster {\n  name: "
          "\"cubridge_test\"\n  listen: \"127.0.0.1:" +
          std::to_string(cluster_ports_[i]) + "\"\n  routes: [\n" + routes + "  ]\n}\n");
    });
  }

  /// Three servers of the given configurations (`cubridge fleet init --cluster 3` writes them),
  /// each file used where it is but for its ports: the fixture's client port, cluster port and
  /// routes replace the file's (`-p`, `--cluster`, `--routes`). `who` is who the readiness
  /// check connects as.
  /// @throws std::runtime_error with the servers' logs when they do not start or elect a leader.
  nats_cluster(std::array<std::filesystem::path, size> configs, nats_client_identity who)
      : who_(std::move(who)) {
    start_all([this, configs](std::size_t i) {
      auto config = nats_config::from_file(configs[i]);
      std::string routes;
      for (std::size_t other = 0; other < size; ++other)
        if (other != i)
          routes += (routes.empty() ? "" : ",") + std::string("nats-route://127.0.0.1:") +
                    std::to_string(cluster_ports_[other]);
      config.arguments = {"--cluster", "nats://127.0.0.1:" + std::to_string(cluster_ports_[i]),
                          "--routes", routes};
      return config;
    });
  }

  nats_cluster(const nats_cluster&) = delete;
  nats_cluster& operator=(const nats_cluster&) = delete;

  /// Every server's client URL, comma-separated ("nats://127.0.0.1:P1,nats://...").
  [[nodiscard]] std::string urls(std::string_view scheme = "nats") const {
    std::string text;
    for (std::size_t i = 0; i < size; ++i)
      text += (i ? "," : "") + std::string(scheme) +
              "://127.0.0.1:" + std::to_string(servers_[i]->port());
    return text;
  }
  /// Server i's client URL.
  [[nodiscard]] std::string url(std::size_t i) const { return servers_.at(i)->url(); }
  [[nodiscard]] nats_server& server(std::size_t i) { return *servers_.at(i); }
  [[nodiscard]] const nats_server& server(std::size_t i) const { return *servers_.at(i); }
  /// Server i's client port and cluster (route) port.
  [[nodiscard]] int port(std::size_t i) const { return servers_.at(i)->port(); }
  [[nodiscard]] int cluster_port(std::size_t i) const { return cluster_ports_.at(i); }

  /// Kills server i at once (SIGKILL), as a crash would.
  void kill(std::size_t i) { servers_.at(i)->kill(); }
  /// Freezes server i (SIGSTOP) and thaws it (SIGCONT): a hung server.
  void freeze(std::size_t i) { servers_.at(i)->freeze(); }
  void thaw(std::size_t i) { servers_.at(i)->thaw(); }
  /// Stops server i as an operator does (SIGTERM).
  void stop(std::size_t i) { servers_.at(i)->stop(); }
  /// Starts server i again on its ports and store; returns once it takes connections (not
  /// once it caught up: wait_for_meta_leader, or poll what the test needs).
  void start(std::size_t i) { servers_.at(i)->start(); }

  /// Returns once the running servers' JetStream answers (a meta leader is elected).
  /// @throws std::runtime_error with the last error and the logs when none is within `deadline`.
  void wait_for_meta_leader(std::chrono::milliseconds deadline = ready_deadline) const {
    std::vector<std::string> list;
    for (std::size_t i = 0; i < size; ++i)
      list.push_back((who_.ca_file.empty() ? "nats" : "tls") + std::string("://127.0.0.1:") +
                     std::to_string(servers_[i]->port()));
    if (const auto problem = wait_for_jetstream(list, who_, deadline); !problem.empty())
      throw std::runtime_error("the cluster elected no JetStream meta leader: " + problem + "\n" +
                               log_text());
  }

  /// What every server wrote so far, each headed by its number.
  [[nodiscard]] std::string log_text() const {
    std::string text;
    for (std::size_t i = 0; i < size; ++i)
      if (servers_[i]) text += "--- server " + std::to_string(i) + "\n" + servers_[i]->log_text();
    return text;
  }

 private:
  template <class Make>
  void start_all(Make make_config) {
    // The ports are free when picked, but another process may take one before its server
    // binds it: try again with others.
    for (int attempt = 0;; ++attempt) {
      const auto ports = free_ports(2 * size);
      for (std::size_t i = 0; i < size; ++i) cluster_ports_[i] = ports[size + i];
      try {
        for (std::size_t i = 0; i < size; ++i)
          servers_[i] = std::make_unique<nats_server>(make_config(i), ports[i]);
        break;
      } catch (const std::runtime_error&) {
        for (auto& server : servers_) server.reset();
        if (attempt == 2) throw;
      }
    }
    wait_for_meta_leader();
  }

  temp_dir dir_;  // the fixture's own stores; outlives the servers
  nats_client_identity who_;
  std::array<int, size> cluster_ports_{};
  std::array<std::unique_ptr<nats_server>, size> servers_;
};

#endif  // CUBRIDGE_TESTING_HAS_NATS

}  // namespace cubridge::testing
