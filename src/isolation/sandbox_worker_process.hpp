#pragma once
// The sandbox's worker process, host side: started through the core's child-process spawner
// with its end of a Unix socket at descriptor 3 and the environment the sandbox chose, waited
// for until it reports ready, and ended (the socket closed, then SIGKILL after a grace period)
// or killed and reaped. Internal to cubridge_isolation.

#include <cubridge/core/detail/child_process.hpp>
#include <cubridge/core/unique_fd.hpp>
#include <cubridge/isolation/detail/sandbox_protocol.hpp>
#include <cubridge/isolation/sandbox.hpp>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace cubridge::sandbox_internal {

/// How a worker ended.
struct worker_end {
  sandbox_failure reason = sandbox_failure::crashed;
  std::string text;  ///< "worker pid 7 killed by signal 11 (Segmentation fault)"
  int exit_code = -1;
};

/// What a worker is started with.
struct worker_launch {
  std::filesystem::path worker;  ///< the executable
  std::filesystem::path library;
  int device = 0;
  bool initialize_cuda = true;
  std::chrono::milliseconds start_timeout{60'000};
  std::vector<std::string> environment;  ///< the worker's whole environment
  int cancel_fd = -1;  ///< readable: give the start up (the sandbox is being destroyed)
};

/// How the worker said it is ending (a dying message): "worker pid P killed by signal 11 (...)".
[[nodiscard]] worker_end last_words(pid_t pid, const detail::sandbox_protocol::dying_message& m);

/// Waits until `socket` or `cancel_fd` (if >= 0) is readable, or `deadline`. Returns 1 for the
/// socket, 0 for a timeout, -1 for the cancel descriptor.
int wait_socket_or_cancel(int socket, int cancel_fd,
                          std::chrono::steady_clock::time_point deadline) noexcept;

/// A worker: its process and the host's end of the socket. The destructor ends it (stop()).
class worker_process {
 public:
  worker_process() = default;
  worker_process(const worker_process&) = delete;
  worker_process& operator=(const worker_process&) = delete;
  ~worker_process() { stop(); }

  /// Starts a worker (none may run) and waits for its ready message. Returns "" with the
  /// worker running and `cuda_status` set from its message, or why it failed (the worker then
  /// killed and reaped).
  std::string start(const worker_launch& launch, std::string& cuda_status);

  [[nodiscard]] pid_t pid() const noexcept { return process_.pid(); }
  [[nodiscard]] int socket() const noexcept { return socket_.get(); }
  [[nodiscard]] bool running() const noexcept { return process_.running(); }
  /// True while the worker runs and has neither sent anything unasked (its last words) nor
  /// closed its socket: a spare about to take over is checked so.
  [[nodiscard]] bool idle_and_alive() const noexcept;

  /// Kills (SIGKILL) every living descendant of the worker: what its library started and left
  /// running, orphans included (the worker is a child subreaper). The worker itself runs on.
  void end_descendants() noexcept;
  /// Graceful end: its descendants killed, then the socket closed (the worker exits on EOF),
  /// `grace` given, then SIGKILL to its group.
  void stop(std::chrono::milliseconds grace = std::chrono::milliseconds(2000)) noexcept;
  /// The first half of stop(), so that several workers exit at once: closes the socket.
  void close_socket() noexcept { socket_.reset(); }
  /// Kills its descendants and sends SIGKILL to its group without waiting (the pid stays owned
  /// until reaped).
  void signal_kill() noexcept;
  /// Its descendants killed, SIGKILL to its group, and reap. Returns how it ended (killed, or
  /// whatever it did first).
  worker_end kill_and_reap() noexcept;
  /// Its last words held against how it really ends: waits up to `grace` for it to exit and
  /// reports the reaped status (with what it had said, where the two differ); a worker that says
  /// it is ending and runs on is killed (with its group) and reported as a protocol failure. A
  /// worker's claim is never reported as its end unless the exit confirms it.
  worker_end confirm_last_words(const detail::sandbox_protocol::dying_message& words,
                                std::chrono::milliseconds grace = std::chrono::milliseconds(2000));
  /// Waits up to `timeout` for the worker to exit by itself; nullopt if it still runs.
  std::optional<worker_end> wait_for_exit(std::chrono::milliseconds timeout) noexcept;

 private:
  std::string await_ready(const worker_launch& launch, std::string& cuda_status);
  worker_end ended(pid_t pid, const detail::child_exit& exit) noexcept;

  detail::child_process process_;
  unique_fd socket_;
};

}  // namespace cubridge::sandbox_internal
