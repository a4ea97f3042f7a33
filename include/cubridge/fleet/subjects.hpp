#pragma once
// Where the fleet's control plane lives in NATS JetStream (docs/fleet.md, "Subjects, streams and
// buckets"): stream, subject, bucket and key names, written once for the agent, the control side,
// the server configuration `cubridge fleet init` writes (its permissions name these subjects)
// and the tests. Pure string work: no NATS client needed to include it.
//
//   bucket  cubridge_fleet (stream KV_cubridge_fleet)
//             desired.<m>   the operator-signed desired state of module <m>
//             registry      the operator-signed registry of enrolled nodes and their keys
//   stream  CUBRIDGE_BUNDLES_<m>   cubridge.bundle.<m>.<version>.<digest16>   one bundle each
//   stream  CUBRIDGE_RESULTS       cubridge.result.<m>.<node>                 node-signed,
//                                  only for modules <m> with a desired state
//   stream  CUBRIDGE_HEARTBEATS    cubridge.heartbeat.<node>                  node-signed

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace cubridge::fleet {

/// The longest module name or node id the fleet takes: each is one subject token and part of a
/// stream or key name.
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

/// The key-value bucket of the control plane's state.
inline constexpr std::string_view control_bucket = "cubridge_fleet";
/// The stream that holds the bucket (JetStream's naming).
inline constexpr std::string_view control_bucket_stream = "KV_cubridge_fleet";
/// The key of a module's desired state.
[[nodiscard]] inline std::string desired_key(std::string_view module) {
  return "desired." + std::string(module);
}
/// The key of the node registry.
inline constexpr std::string_view registry_key = "registry";

/// The stream of one module's bundles, one subject per version and digest.
[[nodiscard]] inline std::string bundle_stream(std::string_view module) {
  return "CUBRIDGE_BUNDLES_" + std::string(module);
}
/// Every subject of a module's bundle stream.
[[nodiscard]] inline std::string bundle_subjects(std::string_view module) {
  return "cubridge.bundle." + std::string(module) + ".>";
}
/// The hex digits of a bundle's SHA-256 that name its subject (the full digest is checked).
inline constexpr std::size_t subject_digest_chars = 16;
/// The subject of version `version` of `module` whose bundle's SHA-256 is `digest` (64 hex).
[[nodiscard]] inline std::string bundle_subject(std::string_view module, std::uint64_t version,
                                                std::string_view digest) {
  return "cubridge.bundle." + std::string(module) + "." + std::to_string(version) + "." +
         std::string(digest.substr(0, subject_digest_chars));
}

/// Results of every node, one subject per module and node.
inline constexpr std::string_view result_stream = "CUBRIDGE_RESULTS";
[[nodiscard]] inline std::string result_subject(std::string_view module, std::string_view node) {
  return "cubridge.result." + std::string(module) + "." + std::string(node);
}
/// Every node's results of `module`: the results stream stores these subjects for each module
/// with a desired state, and no other.
[[nodiscard]] inline std::string result_subjects(std::string_view module) {
  return result_subject(module, "*");
}

/// Heartbeats, one subject per node (the last heartbeats_kept of each).
inline constexpr std::string_view heartbeat_stream = "CUBRIDGE_HEARTBEATS";
inline constexpr std::string_view heartbeat_subject_prefix = "cubridge.heartbeat.";
/// Heartbeats the stream keeps per node: a few, so that one forged or replayed message never
/// hides the node's own newest one from a reader that starts now.
inline constexpr int heartbeats_kept = 8;
[[nodiscard]] inline std::string heartbeat_subject(std::string_view node) {
  return std::string(heartbeat_subject_prefix) + std::string(node);
}

}  // namespace cubridge::fleet
