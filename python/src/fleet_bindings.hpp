#pragma once
// The fleet's two sides in Python (fleet_controller.cpp, fleet_agent.cpp): built only where the
// fleet layer is (libnats installed), as CUBRIDGE_PYTHON_FLEET says.
#include <cubridge/fleet/connection.hpp>

#include <nanobind/nanobind.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace cubridge::python {

/// The bus as both sides name it (fleet::bus_options): cubridge.BusOptions, or the keywords
/// of FleetController and FleetAgent.
struct bus_settings {
  std::string servers = "nats://127.0.0.1:4222";
  std::string credentials;
  std::string ca_file;
  std::string api_prefix;
  int replicas = 1;
};
/// @throws error (errc::precondition) for replicas outside 1 to 5.
void check_replicas(int replicas);
/// @throws error (errc::precondition) for replicas outside 1 to 5.
[[nodiscard]] fleet::bus_options bus_options_of(const bus_settings& settings);
/// "BusOptions(servers='nats://***@host:4222', ...)": any password in a URL cut out.
[[nodiscard]] std::string repr_of(const bus_settings& bus);
/// `value` as Python's repr() writes it.
[[nodiscard]] std::string python_repr(nanobind::handle value);

/// The bus keywords a constructor was given (FleetController's, FleetAgent's), each nullopt
/// when left out: a BusOptions given with any of them is refused.
struct bus_keywords {
  std::optional<std::string> servers;
  std::optional<std::string> credentials;
  std::optional<std::string> ca_file;
  std::optional<std::string> api_prefix;
  std::optional<int> replicas;
  [[nodiscard]] bool any() const noexcept {
    return servers || credentials || ca_file || api_prefix || replicas;
  }
  /// BusOptions' defaults with what was given put in. @throws error (errc::precondition) for
  /// replicas outside 1 to 5.
  [[nodiscard]] bus_settings settings() const;
};

/// What FleetAgent takes besides its modules, keys and probe: cubridge.AgentOptions, or its
/// keywords (fleet_agent_options).
struct agent_settings {
  bus_settings bus;
  std::string node;
  std::string node_key_file;
  bool allow_readable_key = false;
  std::vector<std::string> modules;
  std::string cohort = "all";
  double heartbeat_interval_s = 5;
  double resync_interval_s = 2;
};

/// `seconds` as milliseconds. @throws error (errc::precondition) naming `what` unless it is a
/// positive finite number.
[[nodiscard]] std::chrono::milliseconds milliseconds_of(double seconds, const char* what);

/// A record's JSON text (fleet::to_json) as Python objects (json.loads).
[[nodiscard]] nanobind::object from_json(const std::string& text);

/// BusOptions and FleetController (fleet_controller.cpp).
void bind_fleet_controller(nanobind::module_& m);
/// AgentOptions and FleetAgent (fleet_agent.cpp); after bind_fleet_controller (BusOptions).
void bind_fleet_agent(nanobind::module_& m);

}  // namespace cubridge::python
