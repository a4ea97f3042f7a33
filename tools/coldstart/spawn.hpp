#pragma once
// Runs one child process (the core's spawner, core/detail/child_process.hpp) with its own
// environment, reads its stdout line by line as it arrives and keeps the end of its stderr, and
// kills it when it runs past a deadline: a child that hangs or crashes never hangs the parent.

#include <cubridge/core/detail/child_process.hpp>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace cubridge::tool::coldstart {

struct child_request {
  std::string program;            ///< absolute path
  std::vector<std::string> args;  ///< argv[1...]
  std::vector<std::string> env;   ///< the whole environment, "NAME=value"
  std::chrono::milliseconds timeout{60'000};
};

struct child_outcome {
  enum class end { exited, signaled, timed_out, spawn_failed };
  end how = end::spawn_failed;
  int exit_code = -1;                     ///< end::exited
  int signal = 0;                         ///< end::signaled (and the SIGKILL of end::timed_out)
  std::vector<std::string> stdout_lines;  ///< every complete or final line, without '\n'
  std::string stderr_tail;                ///< the last few KiB of stderr
  std::string spawn_error;                ///< end::spawn_failed: why
  double wall_ms = 0;
  /// "exited with status 1", "killed by signal 11 (Segmentation fault)", "timed out after 60 s".
  [[nodiscard]] std::string describe() const;
};

/// Spawns `request`, calls on_line for each stdout line as soon as it is complete, and returns
/// when the child has ended (waited for) or was killed at the deadline. stdin is /dev/null.
/// Never throws for failures of the child; std::bad_alloc aside.
child_outcome run_child(const child_request& request,
                        const std::function<void(const std::string& line)>& on_line = {});

/// The environment of this process with `overrides` ("NAME=value") set and `removed` names unset.
using cubridge::detail::environment_with;

}  // namespace cubridge::tool::coldstart
