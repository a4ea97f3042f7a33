#pragma once
// The control side of a fleet (docs/fleet.md, "The control side"): stores signed bundles by
// module, version and digest, writes each module's operator-signed desired state by
// compare-and-set, enrols nodes, and reads what the nodes report, believing only records signed
// by an enrolled node's key. What `cubridge fleet publish | status | rollback | watch | enroll`
// is made of. It connects once and never reconnects: a server that cannot be reached is an error
// at once.

#include <cubridge/bundle/bundle.hpp>
#include <cubridge/fleet/connection.hpp>
#include <cubridge/fleet/desired_state.hpp>
#include <cubridge/fleet/error.hpp>
#include <cubridge/fleet/heartbeat_ledger.hpp>
#include <cubridge/fleet/records.hpp>
#include <cubridge/fleet/registry.hpp>
#include <cubridge/fleet/rollout_words.hpp>
#include <cubridge/fleet/wave_analysis.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cubridge::fleet {

/// Where the server is, who the operator is, and how long to wait.
struct controller_options {
  bus_options bus{};
  /// The client's name, as the server's monitoring shows it.
  std::string client_name = "cubridge-fleet";
  /// How long opening the connection may take.
  std::chrono::milliseconds connect_timeout{2000};
  /// How long one JetStream request (stream info, a get, a bucket write) may take.
  std::chrono::milliseconds request_timeout{5000};
  /// How long storing a bundle may take; 0: request_timeout plus 1 s per MiB of the bundle.
  std::chrono::milliseconds publish_timeout{0};
  /// Keys whose desired-state records are believed (the key a command signs with is added).
  trusted_keys operator_keys{};
  /// The longest a whole read of the fleet (nodes(), status) may take, whatever the bus holds;
  /// what was not read by then is reported as not read.
  std::chrono::milliseconds read_deadline{10000};
};

/// A node as the registry and its heartbeats show it (heartbeat_ledger.hpp: every heartbeat
/// of the stream, verified with the node's key, in the server's order; one that goes back is
/// refused).
struct node_state {
  std::string node{};
  std::map<std::string, std::string, std::less<>> labels{};
  /// The newest heartbeat that verified with the node's key and did not go back; nullopt when
  /// none did.
  std::optional<heartbeat> beat{};
  /// When the server received it (the stream's timestamp, the server's clock).
  std::chrono::system_clock::time_point received{};
  /// Now minus `received` (0 when the server's clock is ahead of this one).
  std::chrono::seconds age{0};
  /// Heard from within 3 of the node's intervals and a second, by the server's receive time:
  /// the node's own clock plays no part.
  bool live = false;
  /// The node's clock minus the server's, whole seconds (its heartbeat's time against the
  /// receive time); beyond clock_skew_warning the status warns.
  std::chrono::seconds clock_skew{0};
  /// Restarts this controller has seen (a new run's heartbeat), and heartbeats refused as going
  /// back (an older one written again).
  std::uint64_t restarts = 0;
  std::uint64_t replayed = 0;
  /// Why no heartbeat counts (none, refused and why, not read before the deadline).
  std::string problem{};
};

/// A module's desired state as read, with the bucket revision it was read at.
struct desired_entry {
  desired_state state{};
  std::uint64_t bucket_revision = 0;
};

/// What reading the fleet found besides nodes and modules.
struct read_report {
  /// Streams or buckets configured otherwise than docs/fleet.md's (used as they are).
  std::vector<std::string> warnings{};
  /// Heartbeats (since this controller first read them) and desired-state records refused (not
  /// signed by the enrolled or operator key, going back,
  /// malformed, naming another node), with a count per reason. Subjects of nodes not enrolled
  /// are never read, so nothing of theirs is counted here.
  std::map<std::string, std::uint64_t, std::less<>> refused{};
  /// Whether everything was read before read_deadline.
  bool complete = true;
};

/// The canary policy of `publish --canary N`.
struct canary_policy {
  /// N: the first N live nodes, in node-id order, that follow the module and can run it.
  std::size_t canaries = 1;
  /// K: `applied` results needed from the canaries; 0 means N.
  std::size_t successes = 0;
  /// Canaries only from nodes whose registry label "cohort" is this; empty: any.
  std::string cohort{};
  /// How long to wait for them.
  std::chrono::milliseconds window{std::chrono::seconds(60)};
};

