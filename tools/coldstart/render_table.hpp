#pragma once
// The table `cubridge coldstart` prints: an overview of each scenario's total, then median / min /
// max of every phase per scenario, in ms.

#include "aggregate.hpp"
#include "phase_timings.hpp"

#include <string>
#include <vector>

namespace cubridge::tool::coldstart {

/// "NVIDIA H200 (sm_90), driver 580.159.04 (CUDA 13.0)"; parts that are unknown are left out.
[[nodiscard]] std::string describe_machine(const machine_info& m);

/// The whole table for people, ending in a newline.
[[nodiscard]] std::string render_table(const report& r,
                                       const std::vector<scenario_summary>& summary);

}  // namespace cubridge::tool::coldstart
