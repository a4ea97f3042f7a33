#pragma once
// The health analysis of a wave rollout (docs/fleet.md, "Progressive delivery"): the nodes of
// the waves so far, on the candidate, against the nodes still on the stable version over the
// same window (canary against baseline, as Flagger and Kayenta compare), so that a fleet-wide
// dip is not blamed on the candidate. A signal fails a wave when the canaries breach it and the
// baseline does not. The baseline is robust: its figures are medians of per-node figures, or
// shares with the worst nodes trimmed, so that no single node (broken, or holding a stolen key)
// can make the baseline look as bad as a failing canary. A baseline that breaches on its own
// halts the rollout for review unless the limits say to bake on.

#include <cubridge/fleet/records.hpp>
#include <cubridge/fleet/rollout_words.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cubridge::fleet {

/// The limits a wave is held to (the wave plan's, `fleet publish --max-failure-rate`,
/// `--max-metric NAME<=X`). Sticky errors and an unhealthy probe always count.
struct health_limits {
  /// Launch failures per launch above which a wave fails; negative: no limit.
  double max_failure_rate = -1;
  /// Per probe value, the most the nodes may report on average.
  std::map<std::string, double, std::less<>> max_metrics{};
  /// What a baseline that breaches a limit on its own (its median node) does: halt the rollout
  /// for review (true), or excuse the canaries as a fleet-wide dip and bake on (false).
  bool baseline_breach_halts = true;
};

/// One node's figures for the module.
struct health_sample {
  std::string node{};
  module_health health{};
  /// What poisoned the node's process, from its heartbeat (heartbeat::poisoned): counted as a
  /// sticky error whatever the module's own counters say, since nothing on that node can use the
  /// GPU any more.
  std::optional<poison_report> poisoned{};
};

/// Launch counters of a baseline node at the start of the window.
struct counter_mark {
  std::uint64_t launches = 0;
  std::uint64_t failures = 0;
};

/// What the analysis found.
struct wave_verdict {
  bool failed = false;
  /// The canary that breached first, the signal (sticky_error, probe, failure_rate, metric
  /// with the metric's name; baseline_unhealthy when the baseline breached on its own and the
  /// limits halt on that, with the first baseline node that breached) and a sentence with the
  /// values of both sides.
  std::string node{};
  halt_signal signal = halt_signal::none;
  std::string metric{};
  std::string reason{};
  /// Canary and baseline figures of every signal evaluated, by signal name (for the record and
  /// the dashboard): "failure_rate", "unhealthy", "sticky", "metric:<name>".
  std::map<std::string, double, std::less<>> canary{};
  std::map<std::string, double, std::less<>> baseline{};
  /// The baseline nodes that breached a limit themselves, by node id (whatever the verdict).
  std::vector<std::string> baseline_breaching{};
};

/// How many of `count` baseline nodes a share leaves out, worst first: a tenth, at least one.
[[nodiscard]] std::size_t baseline_trim(std::size_t count) noexcept;

/// Judges the canaries (their counters are the candidate's since it was promoted on them)
/// against the baseline (counters now against `baseline_start`, per node: the same window).
/// A baseline node missing from `baseline_start`, or whose counters went down (a restart), counts
/// from zero. With no baseline node the limits apply to the canaries alone.
///
/// Per signal, the baseline's figure is robust to single nodes: sticky errors (a module's, or a
/// poisoned process) and unhealthy probes as a share of the baseline nodes with the baseline_trim()
/// worst left out; the failure rate and each metric as the median of the nodes' own figures. The
/// baseline breaches when its median node breaches (more than half of its nodes for a share).
[[nodiscard]] wave_verdict analyse_wave(
    std::span<const health_sample> canaries, std::span<const health_sample> baseline,
    const std::map<std::string, counter_mark, std::less<>>& baseline_start,
    const health_limits& limits);

}  // namespace cubridge::fleet
