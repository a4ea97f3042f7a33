#pragma once
// online_service as a fleet node (docs/fleet.md): a cubridge::fleet_agent beside the update
// endpoint, over the same update_gate (one update authority: one lock per module, one replay
// record, whichever door a bundle came through). Built only where the cubridge_fleet target
// exists (libnats); elsewhere --fleet-server is refused at parse time.
#include <cubridge/update/update_gate.hpp>

#include <nlohmann/json.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>

namespace online_service {

/// What the service says of its health at each heartbeat (the fleet's health probe).
struct service_health {
  bool healthy = true;
  std::map<std::string, double, std::less<>> values;
  std::string detail;
};

struct fleet_node_options {
  std::string server;       ///< the NATS server(s), nats://HOST:PORT or tls://, comma-separated
  std::string node;         ///< this node's id (1 to 64 of [A-Za-z0-9_-])
  std::string node_key;     ///< the node's secret key file (signs its results and heartbeats)
  std::string credentials;  ///< the node's credentials file (cubridge fleet init), if any
  std::string ca;           ///< the fleet's CA certificate, if TLS
  std::chrono::milliseconds heartbeat_interval{5000};
  /// Asked at each heartbeat (none: healthy): the service's own output check.
  std::function<service_health()> health;
};

/// Whether this build can be a fleet node (it was linked with cubridge_fleet).
[[nodiscard]] bool fleet_supported() noexcept;
/// The server list as it may be printed: credentials in a URL cut out.
[[nodiscard]] std::string shown_servers(const fleet_node_options& options);
/// What is wrong with `options` (the node id, a missing server), or an empty string.
[[nodiscard]] std::string check_fleet_node_options(const fleet_node_options& options);

/// The agent, stopped when destroyed.
class fleet_node {
 public:
  fleet_node(std::shared_ptr<cubridge::update_gate> gate, fleet_node_options options);
  fleet_node(const fleet_node&) = delete;
  fleet_node& operator=(const fleet_node&) = delete;
  ~fleet_node();

  /// Starts the agent: it returns at once, also while no server answers (the agent connects by
  /// itself). @throws cubridge::error when the agent refuses its options or the server URL;
  /// std::runtime_error when this build has no fleet support.
  void start();
  /// Stops the agent; the service keeps serving what it has. Never throws.
  void stop() noexcept;
  /// {"node", "server", "connected", "converged", "applied", "refused", "retries",
  /// "last_result", "problem"}.
  [[nodiscard]] nlohmann::json status() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace online_service
