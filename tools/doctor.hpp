#pragma once
#include <nlohmann/json.hpp>

#include <string>

namespace cubridge::tool {

/// What `cubridge doctor` found: the report as JSON (also rendered as a table).
nlohmann::json diagnose();
/// The report as a table for people.
std::string render_table(const nlohmann::json& report);

}  // namespace cubridge::tool
