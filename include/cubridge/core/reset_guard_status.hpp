#pragma once
// Whether this process runs under the reset guard (tools/reset_guard: an LD_PRELOAD library
// that stops third-party code from resetting the device). The guard is easy to lose without a
// sign: ld.so ignores an LD_PRELOAD entry it cannot find ("cannot be preloaded ... ignored") and
// the program runs on, unguarded. So a service can ask, and cubridge says so when the
// environment asks for the guard and it is not there.

#include <filesystem>
#include <string>

namespace cubridge {

struct reset_guard_status {
  /// The guard's code is in this process.
  bool loaded = false;
  /// Its policy when loaded: "deny", "log" or "allow" (CUBRIDGE_RESET_POLICY).
  std::string policy{};
  /// The file it was loaded from, when loaded.
  std::filesystem::path library{};
  /// What in the environment asks for it ("LD_PRELOAD=...", "CUBRIDGE_RESET_POLICY=deny");
  /// empty when nothing does.
  std::string requested_by{};
  /// Asked for and not loaded: the environment says guarded, the process is not.
  [[nodiscard]] bool missing() const noexcept { return !loaded && !requested_by.empty(); }
};

[[nodiscard]] reset_guard_status reset_guard_state();

/// @throws cubridge::error (errc::precondition) when the guard is not loaded, saying how to
///         load it (a full path in LD_PRELOAD, or `cubridge guard -- PROGRAM`).
void require_reset_guard();

/// One line on stderr, once per process, when the guard is asked for and not loaded. cubridge
/// calls it when it first loads the driver, so every program using cubridge says so.
void warn_if_reset_guard_missing() noexcept;

}  // namespace cubridge
