#pragma once
// The GPU-free half of the swap-under-load harness (swap_under_load.cpp): percentiles, the GPU
// idle-gap analysis of a kernel timeline, the must-be-zero checks on a phase's launch log, the
// mapping between the host's steady clock and the GPU's %globaltimer, the verdict and the table.
// Unit-tested without a GPU in tests/test_swap_stats.cpp.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace hotswap {

inline constexpr double not_a_number = std::numeric_limits<double>::quiet_NaN();

// ---------------------------------------------------------------------------------------------
// Percentiles

/// The p-th percentile (p in [0, 100]) of values sorted ascending, by linear interpolation
/// between the closest ranks (Hyndman & Fan type 7, NumPy's default "linear"):
///   rank = p / 100 * (n - 1);  value = v[floor(rank)] + frac(rank) * (v[floor(rank) + 1] -
///   v[floor(rank)])
/// so p0 is the minimum, p100 the maximum, p50 of an even count the mean of the middle two.
/// NaN for no values; p is clamped to [0, 100].
[[nodiscard]] double percentile_sorted(std::span<const double> sorted, double p);

/// Distribution of one quantity. Every field is NaN when count is 0.
struct summary {
  std::size_t count = 0;
  double min = not_a_number;
  double p50 = not_a_number;
  double p99 = not_a_number;
  double max = not_a_number;
  double mean = not_a_number;
};

/// Sorts `values` and summarises them (percentiles as percentile_sorted).
[[nodiscard]] summary summarize(std::vector<double> values);

// ---------------------------------------------------------------------------------------------
// What the serving kernel writes, and what the host notes per launch

/// One slot of the device log, exactly as serve_kernel.cu writes it: the kernel's compiled
/// VERSION (the image's tag, never 0) and %globaltimer at its start and end. A slot the
/// kernel never wrote stays all zero (the log is cleared before each phase).
struct gpu_record {
  std::uint64_t tag = 0;
  std::uint64_t start_ns = 0;
  std::uint64_t end_ns = 0;
};
static_assert(sizeof(gpu_record) == 24, "must match struct record in serve_kernel.cu");

/// One launch as a serving thread saw it (host steady_clock nanoseconds).
struct launch_entry {
  std::uint64_t slot = 0;         ///< its slot in the device log
  std::uint64_t returned_id = 0;  ///< version id launch() returned (0 if it threw)
  std::uint64_t promoted_before =
      0;  ///< id of the last promote that had returned before the launch began
  std::int64_t host_start_ns = 0;  ///< steady_clock just before the launch call
  std::int64_t host_end_ns = 0;    ///< steady_clock just after it returned (or threw)
  std::int64_t host_done_ns = 0;   ///< when the host saw its work complete (0: not observed)
  std::uint32_t thread = 0;
  bool failed = false;  ///< the launch call threw (or the driver refused it)
};

// ---------------------------------------------------------------------------------------------
// GPU idle gaps

/// A kernel's [start, end] on the GPU timeline (%globaltimer ns).
struct kernel_span {
  std::uint64_t start_ns = 0;
  std::uint64_t end_ns = 0;
};

/// The GPU's idle time between kernels of all streams.
/// Kernels are sorted by start; walking them in that order with `covered` = the latest end seen
/// so far, each kernel after the first contributes one gap value max(0, start - covered). Kernels
/// of several streams that overlap give 0; a hole in the timeline gives exactly its length, also
/// when a long kernel covers shorter ones (the gap is measured from the latest end, not from the
/// previous kernel's end). Values include the zeros, so with many streams p50 is typically 0.
struct gap_report {
  std::vector<double> gaps_ns;     ///< one per kernel after the first, >= 0
  std::vector<kernel_span> holes;  ///< the positive gaps: [covered, next start]
  double idle_ns = 0;              ///< sum of the holes
  double span_ns = 0;              ///< first start to latest end
};
[[nodiscard]] gap_report analyze_gaps(std::vector<kernel_span> kernels);

// ---------------------------------------------------------------------------------------------
// Host steady clock <-> GPU %globaltimer

/// One calibration: the GPU read %globaltimer (gpu_ns) somewhere between two host reads; host_ns
/// is their midpoint and uncertainty_ns half their distance, so |true host time - host_ns| <=
/// uncertainty_ns.
struct clock_sample {
  std::int64_t host_ns = 0;
  std::uint64_t gpu_ns = 0;
  std::int64_t uncertainty_ns = 0;
};

