#pragma once
// What `cubridge fleet status` and `watch` show: per node its versions, lag, heartbeat age and
// last result; per module the desired versions and any halt.
#include <cubridge/fleet/controller.hpp>

#include <nlohmann/json.hpp>

#include <string>

namespace cubridge::tool {

/// {"nodes": [{"node", "cohort", "gpu", "live", "age_s", "versions", "lag", "last_result"}],
///  "modules": [{"module", "desired_all", "desired_canary", "halted"}]}; texts as the nodes sent
/// them (fleet_records.hpp escapes them when parsing).
[[nodiscard]] nlohmann::json fleet_status_json(const std::vector<fleet::node_state>& nodes,
                                               const std::vector<fleet::module_state>& modules);
/// The same as a table.
[[nodiscard]] std::string render_fleet_status(const std::vector<fleet::node_state>& nodes,
                                              const std::vector<fleet::module_state>& modules);

}  // namespace cubridge::tool
