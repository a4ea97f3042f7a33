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
  event copied;                                   // complete once the snapshot copies are
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
  /// its packed arguments: counts the launch and, when it is sampled, snapshots its inputs on a
  /// side stream that the launch's stream then waits for. Never throws: a launch that cannot be
  /// mirrored is counted as such and runs as it would have.
  void mirror(std::uint32_t index, const kernel& k, const launch_config& config,
              void** arguments) noexcept;

  /// Blocks until the verdict (or the policy's deadline) and returns what was seen.
  probation_result wait();

 private:
  /// Whether this launch is one to mirror (sample_every, and one in flight at most).
  bool sampled() noexcept;
  /// The snapshot of a sampled launch; nullopt (with the reason counted) if not mirrorable.
  std::optional<mirrored_launch> snapshot(std::uint32_t index, const kernel& k,
                                          const launch_config& config, void** arguments);
  /// The runner thread: each mirrored launch through the worker, until a verdict.
  void run();
  /// One mirrored launch in the worker; sets the verdict on a fault or mismatch.
  void judge(mirrored_launch& launch);
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
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();

  shared_device_memory snapshot_;
  sandbox worker_;
  sandbox_share share_;
  stream side_;

  std::atomic<std::uint64_t> launches_{0};
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
