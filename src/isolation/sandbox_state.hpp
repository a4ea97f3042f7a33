#pragma once
// What a sandbox and its shares hold: the options, the worker, the shared buffers and the
// counters, behind one mutex; and the calls, with the restart after each failure
// (sandbox_call.cpp). Internal to cubridge_isolation.

#include "sandbox_worker_process.hpp"

#include <cubridge/core/unique_fd.hpp>
#include <cubridge/isolation/detail/sandbox_protocol.hpp>
#include <cubridge/isolation/sandbox.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace cubridge {

struct sandbox::state {
  explicit state(sandbox_options o) : options(std::move(o)) {}

  struct shared_buffer {
    unique_fd fd;  // exported once; SCM_RIGHTS sends a duplicate to each worker
    std::uint64_t size = 0;
    CUdeviceptr host_address = 0;
    int device = 0;
    std::uint64_t mapped_generation = 0;  // the worker generation that has it mapped (0: none)
  };

  sandbox_options options;
  std::string name;
  std::filesystem::path worker_path;
  mutable std::mutex mutex;  // one call at a time; guards everything below
  sandbox_internal::worker_process worker;
  std::uint64_t generation = 0;  // counts workers started
  std::size_t restarts = 0;
  std::chrono::nanoseconds last_start{0};
  std::string cuda_status;
  std::map<std::uint64_t, shared_buffer> shares;
  std::uint64_t next_share_id = 1;

  /// "sandbox 'name' (library L, worker pid P)".
  [[nodiscard]] std::string who() const;

  /// Starts a worker (the old one must be gone). Returns an empty string or why it failed.
  std::string start_worker();

  struct restart_outcome {
    std::string failure;  ///< empty when the fresh worker is ready
    std::chrono::nanoseconds duration;
  };
  /// Ends the worker if it still runs (SIGKILL) and starts a fresh one.
  restart_outcome restart();

  /// Runs `entry` in the worker (started first if none runs); see sandbox::call.
  sandbox_reply call(std::string_view entry, const sandbox_request& request);

  /// Ends a share: unmapped in the worker if it has it, forgotten here. Never throws.
  void unshare(std::uint64_t id) noexcept;

 private:
  void ensure_worker(const std::string& entry);
  /// Sends the call; returns the ids of the buffers whose fds went with it.
  std::vector<std::uint64_t> send_call(const std::string& entry, const sandbox_request& request);
  detail::sandbox_protocol::frame receive_reply(const std::string& entry,
                                                std::chrono::milliseconds timeout);
  sandbox_reply handle_reply(const std::string& entry, const detail::sandbox_protocol::frame& f,
                             const std::vector<std::uint64_t>& sent_ids);
  /// Reports a failed call: the worker (killed here if it still runs) is replaced first.
  [[noreturn]] void fail(sandbox_failure reason, const std::string& entry,
                         const std::string& detail);
  /// The worker ended (EOF or failed send): reap it and say how.
  [[noreturn]] void worker_died(const std::string& entry);
};

}  // namespace cubridge