/// gpu = host + offset(host), the offset interpolated linearly between a calibration before a
/// phase and one after it (absorbing the two clocks' drift). uncertainty_ns bounds the error
/// of a mapped time: the larger calibration uncertainty plus the error a straight line between
/// two points can make of a drift that is smooth over seconds (neglected).
class clock_map {
 public:
  clock_map() = default;
  /// From one calibration (constant offset).
  explicit clock_map(const clock_sample& only);
  /// From calibrations before and after (linear offset); identical host times fall back to one.
  clock_map(const clock_sample& before, const clock_sample& after);

  [[nodiscard]] std::int64_t gpu_from_host(std::int64_t host_ns) const;
  [[nodiscard]] std::int64_t host_from_gpu(std::uint64_t gpu_ns) const;
  [[nodiscard]] std::int64_t uncertainty_ns() const noexcept { return uncertainty_ns_; }
  [[nodiscard]] double drift_ppm() const noexcept { return slope_ * 1e6; }

 private:
  std::int64_t host0_ = 0;
  std::int64_t offset0_ = 0;  // gpu - host at host0_
  double slope_ = 0;          // change of the offset per host ns
  std::int64_t uncertainty_ns_ = 0;
};

/// The clock map checked against causality over a phase's launches: a kernel cannot start
/// before its launch call began, nor end after the host saw it complete. Violations beyond
/// `tolerance_ns` mean the mapped comparisons (unload bounds, holes vs operations) are suspect.
struct clock_check {
  std::uint64_t checked = 0;
  std::uint64_t start_before_launch = 0;  ///< mapped start < host_start_ns - tolerance
  std::uint64_t end_after_done = 0;       ///< mapped end > host_done_ns + tolerance
  /// Smallest (mapped start - launch begin) and (done - mapped end), microseconds: both are >= 0
  /// for an exact map, so a negative value bounds its error from below.
  double min_launch_to_start_us = not_a_number;
  double min_end_to_done_us = not_a_number;
  [[nodiscard]] std::uint64_t violations() const noexcept {
    return start_before_launch + end_after_done;
  }
};
[[nodiscard]] clock_check check_clock(std::span<const launch_entry> launches,
                                      std::span<const gpu_record> log, const clock_map& clocks,
                                      std::int64_t tolerance_ns);

// ---------------------------------------------------------------------------------------------
// Windows of host time (stage..promote, load..unload) and what overlaps them

/// Closed intervals [begin, end] of one clock, merged on construction.
class window_set {
 public:
  window_set() = default;
  explicit window_set(std::vector<std::pair<std::int64_t, std::int64_t>> windows);
  /// True if [begin, end] intersects a window.
  [[nodiscard]] bool overlaps(std::int64_t begin, std::int64_t end) const;
  [[nodiscard]] std::size_t size() const noexcept { return merged_.size(); }

 private:
  std::vector<std::pair<std::int64_t, std::int64_t>> merged_;
};

// ---------------------------------------------------------------------------------------------
// When a retired version was certainly unloaded

/// hot_module::stats() as the swapper saw it; host_ns is read after stats() returned.
struct chain_sample {
  std::int64_t host_ns = 0;
  std::uint64_t current_id = 0;
  std::size_t retired_waiting = 0;
};

/// For each version id, the host time by which hot_module had certainly decided to unload it
/// (and so had seen all of its GPU work complete): the first sample with retired_waiting == 0
/// and id <= current_id - 2. (With no rollback, promote(C) retires C - 2: C - 1 stays as the
/// rollback target; retired_waiting == 0 means every retired version has been taken off the
/// list to be unloaded.) Versions no sample covers get no bound. Samples in time order.
[[nodiscard]] std::unordered_map<std::uint64_t, std::int64_t> unload_bounds(
    std::span<const chain_sample> samples);

// ---------------------------------------------------------------------------------------------
// Must-be-zero checks

/// What is known of each version id of a phase.
struct version_facts {
  /// The tag (compiled VERSION) of the image each version id was loaded from.
  std::unordered_map<std::uint64_t, std::uint64_t> tag_of;
  /// GPU time (%globaltimer ns, already including the clock-mapping tolerance) after which no
  /// kernel of the version may start: it had been unloaded, or judged idle and handed to unload.
  std::unordered_map<std::uint64_t, std::int64_t> unloaded_by_gpu_ns;
};

/// Counts of the must-be-zero checks over one phase's launches.
struct check_counts {
  std::uint64_t launches = 0;
  std::uint64_t failed = 0;          ///< the launch call threw / the driver refused it
  std::uint64_t missing_record = 0;  ///< launch returned, but its kernel never wrote its slot
  std::uint64_t wrong_code =
      0;  ///< the kernel's tag is not the tag of the version launch() returned
  std::uint64_t ran_after_unload = 0;     ///< a kernel of version R started after R was unloaded
  std::uint64_t stale_after_promote = 0;  ///< launch began after promote(P) returned, ran R < P
  std::vector<std::string> examples;      ///< the first few violations, described

