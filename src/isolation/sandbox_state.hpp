#pragma once
// What a sandbox and its shares hold: the options, the serving workers (one slot each), the
// spares, the workers being reaped, the shared buffers and the counters, behind one mutex; the
// background thread that starts spares and reaps (sandbox_pool.cpp); and the calls, with the
// replacement of a worker after each failure (sandbox_call.cpp). Internal to cubridge_isolation.

#include "sandbox_worker_process.hpp"

#include <cubridge/core/unique_fd.hpp>
#include <cubridge/isolation/detail/sandbox_protocol.hpp>
#include <cubridge/isolation/sandbox.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace cubridge {

namespace sandbox_internal {

/// A worker of a sandbox, serving or spare, and what the host knows of it.
struct worker {
  worker_process process;
  std::set<std::uint64_t> mapped;  ///< the shares it said it mapped
  std::set<std::uint64_t> sent;    ///< the shares whose fd went to it (it may have them mapped)
  std::chrono::nanoseconds start_duration{0};
  std::string cuda_status;
};

/// "sandbox::call(\"entry\")".
inline std::string call_name(const std::string& entry) {
  return "sandbox::call(\"" + entry + "\")";
}

/// A buffer shared with the workers: exported once; SCM_RIGHTS sends a duplicate to each.
struct shared_buffer {
  unique_fd fd;
  std::uint64_t size = 0;
  CUdeviceptr host_address = 0;
  int device = 0;
};
using shared_buffers = std::vector<std::pair<std::uint64_t, std::shared_ptr<const shared_buffer>>>;

/// How a failed worker was replaced, for the error.
struct replacement {
  sandbox_recovery how = sandbox_recovery::none;
  std::chrono::nanoseconds duration{0};
  std::string note;  ///< "; standby worker pid 9 serves the next call" or why none could start
};

}  // namespace sandbox_internal

struct sandbox_internal::sandbox_state {
  explicit sandbox_state(sandbox_options o) : options(std::move(o)) {}
  sandbox_state(const sandbox_state&) = delete;
  sandbox_state& operator=(const sandbox_state&) = delete;
  ~sandbox_state() { shutdown(); }

  using worker = sandbox_internal::worker;
  using clock_type = std::chrono::steady_clock;
  /// A serving worker's place. busy: a call (or a restart) holds it; w may then be empty while
  /// it is being filled.
  struct slot {
    std::unique_ptr<worker> w;
    bool busy = false;
  };

  sandbox_options options;
  std::string name;
  std::filesystem::path worker_path;
  std::vector<std::string> worker_environment;  // chosen once, at start

  mutable std::mutex mutex;                 // guards everything below
  std::condition_variable slot_freed;       // a slot became free (or empty to fill)
  std::condition_variable background_wake;  // work for the background thread
  mutable std::condition_variable spares_changed;
  std::vector<slot> slots;
  std::vector<std::unique_ptr<worker>> spares;  // ready; the front one takes over first
  std::size_t spares_starting = 0;
  std::vector<std::unique_ptr<worker>> retired;  // killed, to be reaped in the background
  std::map<std::uint64_t, std::shared_ptr<const sandbox_internal::shared_buffer>> shares;
  std::uint64_t next_share_id = 1;
  sandbox_stats counters;  // the counting fields; the rest is filled in by stats()
  std::chrono::nanoseconds last_start{0};
  std::string cuda_status;
  bool stopping = false;
  bool shut_down = false;
  bool reaps_in_background = false;  // a background thread runs (standby > 0)
  unique_fd cancel;                  // an eventfd, readable once stopping: gives up a spare's start
  std::thread background;

  /// "sandbox 'name' (library L, worker pid P)".
  [[nodiscard]] std::string who(pid_t pid) const;

  // --- the pool (sandbox_pool.cpp) ---
  /// Starts the serving workers, then the background thread where spares are wanted.
  /// @throws sandbox_error (start_failed)
  void start_pool();
  /// Starts one worker; nullptr and `failure` set if it could not. Takes no lock.
  std::unique_ptr<worker> start_worker(std::string& failure, int cancel_fd = -1);
  /// Takes a free slot, filling an empty one (spare or fresh start) if that is all there is;
  /// waits while every slot is busy. @throws sandbox_error (start_failed) if a fill failed.
  std::size_t acquire(const std::string& entry);
  /// Gives a slot back after a call that left its worker fit: unmaps what was unshared meanwhile.
  void release(std::size_t index) noexcept;
  /// Gives a slot back whose worker's state is unknown (an unexpected exception): it is retired.
  void abandon(std::size_t index) noexcept;
  /// Retires the failed worker of slot `index` and fills the slot (spare, else a fresh start);
  /// the slot is given back. `seen`: when the failure was seen.
  sandbox_internal::replacement replace(std::size_t index, clock_type::time_point seen);
  /// See sandbox::restart. Returns "" or why a worker could not start, and how long it took.
  std::pair<std::string, std::chrono::nanoseconds> restart_all();
  /// Maps the new share `id` in every idle serving worker and every ready spare (a busy worker
  /// maps it on its next call that uses it). Lock held.
  void map_ahead(std::uint64_t id, std::unique_lock<std::mutex>& lock);
  /// Ends a share: unmapped in the idle workers that have it, forgotten here. Never throws.
  void unshare(std::uint64_t id) noexcept;
  bool wait_for_standby(std::chrono::milliseconds timeout) const;
  [[nodiscard]] sandbox_stats stats() const;
  /// Stops the background thread and ends every worker. Idempotent; never throws.
  void shutdown() noexcept;

  // --- calls (sandbox_call.cpp) ---
  /// Runs `entry` in a free worker; see sandbox::call.
  sandbox_reply call(std::string_view entry, const sandbox_request& request);

 private:
  void background_loop() noexcept;
  /// Starts one spare and makes it ready; false if it could not be started. Lock held.
  bool start_spare(std::unique_lock<std::mutex>& lock);
  /// Fills the empty slot `index` (held busy) with a spare or a fresh start.
  /// @throws sandbox_error (start_failed), the slot given back
  void fill(std::size_t index, std::unique_lock<std::mutex>& lock, const std::string& entry);
  /// Maps on `w` the shares whose fd it has not had yet, until none is left; false if `w` died.
  bool map_missing(worker& w, std::unique_lock<std::mutex>& lock, int cancel_fd);
  /// Kills `w` and reaps it: in the background where there is a background thread, else here
  /// (the lock is let go meanwhile).
  void dispose(std::unique_ptr<worker> w, std::unique_lock<std::mutex>& lock) noexcept;
  /// The first ready spare that is still alive (dead ones disposed of), or nullptr.
  std::unique_ptr<worker> take_spare(std::unique_lock<std::mutex>& lock);
  /// Sends unshare for what `w` has mapped and is no longer shared. Lock held.
  void forget_unshared(worker& w) noexcept;
  /// Notes a started worker's start time and CUDA status. Lock held.
  void note_started(const worker& w);
};

namespace sandbox_internal {
/// Sends a map message for `buffers` to `w` and waits (up to `timeout`, or until `cancel_fd` is
/// readable) for the answer: what was mapped goes into w.mapped, every buffer into w.sent.
/// Returns false if the worker died or misbehaved (it must then be retired). No lock needed.
bool map_buffers(worker& w, const shared_buffers& buffers, std::chrono::milliseconds timeout,
                 int cancel_fd) noexcept;
}  // namespace sandbox_internal

}  // namespace cubridge
