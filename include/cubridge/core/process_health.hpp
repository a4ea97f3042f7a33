#pragma once
// Whether this process can still use the GPU. A sticky CUDA error (an illegal address, a
// hardware exception in a kernel) poisons every context of the process for good (FACTS.md,
// "Faults are process-wide"): every later call fails the same way and only a new process
// recovers. The first such error that any cubridge call sees marks the process poisoned, once;
// the readiness probe of the update endpoint, its metrics and the fleet agent's heartbeat read
// it from here, so that a broken node says so from its next answer on.

#include <cubridge/core/context_ref.hpp>

#include <cuda.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cubridge {

/// Whether `result` is a sticky error: the context that returned it (and, for a fault, every
/// context of the process) fails every later call with it. An illegal address or instruction, a
/// misaligned address, an invalid PC or address space, a hardware stack error, a launch
/// failure, an uncorrectable ECC error. Not CUDA_ERROR_CONTEXT_IS_DESTROYED: a reset context
/// (cudaDeviceReset) is the reset guard's matter, and a new context works.
[[nodiscard]] bool is_sticky_error(CUresult result) noexcept;

/// A version of a hot module that was serving, or had work in flight, when the process was
/// poisoned: the suspects.
struct running_version {
  std::string module{};
  std::uint64_t label = 0;       ///< the version's label (bundle version), 0 if none
  std::uint64_t version_id = 0;  ///< its id in the module's chain
  /// The kernel whose launch returned the error, when a launch did; empty otherwise.
  std::string kernel{};
};

/// What poisoned the process: the first sticky error a cubridge call saw.
struct poison_record {
  CUresult error = CUDA_SUCCESS;
  std::string error_name{};  ///< "CUDA_ERROR_ILLEGAL_ADDRESS"
  std::string call{};        ///< the call that saw it ("cuStreamSynchronize", "health probe")
  /// The hot modules' versions that were serving then (from the swap layer; empty without hot
  /// modules). The first names the kernel when a hot launch saw the error.
  std::vector<running_version> running{};
  std::chrono::system_clock::time_point at{};       ///< when it was seen (wall clock, for logs)
  std::chrono::steady_clock::time_point seen_at{};  ///< the same moment, for durations
};

/// One line: "poisoned by CUDA_ERROR_ILLEGAL_ADDRESS seen by cuStreamSynchronize at
/// 2026-12-06T06:41:34Z; serving: filters v3 (id 4) kernel 'scale'".
[[nodiscard]] std::string describe(const poison_record& record);

/// The record of what poisoned this process; nullopt while it is healthy. Thread-safe.
[[nodiscard]] std::optional<poison_record> process_health();

/// Whether this process is poisoned: one atomic load, for per-request checks.
[[nodiscard]] bool process_poisoned() noexcept;

/// Marks the process poisoned if `result` is a sticky error (the first one is kept; later ones
/// change nothing). cubridge's own checks call it on every failed driver or runtime call; call it
/// for errors your own CUDA calls return. `kernel` names the kernel a failed launch ran, if
/// known. Never throws (a record that cannot be built keeps the error alone).
void note_cuda_result(CUresult result, std::string_view call,
                      std::string_view kernel = {}) noexcept;

/// Asks the driver whether `ctx` (and so the process) holds a sticky error, without waiting for
/// any work: a stream query on its legacy default stream, which returns the sticky error once
/// the context holds one. Marks the process poisoned if so. Returns process_poisoned()
/// afterwards. Never throws: a context that cannot be asked counts as healthy here.
bool probe_process_health(context_ref ctx) noexcept;

/// Called once, on the thread that marks the process poisoned, with the record (e.g. to publish
/// a last heartbeat, or to start the exit policy's timer). Listeners must not throw and must not
/// block for long. Returns an id for remove_poison_listener. A listener added after the process
/// was poisoned is called at once, on the adding thread.
std::uint64_t add_poison_listener(std::function<void(const poison_record&)> listener);
void remove_poison_listener(std::uint64_t id) noexcept;

/// Where the swap layer says which hot versions serve (poison_record::running). One provider;
/// the swap layer installs it with its first hot module. Must not throw.
using running_versions_provider = std::vector<running_version> (*)();
void set_running_versions_provider(running_versions_provider provider) noexcept;

/// The exit status of a process that exit_when_poisoned() ends: 75 (EX_TEMPFAIL, "try again
/// later"), which systemd's Restart=on-failure and Kubernetes restart, and which tells a
/// poisoned GPU apart from a crash (a signal) or a clean stop (0) in the service's logs.
inline constexpr int poisoned_exit_code = 75;

/// What a poisoned process does about itself (docs/hot-swap.md, "A node that knows it is
/// poisoned"): nothing it launches can work again, so it ends, after `grace` (time for the
/// readiness probe to answer 503 to the load balancer and the fleet agent to send its last
/// heartbeat), with `exit_code`, and its supervisor starts a fresh process.
struct poison_exit_policy {
  std::chrono::milliseconds grace{2000};
  int exit_code = poisoned_exit_code;
};

/// Installs `policy`: `policy.grace` after the process is poisoned it ends with
/// `policy.exit_code` (std::_Exit: no destructors run, as none can release GPU resources in a
/// poisoned context anyway). Returns the listener's id (remove_poison_listener cancels it
/// while the process is healthy). @throws error (errc::precondition) for a negative grace or an
/// exit code outside 1..255.
std::uint64_t exit_when_poisoned(poison_exit_policy policy = {});

namespace detail {
/// For tests in their own process: forgets the record (the driver does not forget; use only
/// with a simulated error).
void reset_process_health_for_tests() noexcept;
}  // namespace detail

}  // namespace cubridge
