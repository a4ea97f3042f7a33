// The GPU-free half of the swap-under-load harness (bench/hotswap/stats.hpp): percentiles, GPU
// gap analysis on synthetic timelines, clock mapping, unload bounds, the must-be-zero checks on
// synthetic logs, the verdict and the table.
#include "../bench/hotswap/stats.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace {

using namespace hotswap;

TEST(SwapStatsPercentile, LinearInterpolationBetweenClosestRanks) {
  const std::vector<double> v{1, 2, 3, 4, 5};
  EXPECT_DOUBLE_EQ(percentile_sorted(v, 0), 1);
  EXPECT_DOUBLE_EQ(percentile_sorted(v, 25), 2);
  EXPECT_DOUBLE_EQ(percentile_sorted(v, 50), 3);
  EXPECT_DOUBLE_EQ(percentile_sorted(v, 99), 4.96);  // rank 3.96: 4 + 0.96 * (5 - 4)
  EXPECT_DOUBLE_EQ(percentile_sorted(v, 100), 5);
  EXPECT_DOUBLE_EQ(percentile_sorted(v, 150), 5);  // clamped
  EXPECT_DOUBLE_EQ(percentile_sorted(v, -3), 1);
}

TEST(SwapStatsPercentile, EvenCountMedianIsMeanOfMiddleTwo) {
  const std::vector<double> v{10, 20, 30, 40};
  EXPECT_DOUBLE_EQ(percentile_sorted(v, 50), 25);
  EXPECT_DOUBLE_EQ(percentile_sorted(v, 99), 39.7);  // rank 2.97
}

TEST(SwapStatsPercentile, SingleValueAndEmpty) {
  const std::vector<double> one{7};
  EXPECT_DOUBLE_EQ(percentile_sorted(one, 0), 7);
  EXPECT_DOUBLE_EQ(percentile_sorted(one, 99), 7);
  EXPECT_TRUE(std::isnan(percentile_sorted({}, 50)));
}

TEST(SwapStatsPercentile, P99OfHundredValuesInterpolates) {
  std::vector<double> v;
  for (int i = 1; i <= 100; ++i) v.push_back(i);
  EXPECT_DOUBLE_EQ(percentile_sorted(v, 99), 99.01);  // rank 98.01
  EXPECT_DOUBLE_EQ(percentile_sorted(v, 50), 50.5);
}

TEST(SwapStatsSummary, SortsAndSummarises) {
  const auto s = summarize({5, 1, 4, 2, 3});
  EXPECT_EQ(s.count, 5u);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.p50, 3);
  EXPECT_DOUBLE_EQ(s.p99, 4.96);
  EXPECT_DOUBLE_EQ(s.max, 5);
  EXPECT_DOUBLE_EQ(s.mean, 3);
}

TEST(SwapStatsSummary, EmptyIsAllNaN) {
  const auto s = summarize({});
  EXPECT_EQ(s.count, 0u);
  EXPECT_TRUE(std::isnan(s.min));
  EXPECT_TRUE(std::isnan(s.p50));
  EXPECT_TRUE(std::isnan(s.p99));
  EXPECT_TRUE(std::isnan(s.max));
  EXPECT_TRUE(std::isnan(s.mean));
}

