#pragma once
// Starting a child process, written once (the sandbox's worker, `cubridge coldstart`'s probes):
// posix_spawn with the argv, environment and descriptors the caller names, every other
// descriptor closed in the child (inherited ones too, not only those marked close-on-exec), an
// empty signal mask, and the pid owned by a move-only child_process that kills (SIGKILL) and
// reaps the child when it is destroyed.

#include <cubridge/core/unique_fd.hpp>

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace cubridge::detail {

/// A descriptor the child starts with: its descriptor `child` is a duplicate of the parent's
/// `parent` (the parent's own stays as it is).
struct child_fd {
  int child;
  int parent;
};

/// What to start.
struct child_spec {
  /// The file executed, as given (never looked up in PATH); it is also argv[0].
  std::string program;
  /// argv[1...].
  std::vector<std::string> args;
  /// The child's whole environment, "NAME=value" (see current_environment, environment_with).
  std::vector<std::string> environment;
  /// Descriptors 0, 1 and 2 are the parent's unless named here; the child has no others than
  /// these. Each `child` number at most once, below max_child_fd.
  std::vector<child_fd> fds;
  /// Where the child starts; empty: the parent's working directory.
  std::filesystem::path working_directory;
  /// The child leads a process group of its own. Whatever is left in that group when the child
  /// ends (processes it started that did not leave the group) is killed (SIGKILL) before the
  /// child is reaped, and kill() ends the whole group.
  bool own_process_group = false;
};

/// The highest descriptor number + 1 a child_fd may name.
inline constexpr int max_child_fd = 1024;

/// How a child ended.
struct child_exit {
  enum class kind {
    exited,    ///< it returned from main or called exit: exit_code
    signaled,  ///< a signal ended it: signal
    unknown,   ///< waitpid failed: wait_error (ECHILD: reaped elsewhere, e.g. SIGCHLD ignored)
  };
  kind how = kind::unknown;
  int exit_code = -1;
  int signal = 0;
  int wait_error = 0;

  [[nodiscard]] bool exited() const noexcept { return how == kind::exited; }
  [[nodiscard]] bool signaled() const noexcept { return how == kind::signaled; }
  /// "exited with status 3", "killed by signal 11 (Segmentation fault)",
  /// "ended, exit status unknown (waitpid: No child processes; is SIGCHLD ignored?)".
  [[nodiscard]] std::string describe() const;
};

/// This process's environment, "NAME=value" each.
[[nodiscard]] std::vector<std::string> current_environment();

/// This process's environment with `overrides` ("NAME=value") set, each name once, and the
/// `removed` names unset.
[[nodiscard]] std::vector<std::string> environment_with(
    const std::vector<std::string>& overrides, const std::vector<std::string>& removed = {});

/// A started child, until it is reaped. Move-only; a moved-from or reaped object holds none
/// (pid() 0). Not thread-safe: one thread waits for a child.
class child_process {
 public:
  /// Starts `spec`.
  /// @throws cubridge::error (errc::io, call "posix_spawn") naming the program and the system's
  ///         reason when it cannot be started (no such file, not executable, a descriptor that
  ///         cannot be duplicated); errc::precondition for an empty program or a bad child_fd.
  [[nodiscard]] static child_process spawn(const child_spec& spec);

  child_process() noexcept = default;
  child_process(child_process&& other) noexcept;
  child_process& operator=(child_process&& other) noexcept;
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;
  /// Kills (SIGKILL) and reaps a child still held.
  ~child_process();

  /// The child's process id; 0 when none is held.
  [[nodiscard]] pid_t pid() const noexcept { return pid_; }
  /// True while a child is held: started and not yet reaped (it may have exited already).
  [[nodiscard]] bool running() const noexcept { return pid_ > 0; }

  /// Reaps the child if it has ended; nullopt while it runs. With none held: kind::unknown,
  /// wait_error ECHILD (as for wait_for, wait and kill).
  std::optional<child_exit> try_wait() noexcept;
  /// Waits at most `timeout` for the child to end and reaps it; nullopt if it still runs.
  std::optional<child_exit> wait_for(std::chrono::nanoseconds timeout) noexcept;
  /// Waits for the child to end and reaps it.
  child_exit wait() noexcept;
  /// Sends SIGKILL to the child (to its whole group with own_process_group) without reaping it.
  void send_kill() noexcept;
  /// send_kill() and reaps the child: how it ended (what it did first, if it had ended).
  child_exit kill() noexcept;
  /// Gives the child up without waiting for it: the caller reaps the pid returned.
  [[nodiscard]] pid_t release() noexcept;

 private:
  child_process(pid_t pid, bool own_group) noexcept;
  std::optional<child_exit> reap(bool block) noexcept;
  void forget() noexcept;

  pid_t pid_ = 0;
  bool own_group_ = false;  // pid_ leads a process group of its own
  unique_fd pidfd_;         // readable once the child has ended; none where the kernel offers none
};

}  // namespace cubridge::detail
