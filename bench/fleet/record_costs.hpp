#pragma once
// What signing and checking the control plane's records costs (bench_fleet, part 2), measured
// with loops in the bench's own process: per record kind, sign_record (with the body's to_json),
// open_record (envelope, kind, signer, Ed25519 verify) and the body's parse; and what a gate's
// replay-state writes add to an apply (part 3: they are in neither verify_ms nor apply_ms).
#include <cstddef>
#include <filesystem>

namespace cubridge::bench {

/// Microseconds per operation (median of repeats) and the record's size in bytes.
struct record_cost {
  double sign_us = 0;   ///< to_json + sign_record
  double open_us = 0;   ///< open_record
  double parse_us = 0;  ///< parse_* of the opened body
  std::size_t bytes = 0;
  [[nodiscard]] double check_us() const noexcept { return open_us + parse_us; }
  [[nodiscard]] double all_us() const noexcept { return sign_us + open_us + parse_us; }
};

struct record_costs {
  record_cost result;     ///< a node's result record
  record_cost heartbeat;  ///< a node's heartbeat (with its last result)
  record_cost desired;    ///< a desired state with a full history (8 earlier versions)
  record_cost registry;   ///< a registry of `registry_nodes` nodes
  std::size_t registry_nodes = 0;
  int repeats = 0;
};

/// Measures each record kind; `registry_nodes` sizes the registry.
[[nodiscard]] record_costs measure_record_costs(std::size_t registry_nodes, int repeats);

/// One apply through a gate with a replay-state file under `dir` (fsync'd: record_pending
/// before the sink, settle after), over a sink that loads nothing: milliseconds, medians.
struct gate_push_cost {
  double push_ms = 0;    ///< update_gate::push, all of it
  double verify_ms = 0;  ///< its verify_time
  double apply_ms = 0;   ///< its apply_time (the sink)
  /// push - verify - apply: the two state writes and the checks between.
  [[nodiscard]] double state_ms() const noexcept { return push_ms - verify_ms - apply_ms; }
  int pushes = 0;
};
[[nodiscard]] gate_push_cost measure_gate_push(const std::filesystem::path& dir, int pushes);

}  // namespace cubridge::bench
