#pragma once
// One probation of a staged version (swap/probation.hpp): the sampling of the serving version's
// launches, their snapshots into memory shared with a sandbox worker, the worker's runs on a
// thread of its own, and the verdict. hot_kernel::launch calls mirror() for a launch while a
// probation is armed; hot_module::stage waits for the verdict. Internal to the swap layer.

#include <cubridge/core/context_ref.hpp>
#include <cubridge/core/event.hpp>
#include <cubridge/core/kernel.hpp>
#include <cubridge/core/launch_config.hpp>
#include <cubridge/core/shared_device_memory.hpp>
#include <cubridge/core/stream.hpp>
#include <cubridge/isolation/sandbox.hpp>
#include <cubridge/swap/detail/probation_protocol.hpp>
#include <cubridge/swap/probation.hpp>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace cubridge::swap_internal {

/// A mirrored launch, snapshotted and waiting for the worker.
struct mirrored_launch {
  std::uint32_t kernel = 0;        // interface index
  std::vector<std::byte> request;  // run_header, name, arguments, allocations, pointers
  std::vector<std::uint32_t> pointer_parameters;  // per allocation: the first parameter into it
  /// The session's copied_ event: complete once the snapshot copies are (one launch is in
  /// flight at a time, so one event serves them all).
  event_ref copied;
};

class probation_session {
 public:
  /// Starts the worker (a sandbox with one worker and one spare) and loads both images in it.
  /// @throws sandbox_error if the worker cannot start; error for the shared buffer.
  probation_session(context_arg ctx, std::string module, std::vector<std::string> kernel_names,
                    std::span<const std::byte> serving_image,
                    std::span<const std::byte> candidate_image, probation_policy policy);
  probation_session(const probation_session&) = delete;
  probation_session& operator=(const probation_session&) = delete;
  /// Stops the runner thread (a run in progress finishes) and the worker.
  ~probation_session();

  /// Called on the launch path before the serving launch of `k` (interface index `index`) with
  /// its packed arguments, for a launch the rate sampled (hot_kernel::sampled): snapshots its
  /// inputs on a side stream that the launch's stream then waits for. Never throws: a launch that
  /// cannot be mirrored is counted as such and runs as it would have.
  void mirror(std::uint32_t index, const kernel& k, const launch_config& config,
              void** arguments) noexcept;

  /// Runs the policy's replays, one after another, in the worker (before any launch is
  /// mirrored), with `kernels` the serving version's (for their parameter layouts). Returns
  /// false once one failed (the verdict is set); true when all passed (and, with
  /// required_launches 0, the verdict is passed).
  bool replay(std::span<const kernel> kernels);

  /// Blocks until the verdict (or the policy's deadline) and returns what was seen.
  probation_result wait();

 private:
  /// Whether this sampled launch can be mirrored now (one in flight at most).
  bool sampled() noexcept;
  /// The snapshot of a sampled launch; nullopt (with the reason counted) if not mirrorable.
  std::optional<mirrored_launch> snapshot(std::uint32_t index, const kernel& k,
                                          const launch_config& config, void** arguments);
  /// The runner thread: each mirrored launch through the worker, until a verdict.
  void run();
  /// One mirrored launch (replay 0) or replay `replay` in the worker; sets the verdict on a
  /// fault or mismatch.
  void judge(mirrored_launch& launch, std::uint32_t replay = 0);
  /// The serving version's run of `launch` (`which` names it); false when it did not run
  /// (counted, or for a replay the verdict set).
  bool serving_ran(const mirrored_launch& launch, const std::string& which, std::uint32_t replay);
  /// Sets a fault's or a mismatch's verdict with what names the launch.
  void refuse(probation_verdict verdict, const mirrored_launch& launch, std::uint32_t number,
              std::uint32_t replay, const detail::probation_protocol::run_reply& reply,
              std::string detail);
  /// The request for a launch of `name` (compared by `check`, or the policy's default) with the
  /// packed arguments `packed`, its allocations in the snapshot buffer and its pointer arguments.
  std::vector<std::byte> request_of(
      const std::string& name, const launch_config& config, const kernel_check* check,
      std::span<const std::byte> packed,
      std::span<const detail::probation_protocol::allocation> allocations,
      std::span<const detail::probation_protocol::pointer_argument> pointers) const;
  /// Calls `entry`, loading the images again first if a fresh worker took over.
  sandbox_reply call(const char* entry, std::span<const std::byte> request);
  void load();
  void decide(probation_verdict verdict, std::string detail);
  void not_mirrorable(std::string why) noexcept;

  context_arg ctx_;
  std::string module_;
  std::vector<std::string> kernel_names_;
  std::vector<std::byte> serving_image_;
  std::vector<std::byte> candidate_image_;
  probation_policy policy_;
  std::uint64_t session_id_;
  std::chrono::steady_clock::time_point started_{};  // set once the worker is ready

  shared_device_memory snapshot_;
  sandbox worker_;
  sandbox_share share_;
  stream side_;
  // Made once: a sampled launch records them instead of creating events in the serving path.
  event ready_;
  event copied_;

  std::atomic<bool> in_flight_{false};  // one snapshot at a time: the buffer is one
  std::atomic<bool> decided_{false};

  std::mutex mutex_;  // guards what follows
  std::condition_variable changed_;
  std::deque<mirrored_launch> queue_;
  probation_result result_;
  bool stopping_ = false;

  std::thread runner_;  // last: starts once everything above exists
};

}  // namespace cubridge::swap_internal
