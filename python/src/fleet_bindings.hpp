#pragma once
// The fleet's two sides in Python (fleet_controller.cpp, fleet_agent.cpp): built only where the
// fleet layer is (libnats installed), as CUBRIDGE_PYTHON_FLEET says.
#include <cubridge/fleet/connection.hpp>

#include <nanobind/nanobind.h>

#include <chrono>
#include <string>

namespace cubridge::python {

/// The bus as both sides' keywords name it (fleet::bus_options).
struct bus_settings {
  std::string servers;
  std::string credentials;
  std::string ca_file;
  std::string api_prefix;
  int replicas = 1;
};
/// @throws error (errc::precondition) for replicas outside 1 to 5.
[[nodiscard]] fleet::bus_options bus_options_of(const bus_settings& settings);

/// `seconds` as milliseconds. @throws error (errc::precondition) naming `what` unless it is a
/// positive finite number.
[[nodiscard]] std::chrono::milliseconds milliseconds_of(double seconds, const char* what);

/// A record's JSON text (fleet::to_json) as Python objects (json.loads).
[[nodiscard]] nanobind::object from_json(const std::string& text);

/// FleetController (fleet_controller.cpp).
void bind_fleet_controller(nanobind::module_& m);
/// FleetAgent (fleet_agent.cpp).
void bind_fleet_agent(nanobind::module_& m);

}  // namespace cubridge::python
