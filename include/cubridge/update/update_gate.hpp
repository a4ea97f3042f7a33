#pragma once
// The receiving policy of the update layer, without a transport: what the HTTP endpoint
// (update_endpoint.hpp) and the fleet agent (fleet_agent.hpp) decide about a pushed bundle or a
// signed rollback request, written once. One gate is a node's update authority: the doors share
// it (update_gate::create, shared_ptr), so one lock per module and one replay record hold
// whichever door a bundle came through. A gate verifies (size, verify_bundle against the trusted
// keys, module name, device), refuses a payload recorded as bad on the node (known_bad: one that
// failed its probation or served when the process was poisoned; never staged again), checks the
// replay floor (update_state: a version at or below the
// highest applied is refused; persisted by default, so also across restarts), records the new
// version before the sink sees it (pending until the sink answered: a redelivery after a crash in
// between resumes that apply), and applies it through the module_sink under the module's lock. The
// reasons are one enum (gate_reason.hpp) whose names are the endpoint's "error" strings
// (docs/update-endpoint.md); the endpoint maps them to its HTTP statuses.

#include <cubridge/bundle/bundle.hpp>
#include <cubridge/update/gate_reason.hpp>
#include <cubridge/update/module_sink.hpp>
#include <cubridge/update/update_state.hpp>  // update_state_error, raised by start()

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cubridge {

/// What a gate accepts (the policy half of update_endpoint_options, which hands these over).
struct update_gate_options {
  /// Keys whose bundles and rollback requests are accepted. Empty: everything is refused.
  trusted_keys keys{};
  /// Largest bundle, in bytes; a larger one is refused (too_large) without being parsed.
  std::size_t max_bundle_bytes = std::size_t{64} << 20;
  /// The replay state file (update_state.hpp). Empty: default_state_directory() /
  /// "update-state.json" (state_location.hpp) while persist_state, else in memory only.
  std::filesystem::path state_file{};
  /// Keep the replay state in the default file when state_file is empty. false is the explicit
  /// opt-out (tests, demos): after a restart, old bundles and rollback requests are accepted
  /// again as far as version_floor and expiry do not stop them.
  bool persist_state = true;
  /// Per module, a version at or below which every bundle is refused; merged at start().
  std::map<std::string, std::uint64_t, std::less<>> version_floor{};
  /// Refuse (expired_bundle) bundles that carry no `expires` field.
  bool require_expiry = false;
  /// Refuse (expired_bundle) bundles whose signed `created` is older than this.
  std::optional<std::chrono::seconds> max_bundle_age{};
  /// Rollback requests are accepted when created within this much of the gate's clock.
  std::chrono::seconds rollback_window{300};
  /// The clock for bundle expiry and the rollback window; empty: the system clock.
  std::function<std::chrono::system_clock::time_point()> clock{};
};

/// What became of a bundle or a rollback request.
enum class gate_outcome {
  applied,    ///< the bundle's version serves now
  duplicate,  ///< the bundle's version serves already; nothing changed (reason replayed_version)
  refused,    ///< refused before the sink changed anything (see the reason)
  /// the sink failed (apply_failed), the version failed its probation or is recorded bad
  /// (marks_bad, known_bad: a fleet halts on it), or the replay state could not be written
  failed,
  rolled_back,  ///< the previous version serves again
};

/// "applied", "duplicate", ... (the enumerator's name).
[[nodiscard]] std::string_view to_string(gate_outcome outcome) noexcept;
/// The outcome named `name` exactly; nullopt for any other text.
[[nodiscard]] std::optional<gate_outcome> parse_gate_outcome(std::string_view name) noexcept;

/// Whether a caller that keeps notes per module (the endpoint's last_refusal) may write this
/// decision under the module's name: only for requests signed by a trusted key, so that nobody
/// else can write there or make the caller hold an entry per name.
enum class module_note {
  none,        ///< not verified (or not about one module): note nothing
  if_present,  ///< verified, but the module may be unknown: note only where a note exists
  always,      ///< verified and about a known or verified module: note it
};

/// Why a version at or below the replay floor may be applied (update_gate::push): the version
/// an operator-signed desired state names, and which record said so (for the detail).
struct push_authority {
  std::uint64_t version = 0;
  /// The record asks to go below what serves (an explicit rollback or a halted rollout); else a
  /// version below the serving one is refused (older_version) as without authority, so two
  /// doors racing never take the serving version down.
  bool below_serving = false;
  std::string source{};  ///< "desired state of 'm' revision 7"
};

/// A gate's answer.
struct gate_decision {
  gate_outcome outcome = gate_outcome::refused;
  /// For anything but applied and rolled_back: why (its name is the endpoint's error string);
  /// none otherwise.
  gate_reason reason = gate_reason::none;
  /// What exactly, at most 4 KiB (cut at a UTF-8 boundary, saying how much was cut). Not escaped:
  /// escape it (core/detail/printable.hpp) before it reaches a terminal or a log line.
  std::string detail{};
  /// The module as signed; empty when the request did not pass verification.
  std::string module{};
  /// The bundle's version; for a rollback the version rolled back to (when done).
  std::uint64_t version = 0;
  /// The version serving before the request, and after it.
  std::uint64_t previous_version = 0;
  std::uint64_t serving_version = 0;
  /// For replayed_version and older_version: the highest version seen (serving or floor).
  std::uint64_t highest_version = 0;
  /// The verified manifest of a pushed bundle; nullopt when it did not verify.
  std::optional<bundle_manifest> manifest{};
  module_note note = module_note::none;
  /// Time spent verifying, and in the sink (module_sink::apply stages, smoke-tests and
  /// promotes in one call; rollback: module_sink::rollback).
  std::chrono::microseconds verify_time{0};
  std::chrono::microseconds apply_time{0};
};

/// The gate. Thread-safe: push and rollback may be called from any threads at once; one module
/// is never applied or rolled back twice at once. Shared by its doors (create()); not copyable
/// or movable. With a state file it holds `<state_file>.lock` (flock) from start() to its
/// destruction: one gate per file, across processes and within one.
class update_gate {
 public:
  /// A gate over `sink`, which it holds, to share between the doors of a node (the update
  /// endpoint, the fleet agent). Reads nothing yet: see start(). @throws error
  /// (errc::precondition) when `sink` is null.
  [[nodiscard]] static std::shared_ptr<update_gate> create(std::shared_ptr<module_sink> sink,
                                                           update_gate_options options);
  /// As create(), for a gate owned otherwise.
  update_gate(std::shared_ptr<module_sink> sink, update_gate_options options);
  update_gate(const update_gate&) = delete;
  update_gate& operator=(const update_gate&) = delete;
  /// Releases the state file's lock and stops listening for the process being poisoned.
  ~update_gate();

  /// Takes the state file's lock (making the default directory, mode 0700, when missing), loads
  /// the replay state, merges version_floor into it and starts listening for the process being
  /// poisoned (add_poison_listener: see record_bad). Until it has succeeded every push and
  /// rollback is refused (not_started). Idempotent and thread-safe: every door calls it; the
  /// first call does the work, later ones return at once; a call that threw leaves the gate
  /// unstarted (and unlocked), so it may be retried.
  /// @throws error (errc::precondition) when a version_floor name is no module name, or when
  ///         no state_file is named, persist_state is set and default_state_directory() finds
  ///         no directory; update_state_error (errc::io): locked when another gate (another
  ///         process, or this one) holds the file; unreadable, too_large or corrupt when the
  ///         state file cannot be used; write_failed when the default directory cannot be made.
  void start();
  /// Whether start() has succeeded.
  [[nodiscard]] bool started() const noexcept;
  /// The replay state file in use (empty: memory only); empty before start().
  [[nodiscard]] std::filesystem::path state_file() const;

  /// Decides about a pushed bundle and, when it passes, applies it. `expected_module`, when not
  /// empty, is the name the transport addressed (refused as name_mismatch when the signed name
  /// differs). With `authority` (an operator-signed desired state the caller verified, naming
  /// exactly this version), a version at or below the replay floor is applied too: a fleet that
  /// went back to an earlier version, or a node that lost what it served; the floor stays where
  /// it is, so the same bundle without authority is still refused. Refused (failed,
  /// not_started) before start(). Never throws but std::bad_alloc.
  [[nodiscard]] gate_decision push(std::span<const std::byte> body,
                                   std::string_view expected_module = {},
                                   const push_authority* authority = nullptr);
  /// Decides about a signed rollback request (rollback_request.hpp) and, when it passes, rolls
  /// the module back. `expected_module` as for push; refused before start() as push. Never
  /// throws but std::bad_alloc.
  [[nodiscard]] gate_decision rollback(std::string_view signed_request,
                                       std::string_view expected_module = {});

  /// The bundle version of `module` serving now (0: none), from the sink: the one place a door
  /// asks, between decisions (a push's or rollback's decision carries it as serving_version).
  [[nodiscard]] std::uint64_t serving(std::string_view module) const;
  /// The gate's decision about `version` of `module` when the caller has no bundle in hand:
  /// duplicate (replayed_version) when that version serves already; nullopt when it does not,
  /// and only a push of its bundle can decide. A door that knows the version it wants (the
  /// fleet agent) so never fetches a bundle that serves, nor makes a decision up.
  [[nodiscard]] std::optional<gate_decision> already_serving(std::string_view module,
                                                             std::uint64_t version) const;
  /// The highest version recorded for `module` in the replay state; 0 when none.
  [[nodiscard]] std::uint64_t highest_version(std::string_view module) const;

  /// Records payload `digest` (lower-case hex SHA-256: bundle_manifest::payload_sha256) of
  /// `module` as bad on this node, as `version`, for `reason`, in the replay state (written
  /// before it returns): from then on every bundle of the module carrying that payload, whatever
  /// its version, is refused (known_bad, outcome failed) before the sink sees it, also after a
  /// restart. A payload recorded already keeps its first record. The gate records by itself
  /// what the sink answers faulted_in_probation or mismatch_in_probation
  /// for, and, once the process is poisoned (core/process_health.hpp), the payload serving (or a
  /// newer one being applied) in each module that it applied (sticky_error). @throws error
  /// (errc::precondition) before start(), for a module name check_module_name refuses, a digest
  /// that is not 64 lower-case hex digits, version 0 or the reason none; update_state_error
  /// (write_failed) when the file cannot be written (recorded in memory even then).
  void record_bad(std::string_view module, std::string_view digest, std::uint64_t version,
                  gate_reason reason);
  /// Every payload recorded bad (update_state::bad_versions): by module, oldest first; empty
  /// before start().
  [[nodiscard]] std::vector<bad_version> bad_versions() const;
  [[nodiscard]] module_sink& sink() const noexcept;
  [[nodiscard]] const update_gate_options& options() const noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace cubridge
