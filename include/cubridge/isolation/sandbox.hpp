#pragma once
// An out-of-process sandbox for third-party CUDA libraries.
//
// A fault (illegal address) poisons every context of a process; a separate process is the only
// boundary (FACTS.md "Faults are process-wide"). sandbox runs a library in a worker process
// (tools/sandbox_worker, `cubridge-sandbox-worker`) that dlopens it and calls its entry points
// (sandbox_entry.hpp) on request. Host and worker talk over a Unix socket; the host's device
// memory (shared_device_memory allocated with memory_export::posix_fd) is exported as a file
// descriptor, passed with SCM_RIGHTS and mapped in the worker (cuMemImportFromShareableHandle +
// cuMemMap + cuMemSetAccess), so a kernel in the worker works on the host's buffer in place.
//
// A crash (signal), abort(), a call that outlives its timeout (the worker is SIGKILLed) or a
// sticky CUDA error in the worker ends only the worker: the call throws sandbox_error with the
// reason, the sandbox starts a fresh worker before throwing (restart_duration() says how long it
// took) and the host's contexts and buffers are untouched. What the worker's kernel wrote before
// it failed stays written. A library that resets the worker's primary context (cudaDeviceReset)
// is reported as a cuda_fault too: the worker's mappings and the library's state went with it,
// so the worker is replaced rather than trusted.
//
// Calls are serialized (one worker, one call at a time); a sandbox is safe to use from several
// threads.