TEST(SwapStatsGaps, OverlappingKernelsOfSeveralStreamsLeaveNoGap) {
  // Three streams, each with back-to-back 20 us kernels, staggered: the GPU never idles.
  std::vector<kernel_span> k;
  for (std::uint64_t stream = 0; stream < 3; ++stream)
    for (std::uint64_t i = 0; i < 10; ++i) {
      const std::uint64_t start = 1'000'000 + stream * 7'000 + i * 21'000;
      k.push_back({start, start + 20'000});
    }
  const auto r = analyze_gaps(k);
  ASSERT_EQ(r.gaps_ns.size(), k.size() - 1);
  for (double g : r.gaps_ns) EXPECT_EQ(g, 0.0);
  EXPECT_TRUE(r.holes.empty());
  EXPECT_EQ(r.idle_ns, 0.0);
  EXPECT_EQ(summarize(r.gaps_ns).max, 0.0);
}

TEST(SwapStatsGaps, AHoleGivesExactlyItsLength) {
  std::vector<kernel_span> k{{0, 10}, {5, 20}, {30, 40}, {40, 50}};
  const auto r = analyze_gaps(k);
  ASSERT_EQ(r.gaps_ns.size(), 3u);
  EXPECT_EQ(r.gaps_ns[0], 0.0);   // overlaps
  EXPECT_EQ(r.gaps_ns[1], 10.0);  // 30 - 20
  EXPECT_EQ(r.gaps_ns[2], 0.0);   // touching kernels: no idle time
  ASSERT_EQ(r.holes.size(), 1u);
  EXPECT_EQ(r.holes[0].start_ns, 20u);
  EXPECT_EQ(r.holes[0].end_ns, 30u);
  EXPECT_EQ(r.idle_ns, 10.0);
  EXPECT_EQ(r.span_ns, 50.0);
}

TEST(SwapStatsGaps, MeasuredFromTheLatestEndNotThePreviousKernel) {
  // A long kernel on one stream covers short ones on another; the hole is after the long one.
  std::vector<kernel_span> k{{0, 100}, {10, 20}, {50, 60}, {120, 130}};
  const auto r = analyze_gaps(k);
  ASSERT_EQ(r.holes.size(), 1u);
  EXPECT_EQ(r.holes[0].start_ns, 100u);
  EXPECT_EQ(summarize(r.gaps_ns).max, 20.0);  // not 120 - 60
}

TEST(SwapStatsGaps, InputOrderDoesNotMatter) {
  std::vector<kernel_span> k{{300, 400}, {0, 100}, {150, 250}};
  const auto r = analyze_gaps(k);
  ASSERT_EQ(r.gaps_ns.size(), 2u);
  EXPECT_EQ(r.gaps_ns[0], 50.0);
  EXPECT_EQ(r.gaps_ns[1], 50.0);
  EXPECT_EQ(r.idle_ns, 100.0);
}

TEST(SwapStatsGaps, NoneOrOneKernelHasNoGaps) {
  EXPECT_TRUE(analyze_gaps({}).gaps_ns.empty());
  const auto one = analyze_gaps({{5, 9}});
  EXPECT_TRUE(one.gaps_ns.empty());
  EXPECT_EQ(one.span_ns, 4.0);
}

TEST(SwapStatsClock, ConstantOffsetMapsBothWays) {
  const clock_map m({.host_ns = 1'000, .gpu_ns = 5'000'000, .uncertainty_ns = 7});
  EXPECT_EQ(m.gpu_from_host(2'000), 5'001'000);
  EXPECT_EQ(m.host_from_gpu(5'001'000), 2'000);
  EXPECT_EQ(m.uncertainty_ns(), 7);
}

TEST(SwapStatsClock, DriftIsInterpolatedBetweenCalibrations) {
  // The offset grows by 100 ns over 1,000,000 host ns: 100 ppm.
  const clock_map m({.host_ns = 0, .gpu_ns = 1'000'000'000, .uncertainty_ns = 3},
                    {.host_ns = 1'000'000, .gpu_ns = 1'001'000'100, .uncertainty_ns = 9});
  EXPECT_EQ(m.gpu_from_host(0), 1'000'000'000);
  EXPECT_EQ(m.gpu_from_host(500'000), 1'000'500'050);
  EXPECT_EQ(m.gpu_from_host(1'000'000), 1'001'000'100);
  EXPECT_EQ(m.host_from_gpu(1'000'500'050), 500'000);
  EXPECT_NEAR(m.drift_ppm(), 100.0, 1e-9);
  EXPECT_EQ(m.uncertainty_ns(), 9);
}

TEST(SwapStatsClock, CausalityCheckOfTheMap) {
  // GPU time = host time + 1,000,000. Launch begins at host 100, kernel runs 110..130 (host),
  // the host sees it complete at 140.
  const clock_map exact({.host_ns = 0, .gpu_ns = 1'000'000, .uncertainty_ns = 0});
  const std::vector<launch_entry> launches{
      {.slot = 0,
       .returned_id = 1,
       .promoted_before = 1,
       .host_start_ns = 100,
       .host_end_ns = 104,
       .host_done_ns = 140},
      {.slot = 1,
       .returned_id = 1,
       .promoted_before = 1,
       .host_start_ns = 200,
       .host_end_ns = 204,
       .host_done_ns = 0},  // completion not observed: only the start is checked
      {.slot = 2, .failed = true}};
  const std::vector<gpu_record> log{{1, 1'000'110, 1'000'130}, {1, 1'000'250, 1'000'270}, {}};
  auto c = check_clock(launches, log, exact, 0);
  EXPECT_EQ(c.checked, 2u);
  EXPECT_EQ(c.violations(), 0u);
  EXPECT_DOUBLE_EQ(c.min_launch_to_start_us, 0.010);
  EXPECT_DOUBLE_EQ(c.min_end_to_done_us, 0.010);
  // A map 30 ns early puts the kernel's end after its completion was seen: beyond 10 ns of
  // tolerance, not beyond 40.
  const clock_map off({.host_ns = 0, .gpu_ns = 1'000'000 - 30, .uncertainty_ns = 0});
  c = check_clock(launches, log, off, 10);
  EXPECT_EQ(c.start_before_launch, 0u);  // 110 + 30 = 140 >= 100
  EXPECT_EQ(c.end_after_done, 1u);       // 130 + 30 = 160 > 140 + 10
  EXPECT_DOUBLE_EQ(c.min_end_to_done_us, -0.020);
  EXPECT_EQ(check_clock(launches, log, off, 40).violations(), 0u);
  const clock_map late({.host_ns = 0, .gpu_ns = 1'000'000 + 30, .uncertainty_ns = 0});
  c = check_clock(launches, log, late, 0);
  EXPECT_EQ(c.start_before_launch, 1u);  // 110 - 30 = 80 < 100
  EXPECT_DOUBLE_EQ(c.min_launch_to_start_us, -0.020);
}

TEST(SwapStatsWindows, OverlapWithMergedWindows) {
  const window_set w({{100, 200}, {150, 300}, {500, 600}});
  EXPECT_EQ(w.size(), 2u);
  EXPECT_TRUE(w.overlaps(250, 260));
  EXPECT_TRUE(w.overlaps(0, 100));    // touches the start
  EXPECT_TRUE(w.overlaps(600, 700));  // touches the end
  EXPECT_TRUE(w.overlaps(50, 1000));  // contains windows
  EXPECT_FALSE(w.overlaps(301, 499));
  EXPECT_FALSE(w.overlaps(0, 99));
  EXPECT_FALSE(w.overlaps(601, 700));
  EXPECT_FALSE(window_set().overlaps(0, 1'000'000));
}

TEST(SwapStatsUnloadBounds, OnlySamplesWithNothingWaitingBoundRetiredVersions) {
  const std::vector<chain_sample> samples{
      {.host_ns = 10, .current_id = 2, .retired_waiting = 0},  // nothing retired yet
      {.host_ns = 20, .current_id = 3, .retired_waiting = 1},  // 1 retired, still waiting
      {.host_ns = 30, .current_id = 4, .retired_waiting = 1},  // 1 or 2 waiting: unknown which
      {.host_ns = 40, .current_id = 5, .retired_waiting = 0},  // 1..3 all handed to unload
      {.host_ns = 50, .current_id = 6, .retired_waiting = 1},
      {.host_ns = 60, .current_id = 6, .retired_waiting = 0},  // 4 as well
  };
  const auto b = unload_bounds(samples);
  ASSERT_EQ(b.size(), 4u);
  EXPECT_EQ(b.at(1), 40);
  EXPECT_EQ(b.at(2), 40);
  EXPECT_EQ(b.at(3), 40);
  EXPECT_EQ(b.at(4), 60);
  EXPECT_FALSE(b.contains(5));  // the rollback target is never retired
  EXPECT_FALSE(b.contains(6));
}

// A synthetic phase: version 1 (tag 1) until promote of version 2 (tag 2) at host/GPU time 1000.
struct synthetic {
  std::vector<launch_entry> launches;
  std::vector<gpu_record> log;
  version_facts facts{.tag_of = {{1, 1}, {2, 2}}, .unloaded_by_gpu_ns = {}};
  void add(std::uint64_t id, std::uint64_t promoted, std::uint64_t tag, std::uint64_t start) {
    const std::uint64_t slot = log.size();
    launches.push_back({.slot = slot,
                        .returned_id = id,
                        .promoted_before = promoted,
                        .host_start_ns = static_cast<std::int64_t>(start) - 5,
                        .host_end_ns = static_cast<std::int64_t>(start) - 1,
                        .thread = 0,
                        .failed = false});
    log.push_back({tag, start, start + 20});
  }
  check_counts check() const { return check_launches(launches, log, facts); }
};

synthetic clean_phase() {
  synthetic s;
  for (std::uint64_t t = 0; t < 1000; t += 50) s.add(1, 1, 1, t);
  s.add(1, 1, 1, 1010);  // issued before the promote returned: may still run version 1
  for (std::uint64_t t = 1020; t < 2000; t += 50) s.add(2, 2, 2, t);
  return s;
}

TEST(SwapStatsChecks, CleanLogCountsNothing) {
  const auto c = clean_phase().check();
  EXPECT_EQ(c.launches, 41u);
  EXPECT_EQ(c.must_be_zero_total(), 0u);
  EXPECT_TRUE(c.examples.empty());
}

TEST(SwapStatsChecks, FailedLaunchIsCountedNotAsMissing) {
  auto s = clean_phase();
  s.launches[3].failed = true;
  s.log[3] = {};  // a failed launch never writes
  const auto c = s.check();
  EXPECT_EQ(c.failed, 1u);
  EXPECT_EQ(c.missing_record, 0u);
  EXPECT_EQ(c.must_be_zero_total(), 1u);
  ASSERT_EQ(c.examples.size(), 1u);
  EXPECT_NE(c.examples[0].find("launch failed"), std::string::npos);
}

TEST(SwapStatsChecks, UnwrittenSlotIsMissing) {
  auto s = clean_phase();
  s.log[5] = {};
  s.launches.push_back({.slot = 10'000, .returned_id = 2, .promoted_before = 2});  // beyond the log
  const auto c = s.check();
  EXPECT_EQ(c.missing_record, 2u);
  EXPECT_EQ(c.must_be_zero_total(), 2u);
}

TEST(SwapStatsChecks, CodeOfAnotherVersionCountsAsRanRetired) {
  auto s = clean_phase();
  s.log[30].tag = 1;     // launch() said version 2, image v1's code ran
  s.add(7, 2, 2, 1990);  // an id the harness never loaded
  const auto c = s.check();
  EXPECT_EQ(c.wrong_code, 2u);
  EXPECT_EQ(c.ran_retired(), 2u);
  EXPECT_EQ(c.stale_after_promote, 0u);
}

TEST(SwapStatsChecks, StartAfterUnloadCountsAsRanRetired) {
  auto s = clean_phase();
  s.facts.unloaded_by_gpu_ns[1] = 1005;
  auto c = s.check();
  EXPECT_EQ(c.ran_after_unload, 1u) << "the version-1 kernel that started at 1010";
  EXPECT_EQ(c.ran_retired(), 1u);
  s.facts.unloaded_by_gpu_ns[1] = 1010;  // starting exactly at the bound is allowed
  c = s.check();
  EXPECT_EQ(c.ran_after_unload, 0u);
}

TEST(SwapStatsChecks, OldVersionAfterPromoteReturned) {
  auto s = clean_phase();
  s.add(1, 2, 1, 1500);  // began after promote(2) returned, got version 1
  const auto c = s.check();
  EXPECT_EQ(c.stale_after_promote, 1u);
  EXPECT_EQ(c.wrong_code, 0u);
  EXPECT_EQ(c.must_be_zero_total(), 1u);
  ASSERT_EQ(c.examples.size(), 1u);
  EXPECT_NE(c.examples[0].find("older version"), std::string::npos);
}

TEST(SwapStatsChecks, ExamplesAreCapped) {
  auto s = clean_phase();
  for (auto& r : s.log) r.tag = 9;
  const auto c = check_launches(s.launches, s.log, s.facts, 3);
  EXPECT_EQ(c.wrong_code, 41u);
  EXPECT_EQ(c.examples.size(), 3u);
}

phase_result phase(const char* name, double gap_max, double p99) {
  phase_result p;
  p.name = name;
  p.threads = 4;
  p.gap_us = summarize({0, 1, gap_max});
  p.latency_us = summarize({1, p99});
  p.latency_us.p99 = p99;
  return p;
}

TEST(SwapStatsVerdict, RatiosAgainstBareLoadAndSteadyState) {
  auto v = judge(phase("steady", 10, 8), phase("hot-swap", 150, 12), phase("bare-load", 100, 9));
  EXPECT_DOUBLE_EQ(v.gap_ratio, 1.5);
  EXPECT_DOUBLE_EQ(v.latency_ratio, 1.5);
  EXPECT_TRUE(v.gap_met);
  EXPECT_TRUE(v.latency_met);
  v = judge(phase("steady", 10, 8), phase("hot-swap", 151, 12.1), phase("bare-load", 100, 9));
  EXPECT_FALSE(v.gap_met);
  EXPECT_FALSE(v.latency_met);
}

TEST(SwapStatsVerdict, MissingDataIsNotMet) {
  phase_result empty;
  const auto v = judge(empty, empty, empty);
  EXPECT_FALSE(v.gap_met);
  EXPECT_FALSE(v.latency_met);
  // A bare load that never left the GPU idle vs swaps that did.
  const auto w = judge(phase("steady", 0, 8), phase("hot-swap", 5, 8), phase("bare-load", 0, 8));
  EXPECT_FALSE(w.gap_met);
}

TEST(SwapStatsReport, TableNamesPhasesChecksAndVerdict) {
  std::vector<phase_result> phases{phase("steady", 10, 8), phase("hot-swap", 150, 12),
                                   phase("bare-load", 100, 9), phase("naive-ptx", 24000, 24000)};
  phases[1].ops.push_back({.name = "stage", .samples_us = {200, 300}, .us = summarize({200, 300})});
  phases[1].checks.stale_after_promote = 2;
  phases[1].checks.examples.push_back("thread 0 slot 1 version 1: began after");
  phases[3].gated = false;
  phases[0].log_full = true;
  phases[0].launches_total = 4096;
  const auto table = format_report(phases);
  for (const char* expected :
       {"== 4 serving threads", "steady", "hot-swap", "bare-load", "naive-ptx", "stage",
        "must be 0", "<-- FAIL", "reference, not gated", "MET", "x bare cubin load",
        "thread 0 slot 1 version 1: began after", "log full after 4096 launches"})
    EXPECT_NE(table.find(expected), std::string::npos) << expected << "\n" << table;
  EXPECT_EQ(table.find("bare cubin load + unload"), std::string::npos) << "no such phase here";
  // With the load+unload reference: the swap's gap and latency set against the driver's own pair.
  phases.insert(phases.begin() + 3, phase("bare-load+unload", 300, 24));
  phases[3].gated = false;
  const auto with_pair = format_report(phases);
  EXPECT_NE(
      with_pair.find("bare cubin load + unload (the driver's cost of a swap): max GPU gap 150 us "
                     "vs 300 us = 0.50x; p99 launch latency"),
      std::string::npos)
      << with_pair;
  EXPECT_EQ(format_number(not_a_number), "-");
  EXPECT_EQ(format_number(12.345), "12.3");
  EXPECT_EQ(format_number(1.5), "1.50");
  EXPECT_EQ(format_number(1234.4), "1234");
}

}  // namespace