/// A wave rollout (`publish --waves 1,10%,50%,100% --bake 30s`): wave after wave, each chosen
/// as canaries are (live, following the module, able to run it, by cohort when given), each done
/// when its nodes applied the candidate and stayed healthy for the bake time (wave_analysis.hpp),
/// then the next; after the last (every node) the candidate is stable. The plan is desired state
/// (desired_state::waves): a controller started again carries on from the same wave.
struct wave_policy {
  /// "N" nodes or "P%" of the nodes that qualify, each counted from the start (cumulative, as
  /// Argo Rollouts' setWeight); every wave adds at least one node while any is left. The last
  /// wave is "100%", added when missing.
  std::vector<std::string> waves{};
  /// How long a wave's nodes must stay healthy after the last of them applied the candidate.
  std::chrono::milliseconds bake{std::chrono::seconds(30)};
  /// How long one wave may take, from its start; past it the rollout halts (Kubernetes'
  /// progressDeadlineSeconds, per wave).
  std::chrono::milliseconds deadline{std::chrono::minutes(10)};
  /// Waves only from nodes labelled cohort=C; empty: any.
  std::string cohort{};
  /// The limits the waves are held to, against the nodes still on the old version.
  health_limits limits{};
  /// How often the nodes' heartbeats are read during a bake.
  std::chrono::milliseconds poll{std::chrono::milliseconds(500)};
  /// The most heartbeat intervals a node of the wave may stay silent during the bake before it
  /// counts as lost (`canary_lost`), 1 to 100.
  std::uint32_t max_missed_heartbeats = 3;
};

/// One step of a rollout as it happened, for its timeline.
struct rollout_event {
  std::chrono::system_clock::time_point time{};
  std::size_t wave = 0;
  rollout_step what = rollout_step::started;
  std::string detail{};
};

/// The waves' sizes as given ("1", "10%"), checked: 1 to max_waves, each a whole number of nodes
/// above 0 or a percentage from 1 to 100, the percentages growing; "100%" added last when
/// missing. @throws errc::precondition naming the wave that is wrong.
[[nodiscard]] std::vector<std::string> checked_waves(std::vector<std::string> waves);

/// A wave's health figures from the nodes' last heartbeats: the canaries (the record's canaries,
/// on its candidate) and the baseline (the other live nodes that follow the module, on its
/// stable version). A canary's heartbeat counts only when the server received it after `since`,
/// so that one from before the wave applied is not taken for the wave's; a baseline node's last
/// heartbeat counts whenever it was made (it runs the stable version throughout), so that the
/// baseline is there from the first look. The wave itself passes only on evidence (every node of
/// it heard from throughout the bake, in one run, on the candidate: rollout_waves).
struct wave_samples {
  std::vector<health_sample> canaries{};
  std::vector<health_sample> baseline{};
};
[[nodiscard]] wave_samples sample_wave(const desired_state& state,
                                       const std::vector<node_state>& nodes,
                                       std::chrono::system_clock::time_point since);

/// How many of `qualifying` nodes the waves take, cumulatively (the last: all of them).
[[nodiscard]] std::vector<std::size_t> wave_counts(const std::vector<std::string>& waves,
                                                   std::size_t qualifying);

/// How a publish or rollout ended.
struct rollout_report {
  /// Every node's desired bundle is the new one (phase complete).
  bool completed = false;
  std::uint64_t version = 0;
  /// The desired state written last (its revision: what results answer).
  desired_state desired{};
  std::vector<std::string> canaries{};
  /// The canaries' results for this revision and digest, in arrival order.
  std::vector<result_record> results{};
  /// Why the rollout halted; empty when it completed.
  std::string halt_reason{};
  /// True when the desired state named this bundle already (a retried publish): nothing new
  /// was written.
  bool already_desired = false;
  /// For a wave rollout: the signal that halted it (none while it did not; `halt_metric` names
  /// the metric of halt_signal::metric), the node it came from, the analysis's last figures, and
  /// the rollout's steps. A change of the desired state by another writer ends a run with
  /// fleet_errc::conflict instead.
  fleet::halt_signal halt_signal = fleet::halt_signal::none;
  std::string halt_metric{};
  std::string halt_node{};
  wave_verdict last_verdict{};
  std::vector<rollout_event> timeline{};
};

/// The control side's connection. Not thread-safe: one thread uses a controller.
class controller {
 public:
  /// Connects, and makes the result and heartbeat streams and the control bucket when missing
  /// (with bus.replicas replicas); a stream configured otherwise is used as it is and named in
  /// warnings().
  /// @throws cubridge::error: errc::precondition for a server list that does not parse;
  ///         fleet_errc::unreachable when no server answers within connect_timeout;
  ///         fleet_errc::refused when the server refuses the identity; fleet_errc::nats_failed
  ///         for a server that refuses otherwise (no JetStream, no permission).
  explicit controller(controller_options options);
  controller(const controller&) = delete;
  controller& operator=(const controller&) = delete;
  ~controller();

  /// The server's largest message, in bytes.
  [[nodiscard]] std::size_t max_payload() const;
  /// The server in use, redacted.
  [[nodiscard]] std::string connected_server() const;
  /// Whether this connection was made without credentials and the server took it: an open bus,
  /// which is a laptop demo only (status says so).
  [[nodiscard]] bool open_bus() const noexcept;
  /// Streams or buckets found configured otherwise.
  [[nodiscard]] const std::vector<std::string>& warnings() const noexcept;

  // --- enrolment ---

  /// The registry, verified with the operator keys; an empty one (revision 0) when none is
  /// written. @throws fleet_errc::invalid_state when the bucket holds one that does not verify.
  [[nodiscard]] node_registry registry() const;
  /// Enrols `node` with `key` and `labels` (replacing an entry of the same id), by
  /// compare-and-set, signed with `operator_key`. @throws fleet_errc::conflict when another
  /// writer changed it three times in a row; errc::precondition for a bad id or label.
  void enroll(std::string_view node, const public_key& key,
              const std::map<std::string, std::string, std::less<>>& labels,
              const secret_key& operator_key);

