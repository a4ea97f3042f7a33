#pragma once
// Median / min / max per phase and scenario over the runs of a report.

#include "phase_timings.hpp"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace cubridge::tool::coldstart {

/// Median, minimum and maximum of some values (ms).
struct stats {
  double median = 0;  ///< the middle value; for an even count the mean of the two middle ones
  double min = 0;
  double max = 0;
  std::size_t count = 0;
};

/// Statistics of `values`. @throws std::invalid_argument if `values` is empty.
[[nodiscard]] stats summarize(std::vector<double> values);

struct phase_summary {
  std::string phase;  ///< a phases() key
  stats ms;
};

/// One scenario under one loading mode, over its successful runs.
struct scenario_summary {
  loading_mode loading = loading_mode::lazy;
  scenario scen = scenario::cubin;
  int runs_ok = 0;
  int runs_failed = 0;
  std::vector<phase_summary> phases;  ///< in phases() order; empty when no run succeeded
  stats total;                        ///< of each run's sum of phases (not the sum of medians)
  std::vector<std::string> failures;  ///< "run 3: module_load: <error>", one per failed run
  /// Sum of the phases' medians: the length of the scenario's stacked bar.
  [[nodiscard]] double stacked_median_ms() const noexcept;
};

/// Groups runs by (loading, scenario): LAZY before EAGER, scenarios in scenarios() order; only
/// combinations that have runs appear. Failed runs are counted and listed, not averaged.
[[nodiscard]] std::vector<scenario_summary> aggregate(const std::vector<run_result>& runs);

void to_json(nlohmann::json& j, const stats& s);
void to_json(nlohmann::json& j, const scenario_summary& s);

/// The whole JSON document --json writes: the report (every run's raw numbers, the machine)
/// plus "summary", the aggregate of its runs.
[[nodiscard]] nlohmann::json document(const report& r);

}  // namespace cubridge::tool::coldstart
