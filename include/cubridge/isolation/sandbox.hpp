#pragma once
// An out-of-process sandbox for third-party CUDA libraries.
//
// A fault (illegal address) poisons every context of a process; a separate process is the only
// boundary (FACTS.md "Faults are process-wide"). sandbox runs a library in worker processes
// (tools/sandbox_worker, `cubridge-sandbox-worker`) that dlopen it and call its entry points
// (sandbox_entry.hpp) on request. Host and worker talk over a Unix socket; the host's device
// memory (shared_device_memory allocated with memory_export::posix_fd) is exported as a file
// descriptor, passed with SCM_RIGHTS and mapped in the worker (cuMemImportFromShareableHandle +
// cuMemMap + cuMemSetAccess), so a kernel in the worker works on the host's buffer in place.
//
// A crash (signal), abort(), exit(), a call that outlives its timeout (the worker is SIGKILLed),
// a sticky CUDA error or a reset of the worker's primary context (cudaDeviceReset) ends only the
// worker: the call throws sandbox_error with the reason and the host's contexts and buffers are
// untouched. What the worker's kernel wrote before it failed stays written. Who serves the next
// call (sandbox_options::standby):
// - standby >= 1 (the default): a spare worker, started beforehand and fully ready (CUDA
//   initialised, library loaded, every shared buffer mapped), takes the failed worker's place at
//   once; the failing call throws without waiting for any start, and a replacement spare starts
//   on the sandbox's background thread. With no spare ready, as for standby = 0.
// - standby = 0: the sandbox starts a fresh worker before the failing call throws.
// restart_duration() says how long the replacement took, from the failure being seen.
//
// sandbox_options::workers runs several workers: each call goes to a free one (a call waits
// while all are busy), with the same failure handling per worker; a failure in one never
// disturbs calls in the others. A sandbox is safe to use from several threads.

#include <cubridge/core/shared_device_memory.hpp>
#include <cubridge/isolation/error.hpp>
#include <cubridge/isolation/mps_policy.hpp>

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
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
  device_reset,          ///< the call reset the worker's primary context (cudaDeviceReset)
};

/// What the sandbox did about the worker a failure ended.
enum class sandbox_recovery {
  none,            ///< nothing (the worker carries on), or no fresh worker could be started
  spare_promoted,  ///< a standby worker took the failed one's place: no start in the call's path
  restarted,       ///< a fresh worker was started before the call threw (no spare was ready)
};

/// "none", "spare_promoted", "restarted".
[[nodiscard]] std::string_view to_string(sandbox_recovery recovery) noexcept;

/// "crashed", "aborted", "timed_out", ...
[[nodiscard]] std::string_view to_string(sandbox_failure reason) noexcept;

/// What a worker reports with a cuda_fault or a device_reset: the damage it found after the call
/// returned, and what the entry returned.
struct sandbox_fault_report {
  /// The sticky error in the worker's context (CUDA_ERROR_ILLEGAL_ADDRESS), or for a reset what
  /// the check of its primary context gave (CUDA_ERROR_CONTEXT_IS_DESTROYED when the id changed).
  CUresult cuda_error = CUDA_SUCCESS;
  /// The entry's return value (for a CUDA library, often its own cudaError_t).
  int entry_status = 0;
};