  // --- bundles and desired state ---

  /// The module's desired state; nullopt when none was written.
  /// @throws fleet_errc::invalid_state when the key holds a record that does not verify with
  ///         the operator keys or parse (it names why).
  [[nodiscard]] std::optional<desired_entry> desired(std::string_view module) const;
  /// Every record of the module's desired state the bucket still holds that verifies, oldest
  /// first (the bucket keeps the last 64): the module's timeline.
  [[nodiscard]] std::vector<desired_state> desired_history(std::string_view module) const;

  /// Publishes a signed bundle to every node: verifies it (with the operator keys and the
  /// signing key), stores it under its module, version and digest (idempotent, JetStream
  /// message ids: a retry stores nothing twice) and makes it the stable desired version by
  /// compare-and-set. A retry of a publish that was stored and written is `already_desired`.
  /// @throws cubridge::error: bundle_error when the bundle does not verify;
  ///         fleet_errc::oversized before anything is sent for a bundle over max_payload();
  ///         fleet_errc::older_version for a version at or below the desired one (a lower one
  ///         is `rollback`'s); fleet_errc::conflict when another writer won three times.
  rollout_report publish(std::span<const std::byte> bundle, const secret_key& operator_key);

  /// The canary policy: stores the bundle, makes it the candidate of the chosen canaries
  /// (every other node keeps the stable one), waits for their results for that revision and
  /// digest, then makes it stable for every node; or halts: the candidate is dropped (the
  /// canaries go back to the stable version by themselves) and the reason is recorded. A
  /// rollout whose candidate is this bundle already is resumed, not started again.
  /// @throws as publish; errc::precondition when fewer than policy.canaries nodes qualify.
  rollout_report rollout(std::span<const std::byte> bundle, const canary_policy& policy,
                         const secret_key& operator_key);

  /// The wave policy (wave_policy): stores the bundle and runs its waves; or halts, dropping
  /// the candidate (the nodes of the waves go back to the stable version by themselves, by the
  /// signed desired state) and recording why (the node, the signal, the values). A wave rollout
  /// of this bundle that is under way (its controller gone) is carried on from its wave.
  /// @throws as rollout; errc::precondition for waves that do not parse or no node that
  ///         qualifies; fleet_errc::conflict when another writer changed the state meanwhile.
  rollout_report rollout_waves(std::span<const std::byte> bundle, const wave_policy& policy,
                               const secret_key& operator_key);

  /// Carries on the wave rollout of `module`: a halted one from the wave that failed (its clocks
  /// started again), one under way from its wave. @throws fleet_errc::invalid_state when the
  /// module has no wave rollout to resume.
  rollout_report resume(std::string_view module, const secret_key& operator_key);

  /// Ends the wave rollout of `module`, under way or halted: the candidate is dropped, every
  /// node runs the stable version, the plan is gone (phase halted, reason "aborted by the
  /// operator"). A controller running the waves meets a conflict and stops. Returns the record
  /// written. @throws fleet_errc::invalid_state when there is none.
  desired_state abort(std::string_view module, const secret_key& operator_key);

  /// Makes an earlier stable version desired again: `to_version`, or when 0 the one before the
  /// current stable one (the desired state keeps the last max_desired_history). Returns the
  /// record written. @throws fleet_errc::invalid_state when there is nothing to go back to or
  /// `to_version` is not in the history; fleet_errc::conflict as publish.
  desired_state rollback(std::string_view module, std::uint64_t to_version,
                         const secret_key& operator_key);

  // --- what the nodes report ---

  /// Every enrolled node with its newest verified heartbeat and its age at `now`, by node id;
  /// heartbeats that do not verify or go back are refused and counted in `report`. Reads the
  /// heartbeat stream from where the last call stopped (the first call: all it keeps, 8 per
  /// node), up to what it held when called.
  [[nodiscard]] std::vector<node_state> nodes(
      std::chrono::system_clock::time_point now = std::chrono::system_clock::now(),
      read_report* report = nullptr) const;
  /// Every module with a desired state, by name; records that do not verify are left out and
  /// counted in `report`.
  [[nodiscard]] std::vector<desired_entry> modules(read_report* report = nullptr) const;

  /// Waits until each of `nodes` has a verified result for `revision` and `digest` of
  /// `module`, at most `timeout`; returns those seen, in arrival order. Stored results count
  /// only when they answer that revision.
  [[nodiscard]] std::vector<result_record> wait_for_results(std::string_view module,
                                                            std::uint64_t revision,
                                                            std::string_view digest,
                                                            std::span<const std::string> nodes,
                                                            std::chrono::milliseconds timeout);

  /// The connection's state, shared by the controller's sources (src/fleet/controller_impl.hpp);
  /// named here only so that they can pass it around.
  struct impl;

 private:
  std::unique_ptr<impl> impl_;
};

}  // namespace cubridge::fleet