  /// "Launches that ran a version after it was retired": the code that ran is not the code of
  /// the version the launch pinned, or it ran after that version's unload.
  [[nodiscard]] std::uint64_t ran_retired() const noexcept { return wrong_code + ran_after_unload; }
  [[nodiscard]] std::uint64_t must_be_zero_total() const noexcept {
    return failed + missing_record + ran_retired() + stale_after_promote;
  }
};

/// Runs the checks: every non-failed launch must have a record in `log` (indexed by slot) whose
/// tag is facts.tag_of[returned_id], whose start is not after
/// facts.unloaded_by_gpu_ns[returned_id], and returned_id >= promoted_before. An id missing from
/// tag_of counts as wrong_code.
[[nodiscard]] check_counts check_launches(std::span<const launch_entry> launches,
                                          std::span<const gpu_record> log,
                                          const version_facts& facts, std::size_t max_examples = 5);

// ---------------------------------------------------------------------------------------------
// Results, verdict, table

/// Timings of one kind of swapper operation (stage, promote, load, ...), microseconds.
struct op_timing {
  std::string name;
  std::vector<double> samples_us;
  summary us;
};

/// Everything measured in one phase of one thread count.
struct phase_result {
  std::string name;  ///< "steady", "hot-swap", "bare-load", "naive-ptx"
  int threads = 0;
  bool gated = true;    ///< its must-be-zero counts decide the exit status
  double window_s = 0;  ///< length of the measured window (swapper running / steady sleep)
  std::uint64_t launches_total = 0;
  std::uint64_t launches_in_window = 0;
  double launches_per_s = 0;  ///< in the window, all threads
  check_counts checks;        ///< over all launches of the phase
  summary gap_us;             ///< GPU idle gaps of kernels launched in the window
  std::uint64_t gaps_positive = 0;
  double idle_fraction = 0;    ///< idle / span of that timeline
  summary gap_in_ops_us;       ///< only the holes overlapping a swapper operation (mapped clock)
  summary kernel_us;           ///< kernels' end - start on the GPU (shows the timer's granularity)
  summary latency_us;          ///< launch call, host, launches begun in the window
  summary latency_in_ops_us;   ///< only launches overlapping a swapper operation (host clock)
  std::vector<op_timing> ops;  ///< stage/promote, load, jit_load/get_function/swap/unload
  std::uint64_t cycles_requested = 0;
  std::uint64_t cycles_done = 0;
  std::uint64_t cycles_failed = 0;  ///< swapper operations that threw (gated: must be 0)
  bool log_full = false;            ///< servers ran out of log slots: the phase was cut short
  bool time_limited = false;        ///< the swapper hit --max-phase-s
  double clock_drift_ppm = 0;
  double clock_uncertainty_us = 0;
  double clock_tolerance_us = 0;  ///< uncertainty + slack, used for every mapped comparison
  clock_check clock;
  std::uint64_t versions_with_unload_bound = 0;
  std::vector<std::string> errors;  ///< first messages of failures
  /// The longest holes of the window's timeline: (start, microseconds after the window began on
  /// the mapped clock; length, microseconds), longest first.
  std::vector<std::pair<double, double>> largest_holes_us;
  std::vector<std::pair<std::string, double>> extra;  ///< further numbers for the JSON
};

/// The targets for one thread count.
struct verdict {
  double gap_ratio = not_a_number;      ///< hot-swap max gap / bare-load max gap
  double latency_ratio = not_a_number;  ///< hot-swap p99 latency / steady p99 latency
  bool gap_met = false;                 ///< gap_ratio <= limit
  bool latency_met = false;             ///< latency_ratio <= limit
};
/// Targets: max GPU gap during swaps <= limit x the max gap of bare cubin loads; serving p99
/// launch latency during swaps <= limit x steady state. A NaN ratio is not met. A bare-load
/// max gap of 0 (the GPU never idled) makes the gap target "met" only if swaps left none either.
[[nodiscard]] verdict judge(const phase_result& steady, const phase_result& swap,
                            const phase_result& bare, double limit = 1.5);

/// The readable table for the phases of one thread count (in the order given), with the
/// must-be-zero block and, when the three named phases are present, the verdict.
[[nodiscard]] std::string format_report(std::span<const phase_result> phases, double limit = 1.5);

/// Numbers for tables: "0", "1.23" below 10, "12.3" below 100, "123" above; "-" for NaN.
[[nodiscard]] std::string format_number(double value);

}  // namespace hotswap
