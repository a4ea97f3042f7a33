#pragma once
// What a probation host (src/swap/probation_session.cpp) and the probation entry library in its
// sandbox worker (tools/probation_entry) say to each other, inside sandbox calls
// (isolation/sandbox.hpp). Fixed-size little-endian records on one machine; the worker checks
// every length against the request's size before it reads, so a short request is refused
// (status bad_request), never read past.
//
// A mirrored launch is two calls, so that a fault names its culprit: run_serving (the serving
// version on its copy; kept in the worker) then run_candidate (the candidate on a fresh copy,
// then both compared). The worker dies of a fault in either; which call it was says whose.

#include <cstdint>

namespace cubridge::detail::probation_protocol {

inline constexpr const char* load_entry = "cubridge_probation_load";
inline constexpr const char* run_serving_entry = "cubridge_probation_run_serving";
inline constexpr const char* run_candidate_entry = "cubridge_probation_run_candidate";

/// What an entry returns (sandbox_reply::status).
enum status : int {
  ok = 0,
  not_loaded = 3,   ///< a fresh worker (a spare took over): send load again
  bad_request = 4,  ///< lengths inconsistent, unknown kernel
  cuda_failed = 5,  ///< a CUDA call failed without poisoning the worker (out of memory, ...)
};

/// load: the header, then the serving image's bytes, then the candidate's.
struct load_header {
  std::uint64_t session = 0;
  std::uint64_t serving_bytes = 0;
  std::uint64_t candidate_bytes = 0;
};

/// One allocation of a mirrored launch: where its snapshot is in the shared buffer, its size,
/// and its address in the serving process (what pointer arguments are rebased from).
struct allocation {
  std::uint64_t snapshot_offset = 0;
  std::uint64_t size = 0;
  std::uint64_t base = 0;
  std::uint32_t compared = 1;  ///< 0: reached only through ignored parameters, not compared
  std::uint32_t reserved = 0;
};

/// A pointer argument: at `param_offset` in the argument bytes, pointing `offset` bytes into
/// allocation `allocation`.
struct pointer_argument {
  std::uint32_t param_offset = 0;
  std::uint32_t parameter = 0;
  std::uint32_t allocation = 0;
  std::uint32_t reserved = 0;
  std::uint64_t offset = 0;
};

/// run_serving and run_candidate: the header, the kernel's name, the argument bytes (as the
/// kernel's parameter layout packs them), the allocations, the pointer arguments.
struct run_header {
  std::uint64_t session = 0;
  std::uint32_t name_bytes = 0;
  std::uint32_t param_bytes = 0;
  std::uint32_t allocations = 0;
  std::uint32_t pointers = 0;
  std::uint32_t grid[3] = {1, 1, 1};
  std::uint32_t block[3] = {1, 1, 1};
  std::uint32_t shared_bytes = 0;
  std::uint32_t check = 0;  ///< output_check
  double absolute = 0;
  double relative = 0;
};

/// run_candidate's reply.
struct run_reply {
  std::uint32_t differs = 0;     ///< 1: an allocation differs
  std::uint32_t allocation = 0;  ///< which
  std::uint64_t offset = 0;      ///< its first differing byte
};

}  // namespace cubridge::detail::probation_protocol