/// Raised when a sandboxed call or the worker fails (isolation_errc::sandbox_failure). what() names
/// the library, the entry, the worker's pid, what happened (signal, timeout, CUDA error) and
/// who serves the next call (a spare, a restarted worker) and how fast it was ready.
class sandbox_error : public error {
 public:
  /// `fault`: what the worker reported with a cuda_fault or device_reset (cuda_error(),
  /// entry_status()); none for the other failures.
  sandbox_error(sandbox_failure reason, std::string call, std::string detail,
                sandbox_recovery recovery, std::chrono::nanoseconds restart_duration,
                std::chrono::steady_clock::time_point seen_at,
                std::optional<sandbox_fault_report> fault = std::nullopt,
                std::source_location where = std::source_location::current());
  /// As above with recovery restarted (true) or none (false), seen now.
  sandbox_error(sandbox_failure reason, std::string call, std::string detail, bool restarted,
                std::chrono::nanoseconds restart_duration,
                std::source_location where = std::source_location::current());
  [[nodiscard]] sandbox_failure reason() const noexcept { return reason_; }
  /// True when a worker is ready for the next call in the failed one's place: a spare took over
  /// (recovery() spare_promoted) or a fresh worker was started (restarted). After
  /// crashed/aborted/timed_out/cuda_fault/device_reset/protocol, unless no worker could start.
  [[nodiscard]] bool restarted() const noexcept { return recovery_ != sandbox_recovery::none; }
  [[nodiscard]] sandbox_recovery recovery() const noexcept { return recovery_; }
  /// From the failure being seen to the replacement being ready: a spare's promotion
  /// (microseconds) or a whole worker start (zero if none).
  [[nodiscard]] std::chrono::nanoseconds restart_duration() const noexcept {
    return restart_duration_;
  }
  /// When the host saw the failure (the worker's last words, its socket closing, the timeout).
  [[nodiscard]] std::chrono::steady_clock::time_point seen_at() const noexcept { return seen_at_; }
  /// The CUDA error the worker found after the call (sandbox_fault_report::cuda_error), for
  /// cuda_fault and device_reset; nullopt for every other failure.
  [[nodiscard]] std::optional<CUresult> cuda_error() const noexcept {
    return fault_ ? std::optional(fault_->cuda_error) : std::nullopt;
  }
  /// What the entry returned before the worker found the damage, for cuda_fault and
  /// device_reset; nullopt where it did not return (crashed, aborted, timed_out, ...).
  [[nodiscard]] std::optional<int> entry_status() const noexcept {
    return fault_ ? std::optional(fault_->entry_status) : std::nullopt;
  }

 private:
  sandbox_failure reason_;
  sandbox_recovery recovery_;
  std::chrono::nanoseconds restart_duration_;
  std::chrono::steady_clock::time_point seen_at_;
  std::optional<sandbox_fault_report> fault_;
};

/// The environment a worker starts with: the host's as it was at sandbox::start, without its
/// LD_PRELOAD (a guarded or instrumented host would otherwise preload the same into its worker
/// unasked), then what is set here.
struct sandbox_environment {
  /// Keep the host's LD_PRELOAD in the worker.
  bool inherit_preload = false;
  /// Preload the reset guard (tools/reset_guard) in the worker: a library's cudaDeviceReset is
  /// then handled by the guard's policy (CUBRIDGE_RESET_POLICY, deny by default: the call carries
  /// on) instead of ending the worker (device_reset). Prepended to the worker's LD_PRELOAD.
  bool reset_guard = false;
  /// The guard library; empty: sandbox::default_reset_guard().
  std::filesystem::path reset_guard_library{};
  /// "NAME=value" entries set in the worker, after the above (LD_PRELOAD too).
  std::vector<std::string> variables{};
};

