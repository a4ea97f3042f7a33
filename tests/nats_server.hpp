#pragma once
// A real nats-server for the fleet tests (docs/fleet.md, Testing): Debian's nats-server as a
// child process with JetStream on, `max_payload: 16MB`, its own store directory and a free
// loopback port. It can be stopped and started again on the same port and store (the
// server-down tests), and is killed when the object goes.

#include "temp_dir.hpp"

#include <cubridge/core/detail/child_process.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace cubridge::testing {

/// The server program: $CUBRIDGE_NATS_SERVER, else Debian's /usr/sbin/nats-server, else
/// /usr/bin/nats-server (an upstream install).
inline std::string nats_server_program() {
  if (const char* chosen = std::getenv("CUBRIDGE_NATS_SERVER"); chosen && *chosen) return chosen;
  if (::access("/usr/sbin/nats-server", X_OK) == 0) return "/usr/sbin/nats-server";
  return "/usr/bin/nats-server";
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
  nats_server(const nats_server&) = delete;
  nats_server& operator=(const nats_server&) = delete;
  ~nats_server() { (void)process_.kill(); }

  /// "nats://127.0.0.1:PORT".
  [[nodiscard]] std::string url() const { return "nats://127.0.0.1:" + std::to_string(port_); }
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

  /// What the server wrote so far.
  [[nodiscard]] std::string log_text() const {
    std::ifstream in(dir_.path / "server.log");
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

 private:
  [[nodiscard]] std::filesystem::path config_file() const { return dir_.path / "nats.conf"; }

  static int free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      const std::string reason = std::strerror(errno);
      if (fd >= 0) ::close(fd);
      throw std::runtime_error("no free loopback port: " + reason);
    }
    ::close(fd);
    return ntohs(address.sin_port);
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
  int port_ = 0;
  detail::child_process process_;
};

}  // namespace cubridge::testing
