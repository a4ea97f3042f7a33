#pragma once
// What controller's source files share (controller.cpp: the connection, the bucket, bundles,
// enrolment and reading the nodes; rollout.cpp: publish, the canary policy, rollback and waiting
// for results).

#include "fleet/nats.hpp"

#include <cubridge/fleet/controller.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace cubridge::fleet {

using steady_clock_deadline = std::chrono::steady_clock::time_point;

struct controller::impl {
  controller_options options;
  detail::connection_ptr connection;
  detail::jetstream_ptr js;
  detail::kv_store_ptr bucket;
  std::vector<std::string> warnings;
  bool open = false;
  /// The heartbeat stream, read in order by an ordered consumer made on the first nodes(), and
  /// what its heartbeats told so far.
  detail::subscription_ptr heartbeats;
  std::uint64_t heartbeats_read_to = 0;  // the stream sequence of the last message taken
  heartbeat_ledger ledger;
  /// Heartbeats refused since the first read, by reason, and each node's last refusal.
  std::map<std::string, std::uint64_t, std::less<>> heartbeats_refused;
  std::map<std::string, std::string, std::less<>> last_refusal;

  /// Takes the heartbeats the stream received since the last call, up to what it holds now,
  /// into `ledger`, each verified with the key `registry` holds for the node its subject names;
  /// refusals counted in heartbeats_refused. False when the deadline came first.
  bool read_heartbeats(const node_registry& registry, steady_clock_deadline deadline);

  /// Throws errc::precondition unless `name` is a fleet name.
  static void require_name(std::string_view name, std::string_view what);
  /// The operator keys plus `signer`'s public key.
  [[nodiscard]] trusted_keys keys_with(const secret_key& signer) const;

  /// Writes `key` by compare-and-set: `make` gets the current value (nullopt: none) and its
  /// bucket revision and returns the new value; written only if the key is still at that
  /// revision. Another writer in between: read again and `make` again, three times, then
  /// fleet_errc::conflict. Returns the bucket revision written.
  std::uint64_t compare_and_set(
      const std::string& key,
      const std::function<std::string(const std::optional<detail::kv_value>&)>& make);

  /// Writes module's desired state as compare_and_set does, with the results stream storing
  /// the module's results before and after (ensure_result_stream: another operator's update of
  /// the stream for another module in between may have left this one out; repaired here, and
  /// by every wait for the module's results).
  std::uint64_t write_desired(
      std::string_view module,
      const std::function<std::string(const std::optional<detail::kv_value>&)>& make);
  /// The names of the modules with a desired-state key, sorted.
  [[nodiscard]] std::vector<std::string> desired_modules() const;
  /// Makes the results stream store the results of `module` (empty: none more), and narrows
  /// one of an older cubridge to every module with a desired state; mismatches go to warnings.
  void ensure_results_of(std::string_view module);

  /// Stores `bundle` of `module` (its ref) under its subject, idempotently.
  void store_bundle(std::string_view module, const bundle_ref& ref,
                    std::span<const std::byte> bundle);

  /// The desired state of `module` as read; throws fleet_errc::invalid_state for one that does
  /// not verify with `keys` or parse.
  [[nodiscard]] std::optional<desired_entry> read_desired(std::string_view module,
                                                          const trusted_keys& keys) const;
};

/// The results of one module as they arrive (a core subscription to cubridge.result.<m>.*,
/// flushed to the server before the constructor returns, so a result published after it is
/// seen), each believed only when signed by the enrolled key of the node its subject names.
class result_watch {
 public:
  result_watch(natsConnection* connection, std::string_view module, const node_registry& registry);
  /// The next result that verifies and parses, or nullopt at `deadline`; refusals are counted.
  /// @throws cubridge::error (fleet_errc::unreachable) when the connection is lost.
  [[nodiscard]] std::optional<result_record> next(std::chrono::steady_clock::time_point deadline);
  [[nodiscard]] std::uint64_t refused() const noexcept { return refused_; }

 private:
  std::string module_;
  const node_registry& registry_;
  detail::subscription_ptr subscription_;
  std::uint64_t refused_ = 0;
};

/// The result in a message on `subject` (cubridge.result.<m>.<node>), verified with the
/// enrolled key of that node and checked to name that node and module; nullopt with the reason
/// in `why` otherwise.
[[nodiscard]] std::optional<result_record> verified_result(std::string_view subject,
                                                           std::string_view text,
                                                           std::string_view module,
                                                           const node_registry& registry,
                                                           std::string& why);

}  // namespace cubridge::fleet
