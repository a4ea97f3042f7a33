#pragma once
// What `cubridge fleet status` and `watch` show: per enrolled node its versions, lag against
// what its module's desired state names for it, heartbeat age and last result; per module the
// desired state (phase, stable and candidate versions, canaries, why it halted or went back);
// what was refused while reading and whether the bus is open (a demo only).
#include <cubridge/fleet/controller.hpp>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace cubridge::tool {

/// Everything one reading of the fleet found.
struct fleet_reading {
  std::vector<fleet::node_state> nodes;
  std::vector<fleet::desired_entry> modules;
  fleet::read_report report;
  std::vector<std::string> warnings;
  bool open_bus = false;
};

/// Reads it (bounded by the controller's read_deadline).
[[nodiscard]] fleet_reading read_fleet(const fleet::controller& control);

/// {"nodes": [{"node", "labels", "cohort", "gpu", "live", "age_s", "versions", "lag",
///  "last_result", "problem"}], "modules": [{"module", "revision", "phase", "stable",
///  "candidate", "canaries", "reason"}], "refused": {...}, "complete", "warnings", "open_bus"}.
[[nodiscard]] nlohmann::json fleet_status_json(const fleet_reading& reading);
/// The same as a table.
[[nodiscard]] std::string render_fleet_status(const fleet_reading& reading);

}  // namespace cubridge::tool