/// How a sandbox runs its worker.
struct sandbox_options {
  /// The shared library the worker dlopens (its entry points: sandbox_entry.hpp): a path, or a
  /// bare name ("libvendor.so") that the worker's dlopen looks for on its search path.
  std::filesystem::path library{};
  /// The worker executable; empty: sandbox::default_worker().
  std::filesystem::path worker{};
  /// Name for messages; empty: the library's file name.
  std::string name{};
  /// The longest a call may take before the worker is killed.
  std::chrono::milliseconds call_timeout{30'000};
  /// The longest a worker may take to start (load the library, initialise CUDA).
  std::chrono::milliseconds start_timeout{60'000};
  /// The CUDA device the worker uses.
  int device = 0;
  /// Initialise CUDA in the worker before it reports ready (cuInit, the device's primary context
  /// retained and current), so that a restart includes that cost and the first call does not
  /// pay it. Off for libraries that need no GPU; a worker without CUDA still runs CPU entries
  /// (and a reset there is not told apart: no primary context is watched).
  bool initialize_cuda = true;
  /// Workers serving calls in parallel (1 to max_workers). Each is a process with its own CUDA
  /// context (hundreds of MiB of device memory each).
  std::size_t workers = 1;
  /// Spare workers kept ready to replace a failed one at once (see the top of this file); 0: a
  /// failed worker is replaced by a fresh start before the failing call throws. At most
  /// max_standby.
  std::size_t standby = 1;
  /// Sanity caps: start() refuses more, rather than spawning processes without end.
  static constexpr std::size_t max_workers = 256;
  static constexpr std::size_t max_standby = 64;
  /// The worker's environment.
  sandbox_environment environment = {};
  /// What start() does under MPS, where a worker's fatal fault reaches every client on the GPU,
  /// the host included (mps_policy.hpp): warn (the default), refuse (mps_active_error) or allow.
  /// Looked at only when initialize_cuda is set: a worker without CUDA is no MPS client.
  mps_policy mps = mps_policy::warn;
};

/// What a sandbox's workers are doing, and what happened to them so far.
struct sandbox_stats {
  std::size_t workers = 0;          ///< workers running that serve calls (idle or in a call)
  std::size_t busy = 0;             ///< of them, in a call now
  std::size_t spares_ready = 0;     ///< standby workers ready to take over
  std::size_t spares_starting = 0;  ///< standby workers being started in the background
  std::size_t failures = 0;         ///< calls that ended their worker
  std::size_t failovers = 0;        ///< failed workers replaced by a ready spare
  std::size_t restarts = 0;         ///< workers started in a caller's path (no spare; restart())
  std::size_t spares_started = 0;   ///< spares that became ready
  std::size_t spare_start_failures = 0;  ///< spares that could not be started (retried later)
  std::vector<pid_t> worker_pids{};      ///< the serving workers, by slot (0: none there now)
  std::vector<pid_t> spare_pids{};       ///< the ready spares, the next to take over first
};

/// What an entry point returned.
struct sandbox_reply {
  int status = 0;                  ///< the entry's return value
  std::vector<std::byte> bytes{};  ///< what it wrote to args->reply
};

class sandbox_share;

/// A call's inputs.
struct sandbox_request {
  /// Bytes handed to the entry as args->request.
  std::span<const std::byte> bytes = {};
  /// Shared buffers, handed to the entry as args->buffers in this order.
  std::vector<std::reference_wrapper<const sandbox_share>> buffers = {};
  /// Room for the entry's reply; at most 64 MiB - 64 bytes (the entry name and the request
  /// bytes together at most 64 MiB - 4 KiB): sandbox::call refuses more (errc::precondition)
  /// without disturbing the worker.
  std::size_t reply_capacity = std::size_t{64} * 1024;
  /// Overrides sandbox_options::call_timeout when non-zero.
  std::chrono::milliseconds timeout{0};
};

namespace sandbox_internal {
struct sandbox_state;  // what a sandbox and its shares hold (src/isolation/sandbox_state.hpp)
}  // namespace sandbox_internal

/// A library running in worker processes, each replaced after a failure. Move-only.
class sandbox {
 public:
  /// Starts the workers and waits until each has loaded the library; the spares start in the
  /// background (wait_for_standby waits for them).
  /// @throws sandbox_error (start_failed) naming the worker, the library and the reason;
  ///         error (errc::precondition) for workers = 0.
  [[nodiscard]] static sandbox start(sandbox_options options);

  /// The worker executable to use when sandbox_options::worker is empty:
  /// locate(helper_file::sandbox_worker) (cubridge/core/installation.hpp):
  /// $CUBRIDGE_SANDBOX_WORKER, else beside cubridge's code or in its install tree's libexec,
  /// wherever that tree was moved.
  [[nodiscard]] static std::filesystem::path default_worker();
  /// The reset guard to preload when sandbox_environment::reset_guard_library is empty:
  /// locate(helper_file::reset_guard): $CUBRIDGE_RESET_GUARD, else beside cubridge's code or in
  /// its install tree's lib.
  [[nodiscard]] static std::filesystem::path default_reset_guard();

  sandbox(sandbox&&) noexcept;
  sandbox& operator=(sandbox&&) noexcept;
  sandbox(const sandbox&) = delete;
  sandbox& operator=(const sandbox&) = delete;
  /// Stops the background thread (a spare being started is killed) and joins it, closes every
  /// worker's socket (they exit), killing those that do not exit promptly, and reaps them all.
  /// No call may be running.
  ~sandbox();

  /// Calls `entry` in a free worker, waiting while all are busy. Starts a worker first where a
  /// failed restart left a slot empty (a ready spare is taken instead where there is one).
  /// @throws sandbox_error naming the reason; the failed worker was replaced where it had to be.
  sandbox_reply call(std::string_view entry, const sandbox_request& request = {});

  /// Shares `memory` (allocated with memory_export::posix_fd) with every worker: mapped at once in
  /// each idle worker and ready spare, in each spare as it starts, in a worker busy now (or
  /// restarted later) on its first call that uses it; unmapped when the share ends. `memory`
  /// must outlive the share.
  /// @throws error (errc::precondition) if it is not exportable; error if the driver cannot
  ///         export it.
  [[nodiscard]] sandbox_share share(const shared_device_memory& memory);

  /// Waits until no call runs, ends every worker and spare, and starts fresh serving workers
  /// (in this call) and spares (in the background). @throws sandbox_error (start_failed)
  void restart();

  /// Waits up to `timeout` until sandbox_options::standby spares are ready; true if they are.
  bool wait_for_standby(std::chrono::milliseconds timeout) const;

  /// The process id of the worker in the first slot (with workers = 1: the worker; 0 while none
  /// runs there). stats() lists every worker and spare.
  [[nodiscard]] pid_t worker_pid() const noexcept;
  /// How often a worker was replaced: by a spare or a fresh start after a failure, by restart().
  [[nodiscard]] std::size_t restarts() const noexcept;
  /// How long the latest worker (serving or spare) took to start (spawn to ready).
  [[nodiscard]] std::chrono::nanoseconds last_start_duration() const noexcept;
  /// What the latest worker said about CUDA at start: empty when initialised (or not asked for).
  [[nodiscard]] std::string worker_cuda_status() const;
  [[nodiscard]] const std::string& name() const noexcept;
  [[nodiscard]] sandbox_stats stats() const;

 private:
  using state = sandbox_internal::sandbox_state;
  explicit sandbox(std::shared_ptr<state> s) noexcept;
  std::shared_ptr<state> state_;
};

/// A buffer shared with a sandbox's workers, for as long as this object lives. Move-only.
class sandbox_share {
 public:
  sandbox_share(sandbox_share&&) noexcept;
  sandbox_share& operator=(sandbox_share&&) noexcept;
  sandbox_share(const sandbox_share&) = delete;
  sandbox_share& operator=(const sandbox_share&) = delete;
  /// Unmaps the buffer in the workers (a busy one: when its call ends). Never throws.
  ~sandbox_share();

  [[nodiscard]] std::uint64_t id() const noexcept { return id_; }
  [[nodiscard]] CUdeviceptr host_address() const noexcept { return host_address_; }
  [[nodiscard]] std::size_t size_bytes() const noexcept { return size_; }

 private:
  friend class sandbox;
  sandbox_share(std::shared_ptr<sandbox_internal::sandbox_state> s, std::uint64_t id,
                CUdeviceptr address, std::size_t size) noexcept
      : state_(std::move(s)), id_(id), host_address_(address), size_(size) {}
  void reset() noexcept;
  std::shared_ptr<sandbox_internal::sandbox_state> state_;
  std::uint64_t id_ = 0;
  CUdeviceptr host_address_ = 0;
  std::size_t size_ = 0;
};

}  // namespace cubridge