#include <cubridge/core/shared_device_memory.hpp>
#include <cubridge/isolation/error.hpp>

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cubridge {

/// Why a sandboxed call failed.
enum class sandbox_failure {
  crashed,               ///< the worker died from a signal other than SIGABRT, or exited
  aborted,               ///< the worker died from SIGABRT (abort(), a failed assert)
  timed_out,             ///< the call did not return in time; the worker was killed (SIGKILL)
  cuda_fault,            ///< a sticky CUDA error was left after the call; the worker ended itself
  protocol,              ///< the worker sent something malformed or unexpected; it was killed
  start_failed,          ///< the worker could not be started or could not load the library
  no_such_entry,         ///< the library has no such entry point (the worker carries on)
  buffer_import_failed,  ///< a shared buffer could not be mapped in the worker (it carries on)
};

/// "crashed", "aborted", "timed_out", ...
[[nodiscard]] std::string_view to_string(sandbox_failure reason) noexcept;

/// Raised when a sandboxed call or the worker fails (isolation_errc::sandbox_failure). what() names
/// the library, the entry, the worker's pid, what happened (signal, timeout, CUDA error) and
/// whether and how fast the worker was restarted.
class sandbox_error : public error {
 public:
  sandbox_error(sandbox_failure reason, std::string call, std::string detail, bool restarted,
                std::chrono::nanoseconds restart_duration,
                std::source_location where = std::source_location::current());
  [[nodiscard]] sandbox_failure reason() const noexcept { return reason_; }
  /// True when a fresh worker is up (after crashed/aborted/timed_out/cuda_fault/protocol).
  [[nodiscard]] bool restarted() const noexcept { return restarted_; }
  /// Time from the failure being seen to the fresh worker reporting ready (zero if none).
  [[nodiscard]] std::chrono::nanoseconds restart_duration() const noexcept {
    return restart_duration_;
  }

 private:
  sandbox_failure reason_;
  bool restarted_;
  std::chrono::nanoseconds restart_duration_;
};

/// How a sandbox runs its worker.
struct sandbox_options {
  /// The shared library the worker dlopens (its entry points: sandbox_entry.hpp).
  std::filesystem::path library;
  /// The worker executable; empty: sandbox::default_worker().
  std::filesystem::path worker;
  /// Name for messages; empty: the library's file name.
  std::string name;
  /// The longest a call may take before the worker is killed.
  std::chrono::milliseconds call_timeout{30'000};
  /// The longest a worker may take to start (load the library, initialise CUDA).
  std::chrono::milliseconds start_timeout{60'000};
  /// The CUDA device the worker uses.
  int device = 0;
  /// Initialise CUDA in the worker before it reports ready (cuInit, the device's primary context
  /// retained and current), so that a restart includes that cost and the first call does not
  /// pay it. Off for libraries that need no GPU; a worker without CUDA still runs CPU entries.
  bool initialize_cuda = true;
};

/// What an entry point returned.
struct sandbox_reply {
  int status = 0;                ///< the entry's return value
  std::vector<std::byte> bytes;  ///< what it wrote to args->reply
};

class sandbox_share;

/// A call's inputs.
struct sandbox_request {
  /// Bytes handed to the entry as args->request.
  std::span<const std::byte> bytes = {};
  /// Shared buffers, handed to the entry as args->buffers in this order.
  std::vector<std::reference_wrapper<const sandbox_share>> buffers = {};
  /// Room for the entry's reply.
  std::size_t reply_capacity = std::size_t{64} * 1024;
  /// Overrides sandbox_options::call_timeout when non-zero.
  std::chrono::milliseconds timeout{0};
};

/// A library running in a worker process, restarted after each failure. Move-only.
class sandbox {
 public:
  /// Starts the worker and waits until it has loaded the library.
  /// @throws sandbox_error (start_failed) naming the worker, the library and the reason.
  [[nodiscard]] static sandbox start(sandbox_options options);

  /// The worker executable to use when sandbox_options::worker is empty: $CUBRIDGE_SANDBOX_WORKER,
  /// else `cubridge-sandbox-worker` next to the running program, else the installed one.
  [[nodiscard]] static std::filesystem::path default_worker();

  sandbox(sandbox&&) noexcept;
  sandbox& operator=(sandbox&&) noexcept;
  sandbox(const sandbox&) = delete;
  sandbox& operator=(const sandbox&) = delete;
  /// Closes the socket (the worker exits), killing the worker if it does not exit promptly.
  ~sandbox();

  /// Calls `entry` in the worker. Starts a worker first if the last restart failed.
  /// @throws sandbox_error naming the reason; the worker was restarted where it had to be.
  sandbox_reply call(std::string_view entry, const sandbox_request& request = {});

  /// Shares `memory` (allocated with memory_export::posix_fd) with the worker: it is mapped there
  /// on its first use in a call, again after each restart, and unmapped when the share ends.
  /// `memory` must outlive the share. @throws error (errc::precondition) if it is not exportable;
  /// error if the driver cannot export it.
  [[nodiscard]] sandbox_share share(const shared_device_memory& memory);

  /// Kills the worker (if any) and starts a fresh one. @throws sandbox_error (start_failed)
  void restart();

  /// The worker's process id (0 while none runs).
  [[nodiscard]] pid_t worker_pid() const noexcept;
  /// Workers started after the first one.
  [[nodiscard]] std::size_t restarts() const noexcept;
  /// How long the latest worker took to start (spawn to ready).
  [[nodiscard]] std::chrono::nanoseconds last_start_duration() const noexcept;
  /// What the worker said about CUDA at start: empty when initialised (or not asked for).
  [[nodiscard]] std::string worker_cuda_status() const;
  [[nodiscard]] const std::string& name() const noexcept;

  struct state;

 private:
  explicit sandbox(std::shared_ptr<state> s) noexcept;
  std::shared_ptr<state> state_;
};

/// A buffer shared with a sandbox's worker, for as long as this object lives. Move-only.
class sandbox_share {
 public:
  sandbox_share(sandbox_share&&) noexcept;
  sandbox_share& operator=(sandbox_share&&) noexcept;
  sandbox_share(const sandbox_share&) = delete;
  sandbox_share& operator=(const sandbox_share&) = delete;
  /// Unmaps the buffer in the worker (if it runs). Never throws.
  ~sandbox_share();

  [[nodiscard]] std::uint64_t id() const noexcept { return id_; }
  [[nodiscard]] CUdeviceptr host_address() const noexcept { return host_address_; }
  [[nodiscard]] std::size_t size_bytes() const noexcept { return size_; }

 private:
  friend class sandbox;
  sandbox_share(std::shared_ptr<sandbox::state> s, std::uint64_t id, CUdeviceptr address,
                std::size_t size) noexcept
      : state_(std::move(s)), id_(id), host_address_(address), size_(size) {}
  void reset() noexcept;
  std::shared_ptr<sandbox::state> state_;
  std::uint64_t id_ = 0;
  CUdeviceptr host_address_ = 0;
  std::size_t size_ = 0;
};

}  // namespace cubridge
