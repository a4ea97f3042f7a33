#pragma once
// Probation: a staged version proves itself on the serving version's own live launches, in a
// sandbox worker process whose death costs nothing, before it may be promoted
// (docs/hot-swap.md, "Probation").
//
// While a version is on probation, a sample of the serving version's launches is mirrored: just
// before the serving launch runs, the whole allocation behind each pointer argument is copied
// device-to-device, on a side stream ordered after the inputs are ready, into VMM memory shared
// with the worker; the serving launch waits for those copies only. In the worker the serving
// version and the candidate each run on their own copy, pointers rebased, and every allocation
// is compared afterwards. N mirrored launches with no fault and no mismatch let the candidate
// through; one fault or one mismatch refuses it. A fault ends only the worker: a warm spare
// takes its place and the serving process never notices.
//
// What is mirrorable: a kernel whose pointer arguments point at the start or inside of a device
// allocation (found with cuMemGetAddressRange), everything else being scalars. An 8-byte
// argument whose value lies inside a device allocation is taken as a pointer to it. Not
// mirrorable, and said so (probation_result::not_mirrorable), never guessed at: pointers stored
// inside device memory (the worker's copies would still point into the serving process: declare
// such kernels with kernel_check::never_mirror), and launches whose allocations together exceed
// the byte budget.

#include <cubridge/core/error.hpp>
#include <cubridge/core/launch_config.hpp>
#include <cubridge/swap/error.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cubridge {

/// How a mirrored launch's outputs are compared between the serving version and the candidate.
enum class output_check {
  bitwise,          ///< every byte of every allocation equal (the default)
  float_tolerance,  ///< allocations read as float32: |a - b| <= absolute + relative * |a|
  fault_only,       ///< no compare: only a fault refuses (kernels that are not deterministic)
  never_mirror,     ///< not mirrorable (pointers inside device memory): never sampled
};

/// "bitwise", "float_tolerance", "fault_only", "never_mirror".
[[nodiscard]] std::string_view to_string(output_check check) noexcept;

/// A per-kernel override of probation_policy::default_check.
struct kernel_check {
  std::string kernel{};
  output_check check = output_check::bitwise;
  double absolute = 0;  ///< for float_tolerance
  double relative = 0;  ///< for float_tolerance
  /// Pointer parameters (by index) whose buffers are copied and rebased but not compared: what
  /// is meant to differ between versions (a version number the kernel writes, a timestamp).
  std::vector<std::uint32_t> ignored_parameters{};
};

/// An argument of a replayed launch: a device buffer made from `buffer`'s bytes, or a scalar.
struct replay_argument {
  /// Non-empty: the argument is a pointer to a fresh device buffer holding these bytes (one copy
  /// for each version's run; what both wrote is compared).
  std::vector<std::byte> buffer{};
  /// Otherwise the argument's own bytes, as the kernel's parameter takes them.
  std::vector<std::byte> scalar{};

  /// A buffer holding `values`.
  template <class T>
  [[nodiscard]] static replay_argument buffer_of(std::span<const T> values) {
    const auto bytes = std::as_bytes(values);
    return {{bytes.begin(), bytes.end()}, {}};
  }
  /// A scalar (an int, a float, a struct passed by value).
  template <class T>
  [[nodiscard]] static replay_argument scalar_of(const T& value) {
    const auto* p = reinterpret_cast<const std::byte*>(&value);
    return {{}, {p, p + sizeof(T)}};
  }
};

/// A launch whose inputs the user builds: run in the probation worker on the serving version and
/// on the candidate, then compared as a mirrored launch is. The smoke test that never runs in the
/// serving process, and the way to probe kernels that are not mirrorable.
struct replay_launch {
  std::string kernel{};
  dims grid{};
  dims block{};
  unsigned dynamic_shared_bytes = 0;
  std::vector<replay_argument> arguments{};
};

/// The numbers of a probation (stage_options::probation).
struct probation_policy {
  /// Launches built by the user, each run in the worker before any mirrored launch; each must
  /// pass. With required_launches 0 they are the whole probation: a smoke test in the sandbox.
  std::vector<replay_launch> replays{};
  /// Mirrored launches that must pass (no fault, no mismatch) before the version is let through;
  /// 0 with replays: none (the replays decide).
  std::uint32_t required_launches = 16;
  /// Mirror one launch in every `sample_every` (1: every launch; 100: 1%). The first launch
  /// after probation starts is always mirrored.
  std::uint32_t sample_every = 100;
  /// The most bytes of allocations one mirrored launch may copy; a launch over it is not
  /// mirrorable (counted, skipped).
  std::size_t max_snapshot_bytes = std::size_t{64} << 20;
  /// How long the probation may wait for its launches: fewer than required_launches passed by
  /// then refuses the version (probation_verdict::incomplete): missing evidence is not a pass.
  std::chrono::milliseconds deadline{60'000};
  /// The longest one mirrored run in the worker may take before the worker is killed (a
  /// candidate that hangs is refused as faulted).
  std::chrono::milliseconds run_timeout{10'000};
  output_check default_check = output_check::bitwise;
  std::vector<kernel_check> checks{};
  /// The sandbox worker executable; empty: sandbox::default_worker().
  std::filesystem::path worker{};
  /// The probation entry library; empty: locate(helper_file::probation_entry).
  std::filesystem::path entry_library{};
};

/// How a probation ended.
enum class probation_verdict {
  passed,      ///< required_launches mirrored launches matched
  faulted,     ///< the candidate faulted (or hung) in the worker
  mismatch,    ///< the candidate's outputs differed from the serving version's
  incomplete,  ///< too few launches could be mirrored before the deadline
};

/// "passed", "faulted_in_probation", "mismatch_in_probation", "probation_incomplete" (the
/// gate's reasons for the last three).
[[nodiscard]] std::string_view to_string(probation_verdict verdict) noexcept;

/// What a probation saw.
struct probation_result {
  probation_verdict verdict = probation_verdict::incomplete;
  std::uint32_t passed = 0;          ///< mirrored launches that matched
  std::uint64_t launches_seen = 0;   ///< serving launches during the probation
  std::uint32_t not_mirrorable = 0;  ///< sampled launches that could not be mirrored
  /// Runs the serving version itself faulted in the worker: inconclusive, not held against the
  /// candidate (and a sign that the serving version's inputs can fault it).
  std::uint32_t serving_faulted = 0;
  /// Replays that passed.
  std::uint32_t replays_passed = 0;
  /// For faulted and mismatch: the kernel and the mirrored launch (1-based) that failed; for a
  /// replay, launch is 0 and `replay` names it (1-based).
  std::string kernel{};
  std::uint32_t launch = 0;
  std::uint32_t replay = 0;
  /// For mismatch: which pointer argument's allocation differed (its parameter index) and the
  /// first differing byte offset in it.
  std::uint32_t parameter = 0;
  std::uint64_t offset = 0;
  /// One line: what happened, with the worker's words for a fault and the reason launches were
  /// not mirrorable.
  std::string detail{};
  std::chrono::nanoseconds duration{0};
};

/// Thrown by hot_module::stage when a version fails its probation: nothing was promoted and the
/// serving version serves on. A version_rejected_error, so callers that refuse on rejection
/// need nothing new.
class probation_error : public version_rejected_error {
 public:
  probation_error(std::string involved, probation_result result,
                  std::source_location where = std::source_location::current())
      : version_rejected_error("hot_module::stage", std::move(involved), where),
        result_(std::move(result)) {}
  [[nodiscard]] const probation_result& result() const noexcept { return result_; }

 private:
  probation_result result_;
};

}  // namespace cubridge
