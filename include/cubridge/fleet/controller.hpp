#pragma once
// The control side of a fleet (docs/fleet.md, "The control side"): publishes signed bundles to
// every node or to some, keeps the desired version per cohort in the `cubridge_desired` bucket,
// reads the nodes' heartbeats and results, runs the canary policy and publishes signed rollback
// requests. What `cubridge fleet publish | status | rollback | watch` is made of. It connects to
// the NATS server once and never retries: a server that cannot be reached is an error at once.

#include <cubridge/update/bundle.hpp>
#include <cubridge/fleet/error.hpp>
#include <cubridge/fleet/records.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cubridge::fleet {

/// Where the server is and how long to wait for it.
struct controller_options {
  /// "nats://127.0.0.1:4222" (several, comma-separated).
  std::string server_url;
  /// The client's name, as the server's monitoring shows it.
  std::string client_name = "cubridge-fleet";
  /// How long opening the connection may take.
  std::chrono::milliseconds connect_timeout{2000};
  /// How long one JetStream request (publish ack, stream info, bucket) may take.
  std::chrono::milliseconds request_timeout{5000};
};

/// A node as its last heartbeat shows it.
struct node_state {
  heartbeat beat;
  /// Now minus the heartbeat's time (0 for a heartbeat from the future).
  std::chrono::seconds age{0};
  /// The heartbeat is younger than 3 of the node's intervals (5 s when it gives none).
  bool live = false;
};

/// A module's rollout state in the bucket.
struct module_state {
  std::string module;
  std::optional<std::uint64_t> desired_all;
  std::optional<std::uint64_t> desired_canary;
  /// Why the last rollout halted (empty when it did not); the version it halted.
  std::string halted_reason;
  std::uint64_t halted_version = 0;
};

/// The canary policy of `publish --canary N`.
struct canary_policy {
  /// N: the first N live nodes in node-id order.
  std::size_t canaries = 1;
  /// K: `applied` results needed from the canaries; 0 means N.
  std::size_t successes = 0;
  /// How long to wait for them.
  std::chrono::milliseconds window{std::chrono::seconds(60)};
};

/// How a rollout ended.
struct rollout_report {
  /// The bundle went to every node (`all`) and the desired version of `all` is set.
  bool completed = false;
  std::uint64_t version = 0;
  std::vector<std::string> canaries;
  /// The canaries' results seen for this version, in arrival order.
  std::vector<result_record> results;
  /// Why the rollout halted; empty when it completed.
  std::string halt_reason;
  /// On a halt, the canaries that reported no failure (they may have applied the version, or
  /// may yet): the signed rollback request was sent for them.
  std::vector<std::string> rolled_back;
};

/// The control side's connection. Not thread-safe: one thread uses a controller.
class controller {
 public:
  /// Connects and makes the result and heartbeat streams and the desired bucket when missing.
  /// @throws cubridge::error: fleet_errc::unreachable when no server answers within
  ///         connect_timeout; fleet_errc::config_mismatch for a stream configured otherwise;
  ///         fleet_errc::nats_failed for a server that refuses (no JetStream).
  explicit controller(controller_options options);
  controller(const controller&) = delete;
  controller& operator=(const controller&) = delete;
  ~controller();

  /// The server's largest message, in bytes.
  [[nodiscard]] std::size_t max_payload() const;

  /// Publishes a signed `bundle` of `module` to every node (`nodes` empty) or to each of `nodes`
  /// (their `node.<node>` subjects). Makes the module's stream when missing. Nothing is
  /// verified here: nodes verify.
  /// @throws cubridge::error: fleet_errc::oversized, before anything is sent, for a bundle over
  ///         max_payload() (both sizes in the message); errc::precondition for a module or node
  ///         name check_fleet_name refuses; otherwise as the constructor.
  void publish(std::span<const std::byte> bundle, std::string_view module,
               std::span<const std::string> nodes = {});

  /// Publishes a signed rollback request (rollback_request.hpp) on cubridge.rollback.<m>.
  /// @throws as publish.
  void rollback(std::string_view module, std::string_view signed_request);

  /// The desired version of `module` for `cohort` ("all", "canary"); nullopt when none is set.
  [[nodiscard]] std::optional<std::uint64_t> desired(std::string_view module,
                                                     std::string_view cohort) const;
  /// Sets it (0: removes it).
  void set_desired(std::string_view module, std::string_view cohort, std::uint64_t version);

  /// Forgets why the module's last rollout halted (a later rollout of every node succeeded).
  void clear_halt(std::string_view module);

  /// Every module the bucket knows, by name.
  [[nodiscard]] std::vector<module_state> modules() const;

  /// The last heartbeat of every node, by node id, with its age at `now`. Heartbeats that do
  /// not parse are left out.
  [[nodiscard]] std::vector<node_state> nodes(
      std::chrono::system_clock::time_point now = std::chrono::system_clock::now()) const;

  /// The last result of every node for `module`, by node id.
  [[nodiscard]] std::vector<result_record> last_results(std::string_view module) const;

  /// The canary policy: publishes to the canaries, waits for their results, then publishes to
  /// every node, or halts. On a halt the reason goes under `<m>.halted` in the bucket, the
  /// desired version of `canary` goes back to that of `all`, the canaries' bundle subjects are
  /// purged (a canary that restarts does not get the bundle again), and one rollback request
  /// from `version`, signed with `rollback_key`, goes out for the canaries that did not fail.
  /// @throws cubridge::error (errc::precondition) when fewer than policy.canaries nodes are
  ///         live, or policy.successes is over policy.canaries; as publish otherwise.
  [[nodiscard]] rollout_report rollout(std::span<const std::byte> bundle, std::string_view module,
                                       std::uint64_t version, const canary_policy& policy,
                                       const secret_key& rollback_key);

  /// Waits until each of `nodes` has a result for `version` of `module` (applied or not), at
  /// most `timeout`; returns those seen, in arrival order. Results already in the stream count.
  [[nodiscard]] std::vector<result_record> wait_for_results(std::string_view module,
                                                            std::uint64_t version,
                                                            std::span<const std::string> nodes,
                                                            std::chrono::milliseconds timeout);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace cubridge::fleet
