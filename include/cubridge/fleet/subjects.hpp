#pragma once
// Where the fleet's messages live in NATS JetStream (docs/fleet.md): stream, subject and bucket
// names, written once for the agent (fleet_agent.hpp) and the control side (`cubridge fleet`).
// Pure string work: no NATS client needed to include it.

#include <string>
#include <string_view>

namespace cubridge::fleet {

/// The longest module name or node id the fleet takes: each is one subject token and part of a
/// stream or consumer name.
inline constexpr std::size_t max_fleet_name = 64;

/// What is wrong with `name` as a fleet module name or node id (1 to 64 of [A-Za-z0-9_-]), or an
/// empty string when it is valid. Module names the HTTP endpoint takes but this refuses (dots,
/// spaces, ...) cannot be rolled out through the fleet.
[[nodiscard]] inline std::string check_fleet_name(std::string_view name, std::string_view what) {
  if (name.empty()) return std::string(what) + " is empty";
  if (name.size() > max_fleet_name)
    return std::string(what) + " is over " + std::to_string(max_fleet_name) + " bytes";
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-';
    if (!ok) return std::string(what) + " may hold only A-Z, a-z, 0-9, '_' and '-'";
  }
  return {};
}

/// The stream of one module's bundles and rollback requests.
[[nodiscard]] inline std::string bundle_stream(std::string_view module) {
  return "CUBRIDGE_BUNDLES_" + std::string(module);
}
/// The bundle for every node of the fleet.
[[nodiscard]] inline std::string bundle_subject_all(std::string_view module) {
  return "cubridge.bundle." + std::string(module) + ".all";
}
/// The bundle for one node (canaries, `--nodes`).
[[nodiscard]] inline std::string bundle_subject_node(std::string_view module,
                                                     std::string_view node) {
  return "cubridge.bundle." + std::string(module) + ".node." + std::string(node);
}
/// Signed rollback requests for the module.
[[nodiscard]] inline std::string rollback_subject(std::string_view module) {
  return "cubridge.rollback." + std::string(module);
}

/// Results of every node, one subject per module and node.
inline constexpr std::string_view result_stream = "CUBRIDGE_RESULTS";
[[nodiscard]] inline std::string result_subject(std::string_view module, std::string_view node) {
  return "cubridge.result." + std::string(module) + "." + std::string(node);
}

/// Heartbeats, one subject per node (the last kept).
inline constexpr std::string_view heartbeat_stream = "CUBRIDGE_HEARTBEATS";
[[nodiscard]] inline std::string heartbeat_subject(std::string_view node) {
  return "cubridge.heartbeat." + std::string(node);
}

/// The desired version per module and cohort ("all", "canary"), and a halted rollout's reason.
inline constexpr std::string_view desired_bucket = "cubridge_desired";
[[nodiscard]] inline std::string desired_key(std::string_view module, std::string_view cohort) {
  return std::string(module) + "." + std::string(cohort);
}

/// A node's durable consumer on a module's bundle stream.
[[nodiscard]] inline std::string node_consumer(std::string_view node) {
  return "node_" + std::string(node);
}

}  // namespace cubridge::fleet
