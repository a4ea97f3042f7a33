#pragma once
// Where cubridge's helper files are in this process's installation: the sandbox worker (a
// program) and the reset guard (an LD_PRELOAD library). They are looked for from where
// cubridge's own code is (dladdr), so an install tree, a wheel or a build tree works wherever it
// was moved; the environment overrides them, the configured prefix comes last.

#include <filesystem>
#include <string>
#include <string_view>

namespace cubridge {

enum class helper_file {
  sandbox_worker,   ///< cubridge-sandbox-worker (isolation/sandbox.hpp)
  reset_guard,      ///< libcubridge_reset_guard.so (tools/reset_guard)
  probation_entry,  ///< libcubridge_probation_entry.so (tools/probation_entry, swap/probation.hpp)
};
[[nodiscard]] std::string_view to_string(helper_file which) noexcept;

/// Where a helper file is, and how that was decided.
struct helper_location {
  /// The file found; when none was, the last place looked (the configured prefix's).
  std::filesystem::path path{};
  /// How: "CUBRIDGE_SANDBOX_WORKER", "beside /opt/x/lib/python3/cubridge/_cubridge.so",
  /// "the install tree of /opt/x/bin/service", "beside the program", "the configured prefix".
  std::string found_by{};
  /// Whether `path` is there (an executable file for the worker, a regular file for the guard).
  bool found = false;
};

/// Looks, in order: the environment (CUBRIDGE_SANDBOX_WORKER, CUBRIDGE_RESET_GUARD; taken as
/// given, found or not); beside the file holding cubridge's code (the program, or the shared
/// library cubridge is linked into); that file's install tree (<prefix>/libexec for the worker,
/// <prefix>/lib for the guard, the directories cubridge was configured with); beside the
/// running program; the prefix cubridge was configured with; the build tree cubridge was built
/// in (where it built the helper).
[[nodiscard]] helper_location locate(helper_file which);

/// The file that holds cubridge's code in this process: the program, or the shared library
/// (a Python extension, a plugin) cubridge's static libraries were linked into.
[[nodiscard]] std::filesystem::path code_location();

}  // namespace cubridge
