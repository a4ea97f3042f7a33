#pragma once
// The replay memory of an update endpoint (update_endpoint.hpp), kept across restarts: per module
// the highest bundle version ever applied (and whether its apply is still unsettled), the
// payloads recorded as bad on this node, and the nonces of rollback requests still inside their
// window. Without it a restarted service would accept a captured old bundle or rollback request
// again, or stage again the code that faulted. The file format and its guarantees are in
// docs/update-endpoint.md ("Replay state"):
//
//   {"cubridge_update_state":1,"highest_versions":{"filters":7},
//    "pending_versions":{"filters":7},
//    "bad_versions":{"filters":[{"digest":"<64 hex>","version":6,
//                                "reason":"faulted_in_probation","time":"2026-11-29T12:00:00Z"}]},
//    "rollback_nonces":{"9c1e4f0b7d2a6e3c5b8a1d0f2e4c6a8b":"2026-11-29T12:00:00Z"}}
//
// "pending_versions" is optional (absent: every version settled); each entry repeats the
// module's highest version, recorded for an apply whose outcome is not known yet.
// "bad_versions" is optional too (absent: none recorded); per module, oldest first.
//
// Every change is written before the call that makes it returns: a new temporary file in the
// same directory (O_EXCL, mode 0600), written, fsync'ed, renamed over the file, and the directory
// fsync'ed; so after a crash the file holds the old state or the new one, never a mix.

#include <cubridge/core/error.hpp>
#include <cubridge/update/gate_reason.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <source_location>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace cubridge {

/// Why a replay state file could not be used.
enum class update_state_reason {
  unreadable,    ///< the file exists but cannot be opened or read, or is not a regular file
  too_large,     ///< the file is larger than max_update_state_bytes
  corrupt,       ///< the file is not the format above (syntax, fields, names, versions, times)
  write_failed,  ///< a change could not be written (nothing of it was applied, see each call)
  locked,        ///< another gate holds the file's lock (update_gate.hpp: one gate per file)
};

/// "unreadable", "too_large", ... (the enumerator's name).
[[nodiscard]] std::string_view to_string(update_state_reason reason) noexcept;

/// Raised when a replay state file cannot be read or written. code() is errc::io; the message
/// names the file.
class update_state_error : public error {
 public:
  update_state_error(update_state_reason reason, std::string call, std::string involved,
                     std::source_location where = std::source_location::current());
  [[nodiscard]] update_state_reason reason() const noexcept { return reason_; }

 private:
  update_state_reason reason_;
};

/// Largest replay state file read, in bytes; a change that would write a larger one fails.
inline constexpr std::size_t max_update_state_bytes = std::size_t{16} << 20;

/// What a rollback request's nonce turned out to be.
enum class nonce_outcome {
  fresh,     ///< not seen before; now remembered (and written)
  replayed,  ///< seen before inside the window
  full,      ///< not seen, but as many nonces as allowed are remembered already
};

/// A payload recorded as bad on this node (docs/update-endpoint.md, "Known-bad payloads"): the
/// gate refuses (known_bad) every bundle of the module that carries it, whatever its version,
/// before the sink sees it.
struct bad_version {
  std::string module{};
  /// Lower-case hex SHA-256 of the payload (bundle_manifest::payload_sha256): the same code
  /// signed again under another version is the same payload.
  std::string digest{};
  /// The bundle version it came as when it was recorded.
  std::uint64_t version = 0;
  /// Why: faulted_in_probation, mismatch_in_probation, sticky_error (see
  /// marks_bad), or whatever reason the caller of update_gate::record_bad named; never none.
  gate_reason reason = gate_reason::none;
  std::chrono::sys_seconds time{};  ///< when it was recorded
  friend bool operator==(const bad_version&, const bad_version&) = default;
};

/// Most payloads recorded bad per module. Recording one more drops the module's oldest record;
/// a file holding more (written with a larger bound) keeps its newest on load.
inline constexpr std::size_t max_bad_versions_per_module = 256;

/// The replay state. Thread-safe: every member may be called from any thread at once.
class update_state {
 public:
  /// A state in memory only: forgotten at exit, so a restarted endpoint accepts old requests.
  update_state() = default;
  /// A state backed by `file` (an empty path: memory only). Reads nothing yet: see load().
  explicit update_state(std::filesystem::path file);
  update_state(const update_state&) = delete;
  update_state& operator=(const update_state&) = delete;

  /// The backing file; empty for a state in memory only.
  [[nodiscard]] const std::filesystem::path& file() const noexcept { return file_; }

