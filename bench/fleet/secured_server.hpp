#pragma once
// The nats-server of bench_fleet, with authentication on: started as tests/nats_server.hpp starts
// one (Debian's nats-server, JetStream, `max_payload: 16MB`, its own store, a free loopback port,
// killed when the object goes), from a configuration with an `authorization { users = [...] }`
// block: one operator user with every permission, and one user per node that may publish only
// its own result and heartbeat subjects and the JetStream API subjects its agent uses, and
// subscribe only to its inboxes. Each user has a credentials file (fleet/connection.hpp). No TLS.
// tests/nats_server.hpp takes no authorization block, hence this one.
#include <sys/types.h>

#include <cubridge/core/detail/child_process.hpp>

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace cubridge::bench {

/// What a node user may publish besides its own result and heartbeat subjects.
enum class node_permissions {
  /// Exactly the JetStream API subjects a fleet_agent of one module uses (libnats 3.4.1): the
  /// bucket's stream info and its direct get of `desired.<m>`, the stream lookup, the create and
  /// delete of its ordered watch consumer and that consumer's flow control, and the last-message
  /// get of the module's bundle stream.
  exact,
  /// `$JS.API.>`, `$JS.FC.>`, `$JS.ACK.>` and `_INBOX.>`: every JetStream API call.
  broad,
};

/// "exact" or "broad".
[[nodiscard]] std::string_view to_string(node_permissions permissions) noexcept;

/// The subjects a node user `node` following `module` may publish to.
[[nodiscard]] std::vector<std::string> node_publish_allow(std::string_view node,
                                                          std::string_view module,
                                                          node_permissions permissions);

/// A nats-server with an authorization block.
class secured_server {
 public:
  /// A server whose files (configuration, store, log, credentials) live under `dir`; started by
  /// start(), once every node user is added.
  secured_server(std::filesystem::path dir, node_permissions permissions);
  secured_server(const secured_server&) = delete;
  secured_server& operator=(const secured_server&) = delete;
  ~secured_server();

  /// Adds the user of node `node` following `module`; returns its credentials file (mode
  /// 0600). Only before the first start(). @throws std::logic_error after it.
  std::filesystem::path add_node(const std::string& node, const std::string& module);
  /// The operator's credentials file.
  [[nodiscard]] const std::filesystem::path& operator_credentials() const noexcept;
  /// The operator's user name and password (for raw libnats connections).
  [[nodiscard]] const std::string& operator_user() const noexcept { return operator_user_; }
  [[nodiscard]] const std::string& operator_password() const noexcept { return operator_password_; }
  [[nodiscard]] std::size_t users() const noexcept { return users_.size(); }

  /// Writes the configuration (first time) and starts the server on its port; returns once it
  /// greets a connection. @throws std::runtime_error with the server's log when it does not.
  void start();
  /// SIGKILL, as a crash.
  void kill();
  [[nodiscard]] bool running() const noexcept { return process_.running(); }
  /// "nats://127.0.0.1:PORT".
  [[nodiscard]] std::string url() const;
  [[nodiscard]] pid_t pid() const noexcept { return process_.pid(); }
  /// The server's monitoring port (/varz, /jsz, /connz on 127.0.0.1).
  [[nodiscard]] int monitor_port() const noexcept { return monitor_port_; }
  /// The body of a monitoring page ("/varz"), empty when it does not answer within 2 s.
  [[nodiscard]] std::string monitor_page(const std::string& path) const;
  /// The server's CPU time so far (utime + stime from /proc/<pid>/stat), seconds; 0 when none.
  [[nodiscard]] double cpu_seconds() const;
  [[nodiscard]] std::string log_text() const;
  /// Lines of the log that hold `what` ("Violation", "Slow Consumer").
  [[nodiscard]] std::size_t log_lines_with(std::string_view what) const;
  [[nodiscard]] const std::filesystem::path& config_file() const noexcept { return config_; }

 private:
  struct user {
    std::string name, password, module;
  };
  void write_config() const;
  [[nodiscard]] bool answers() const;

  std::filesystem::path dir_, config_, log_, operator_credentials_;
  node_permissions permissions_;
  std::string operator_user_ = "operator", operator_password_;
  std::vector<user> users_;
  int port_ = 0, monitor_port_ = 0;
  bool configured_ = false;
  detail::child_process process_;
};

/// CPU time (utime + stime) of process `pid` from /proc/<pid>/stat, seconds; 0 when unreadable.
[[nodiscard]] double process_cpu_seconds(pid_t pid);
/// CPU time of this process's children now running, but `except`, seconds.
[[nodiscard]] double children_cpu_seconds(pid_t except);
/// Resident memory of process `pid` (VmRSS of /proc/<pid>/status), bytes; 0 when unreadable.
[[nodiscard]] std::size_t process_rss_bytes(pid_t pid);
/// CPU time of this process (getrusage), seconds.
[[nodiscard]] double self_cpu_seconds();

}  // namespace cubridge::bench
