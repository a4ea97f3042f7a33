#pragma once
// The node side of fleet rollout (docs/fleet.md): a service embeds a fleet_agent beside or
// instead of the HTTP endpoint. The agent holds a durable JetStream consumer per module on the
// module's bundle stream and applies what arrives, one message at a time and in order, through
// the same policy as the endpoint (update_gate.hpp: every bundle verified against the trusted
// keys, the replay floor, the sink). Each message gets a result record (fleet_records.hpp) on
// cubridge.result.<m>.<node>, and is acknowledged only once that record is stored; refused
// messages too. A heartbeat with the node's versions goes out every heartbeat_interval.
//
// With the server down the service keeps serving what it has; the client reconnects with
// backoff, the durable consumer resumes where it was acknowledged, and the node converges.

#include <cubridge/fleet/records.hpp>
#include <cubridge/update/module_sink.hpp>
#include <cubridge/update/update_gate.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cubridge {

/// What a fleet_agent connects to and accepts.
struct fleet_agent_options {
  /// The NATS server(s): "nats://127.0.0.1:4222", several comma-separated.
  std::string servers = "nats://127.0.0.1:4222";
  /// This node's id: 1 to 64 of [A-Za-z0-9_-] (fleet::check_fleet_name), unique in the fleet.
  std::string node;
  /// The modules to follow; empty: every module the sink reports at start() whose name the
  /// fleet takes.
  std::vector<std::string> modules;
  /// The policy (trusted keys, state file, floors, expiry, clock), as the endpoint's;
  /// max_bundle_bytes is 16 MiB here, the fleet's largest message.
  update_gate_options gate = [] {
    update_gate_options o;
    o.max_bundle_bytes = std::size_t{16} << 20;
    return o;
  }();
  /// The label a heartbeat carries (the canary cohort is the publisher's choice).
  std::string cohort = "all";
  /// How often a heartbeat goes out.
  std::chrono::milliseconds heartbeat_interval{5000};
  /// How long the server waits for the ack of a delivered message before delivering it again
  /// (a node that died while applying gets it again).
  std::chrono::milliseconds ack_wait{30000};
};

/// Counters, for reports, metrics and tests.
struct fleet_agent_stats {
  std::uint64_t applied = 0;      ///< bundles applied
  std::uint64_t rolled_back = 0;  ///< rollbacks done
  std::uint64_t duplicates = 0;   ///< deliveries of the version serving
  std::uint64_t refused = 0;      ///< refused or failed messages (see rejects in metrics)
  std::uint64_t ignored = 0;      ///< messages for other nodes (acked, no record)
  std::uint64_t acked = 0;        ///< messages acknowledged
  std::uint64_t records_published = 0;
  std::uint64_t publish_failures = 0;  ///< records (or acks) that could not go out, retried
  std::uint64_t heartbeats = 0;        ///< heartbeats published
  std::uint64_t connects = 0;          ///< consumer set-ups (the first and after each loss)
};

/// The agent. Not copyable or movable (its threads point into it).
class fleet_agent {
 public:
  /// Prepares an agent over `sink`, which must outlive it. Connects to nothing yet.
  fleet_agent(module_sink& sink, fleet_agent_options options);
  fleet_agent(const fleet_agent&) = delete;
  fleet_agent& operator=(const fleet_agent&) = delete;
  /// Stops it (see stop()).
  ~fleet_agent();

  /// Loads the replay state and starts the agent's threads (one applying messages, one sending
  /// heartbeats). Returns at once also while no server answers: the agent connects, makes its
  /// streams and consumers, and resumes by itself.
  /// @throws error (errc::precondition) when already running, for a bad node id or module
  ///         name, or no module to follow; update_state_error when the state file is unusable;
  ///         error (domain "fleet") for a server URL libnats does not take.
  void start();
  /// Stops the threads (a message being applied is finished first) and closes the connection.
  /// The service keeps serving what it has. Never throws.
  void stop() noexcept;

  [[nodiscard]] bool running() const noexcept;
  /// Whether the agent is connected and its consumers are set up.
  [[nodiscard]] bool connected() const noexcept;
  [[nodiscard]] fleet_agent_stats stats() const noexcept;
  /// The last result record published (or about to be), if any.
  [[nodiscard]] std::optional<fleet::result_record> last_result() const;
  /// Prometheus text format: versions per module, promotions, rollbacks, rejects by reason,
  /// connection state.
  [[nodiscard]] std::string metrics_text() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace cubridge