  /// Reads the backing file and merges it into what is held (per module the higher version,
  /// pending when the higher one is, or both equal ones are; the union of the nonces). A missing
  /// file is an empty state (a first start); so is a state in memory only. Throws
  /// update_state_error naming the file: unreadable, too_large, corrupt.
  void load();

  /// The highest version recorded for `module`; 0 when none.
  [[nodiscard]] std::uint64_t highest_version(std::string_view module) const;
  /// Every module with a recorded version, and that version.
  [[nodiscard]] std::map<std::string, std::uint64_t, std::less<>> highest_versions() const;

  /// Raises the version recorded for `module` to at least `version`, in memory (it is written
  /// with the next change). For floors a service knows from elsewhere, e.g. its configuration;
  /// a floor at or above a pending version settles it (every bundle at the floor is refused).
  void raise_highest_version(std::string_view module, std::uint64_t version);

  /// Records `version` as the highest of `module` (also a lower one: to undo a record whose
  /// apply failed), settled, and writes the file before returning. Throws update_state_error
  /// (write_failed) when it cannot be written; then the recorded version is unchanged in memory
  /// (the file may hold either: the new one only if the rename was done).
  void store_highest_version(std::string_view module, std::uint64_t version);

  /// As store_highest_version, but `version` stays pending: recorded before its apply, whose
  /// outcome is not known until settle(). A pending version found after a restart may be an
  /// apply the crash interrupted. Throws update_state_error (write_failed) as
  /// store_highest_version; then the version and its pending mark are unchanged in memory.
  void record_pending(std::string_view module, std::uint64_t version);

  /// Whether the highest version of `module` is pending (recorded, its apply's outcome unknown).
  [[nodiscard]] bool pending(std::string_view module) const;

  /// Marks the highest version of `module` settled (its apply's outcome is known) and, when it
  /// was pending, writes the file before returning. Throws update_state_error (write_failed)
  /// when it cannot be written; it is settled in memory even then (the safe side: a settled
  /// version is refused again).
  void settle(std::string_view module);

  /// Remembers the nonce of a rollback request created at `created`, unless it is known
  /// already, and forgets first every nonce of a request created before `forget_before`. When it
  /// remembers one it writes the file before returning; at most `max_nonces` are held. Throws
  /// update_state_error (write_failed) when the file cannot be written; the nonce stays
  /// remembered in memory even then (a request whose use could not be recorded must not be
  /// honoured later either).
  nonce_outcome remember_nonce(std::string_view nonce, std::chrono::sys_seconds created,
                               std::chrono::sys_seconds forget_before, std::size_t max_nonces);

  /// How many nonces are remembered.
  [[nodiscard]] std::size_t nonce_count() const;

  /// Records `entry` as bad, unless its module and digest are recorded already (the first record
  /// stands), dropping the module's oldest record past max_bad_versions_per_module, and writes
  /// the file before returning. Returns whether it was new. No member holds the state's lock
  /// across a CUDA call, so a poison listener may call this from whichever thread saw the error
  /// (update_gate does). @throws error (errc::precondition) for a module name check_module_name
  /// refuses, a digest that is not 64 lower-case hex digits, version 0, the reason none, or a time
  /// the file cannot hold (outside years 0 to 9999); update_state_error (write_failed) when the
  /// file cannot be written: the record stays in memory even then (code that faulted is not staged
  /// again by this process either).
  bool record_bad(const bad_version& entry);
  /// The record of payload `digest` of `module`; nullopt when it is not recorded bad.
  [[nodiscard]] std::optional<bad_version> find_bad(std::string_view module,
                                                    std::string_view digest) const;
  /// Every payload recorded bad, by module name, each module's oldest first.
  [[nodiscard]] std::vector<bad_version> bad_versions() const;

 private:
  void save_locked() const;  // writes the whole state; the caller holds mutex_
  void record_locked(const std::string& module, std::uint64_t version, bool pending);

  std::filesystem::path file_;
  mutable std::mutex mutex_;
  std::map<std::string, std::uint64_t, std::less<>> highest_;
  std::set<std::string, std::less<>> pending_;  // modules whose highest version is pending
  // Per module its bad payloads, oldest first, at most max_bad_versions_per_module; searched
  // linearly (a push looks once; 256 compares are nothing beside verifying the bundle).
  std::map<std::string, std::vector<bad_version>, std::less<>> bad_;
  std::unordered_map<std::string, std::chrono::sys_seconds> nonces_;  // nonce -> request time
};

}  // namespace cubridge
