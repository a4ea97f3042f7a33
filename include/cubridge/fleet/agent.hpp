#pragma once
// The node side of the fleet (docs/fleet.md, "What a node does"): a service embeds a fleet_agent
// beside or instead of the HTTP endpoint, both over one update_gate (one update authority per
// node: one lock per module, one replay record, whichever door a bundle came through). The agent
// reconciles: it watches the operator-signed desired state of each module it follows, and
// whenever what the node serves differs from what the record names for it, it fetches that
// bundle by digest, verifies it and applies it through the gate. A transient failure (a state
// write, a fetch, the server gone) is retried with capped exponential backoff until serving
// matches desired; a permanent refusal (signature, compatibility, smoke test) is recorded once
// and not retried until the desired state changes. Each revision acted on gets one result
// record signed with the node's key; a signed heartbeat goes out every heartbeat_interval.
// Once the process is poisoned (core/process_health.hpp) a heartbeat saying so goes out at once,
// then a `failed` result (sticky_error) for each module's serving version (docs/fleet.md, "A
// poisoned node").
//
// With the server down the service keeps serving what it has; the client reconnects with
// backoff, and the node converges from the desired state, not from messages it may have missed.

#include <cubridge/fleet/connection.hpp>
#include <cubridge/fleet/records.hpp>
#include <cubridge/update/update_gate.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace cubridge {

/// What a fleet_agent connects to and who it is.
/// What a service says of one module's health (fleet_agent_options::health_probe).
struct health_report {
  bool healthy = true;
  /// Named figures ("wrong_answers", "p99_us"; names as module names), compared by the
  /// controller with the nodes still on the old version (`fleet publish --max-metric`).
  std::map<std::string, double, std::less<>> values{};
  std::string detail{};
};

/// Asked for each followed module at each heartbeat, on the heartbeat thread, with the version
/// serving; what it throws reads as unhealthy with the exception's text. It should answer
/// quickly (it delays the heartbeat) and cover the time since the last call or a recent window.
using health_probe_fn =
    std::function<health_report(std::string_view module, std::uint64_t version)>;

struct fleet_agent_options {
  /// The bus: servers (several, comma-separated, tried in order), credentials, CA.
  fleet::bus_options bus{};
  /// This node's id: 1 to 64 of [A-Za-z0-9_-] (fleet::check_fleet_name), unique in the fleet,
  /// enrolled in the registry with the public half of `node_key_file`.
  std::string node{};
  /// The node's Ed25519 secret key file (cubridge key format): signs its results and
  /// heartbeats. Required.
  std::filesystem::path node_key_file{};
  /// Sign with a key file that group or others may read (refused otherwise).
  bool allow_readable_key = false;
  /// The modules to follow; empty: every module the gate's sink reports at start() whose name
  /// the fleet takes.
  std::vector<std::string> modules{};
  /// The label a heartbeat carries (the registry's labels choose cohorts; this is informative).
  std::string cohort = "all";
  /// How often a heartbeat goes out.
  std::chrono::milliseconds heartbeat_interval{5000};
  /// How often the desired state is read again besides the watch (a watch lost with the
  /// connection is made again; this bounds how late a node sees a change even then).
  std::chrono::milliseconds resync_interval{2000};
  /// Backoff of transient failures: the first retry after `retry_first`, doubling to
  /// `retry_longest`, each plus up to half again at random.
  std::chrono::milliseconds retry_first{100};
  std::chrono::milliseconds retry_longest{2000};
  /// The first connection is made after a random delay up to this, so that nodes booting
  /// together (a rack powered on) do not all knock at once. A connection the client library
  /// closes for good (repeated authentication timeouts on a server swamped by a connect storm)
  /// is replaced by a new one, with jittered exponential backoff (250 ms doubling to 2 s, plus up
  /// to half again), forever; the last problem is logged, in metrics_text() and in the heartbeat.
  std::chrono::milliseconds connect_jitter{1000};
  /// The service's own health check (its error counter, an output check on sampled requests, a
  /// latency figure); none: every module reads healthy, with the launch counters only.
  health_probe_fn health_probe{};
};

/// Counters, for reports, metrics and tests.
struct fleet_agent_stats {
  std::uint64_t applied = 0;     ///< bundles applied
  std::uint64_t duplicates = 0;  ///< revisions found served already
  std::uint64_t refused = 0;     ///< permanent refusals (recorded, not retried)
  std::uint64_t retries = 0;     ///< transient failures retried (fetch, state write, server)
  std::uint64_t records_published = 0;
  std::uint64_t publish_failures = 0;  ///< records that could not go out yet (retried)
  std::uint64_t heartbeats = 0;        ///< heartbeats published
  std::uint64_t connects = 0;          ///< set-ups: the first and one after each lost connection
  std::uint64_t desired_refused = 0;   ///< desired records that did not verify, parse, or went back
  std::uint64_t links_replaced = 0;    ///< connections the client library closed, made anew
};

/// The agent. Not copyable or movable (its threads point into it).
class fleet_agent {
 public:
  /// Prepares an agent over `gate` (shared with the node's HTTP endpoint, if any). Connects to
  /// nothing yet.
  fleet_agent(std::shared_ptr<update_gate> gate, fleet_agent_options options);
  fleet_agent(const fleet_agent&) = delete;
  fleet_agent& operator=(const fleet_agent&) = delete;
  /// Stops it (see stop()).
  ~fleet_agent();

  /// Starts the gate (idempotent: the replay state), reads the node key, starts the agent's
  /// threads (one reconciling, one sending heartbeats) and listens for the process being
  /// poisoned (add_poison_listener, until stop()). Returns at once also while no server
  /// answers: the agent connects, binds the bucket and watches, and resumes by itself.
  /// @throws error (errc::precondition) when already running, for a bad node id or module name,
  ///         no module to follow, no node key, or a server list parse_server_list refuses;
  ///         error (errc::io) for an unreadable key or credentials file; update_state_error when
  ///         the state file is unusable.
  void start();
  /// Stops the threads (an apply in progress is finished first) and closes the connection. The
  /// service keeps serving what it has. Never throws.
  void stop() noexcept;

  [[nodiscard]] bool running() const noexcept;
  /// Whether the agent is connected and watching.
  [[nodiscard]] bool connected() const noexcept;
  /// The server in use (redacted), empty while not connected.
  [[nodiscard]] std::string connected_server() const;
  /// Why the agent is not connected yet (the last set-up error, in words); empty when it is.
  [[nodiscard]] std::string last_problem() const;
  [[nodiscard]] fleet_agent_stats stats() const noexcept;
  /// Whether every followed module serves what its desired state names for this node.
  [[nodiscard]] bool converged() const;
  /// The last result record published (or about to be), if any.
  [[nodiscard]] std::optional<fleet::result_record> last_result() const;
  /// Prometheus text format: versions per module, promotions, refusals, retries, connection.
  [[nodiscard]] std::string metrics_text() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace cubridge
