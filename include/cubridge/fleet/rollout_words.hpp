#pragma once
// The closed sets a rollout's report is written in: why a wave rollout halted (halt_signal: the
// wave analysis's signals and the waves' own rules) and the steps of its timeline
// (rollout_step). One name table each (rollout_words.cpp); the names are what the CLI prints,
// the dashboard shows and Python's FleetController reports, spelled as they were.

#include <optional>
#include <string>
#include <string_view>

namespace cubridge::fleet {

/// Why a rollout halted. The first five are the wave analysis's signals (wave_analysis.hpp), the
/// rest the evidence and the rules a wave is held to (controller::rollout_waves).
enum class halt_signal {
  none,                ///< not halted
  sticky_error,        ///< a canary's context was poisoned by a sticky CUDA error
  probe,               ///< more canaries answered unhealthy to the health probe than allowed
  failure_rate,        ///< the canaries' launch failure rate breached its limit
  metric,              ///< a probe value breached its limit (the metric's name goes with it)
  baseline_unhealthy,  ///< the baseline breached on its own: halted for review
  canary_lost,         ///< a canary sent no heartbeat for longer than allowed
  canary_restarted,    ///< a canary's process started again during its wave
  canary_left,         ///< a canary serves another version than the candidate
  result,              ///< a canary refused or failed the candidate
  deadline,            ///< the wave did not finish before its deadline
};

/// "sticky_error", "canary_lost", ... ("" for none).
[[nodiscard]] std::string_view to_string(halt_signal signal) noexcept;
/// The signal spelled `name`; nullopt for any other text (and for "").
[[nodiscard]] std::optional<halt_signal> parse_halt_signal(std::string_view name) noexcept;
/// The signal as reports print it: its name, "metric:<name>" for a metric.
[[nodiscard]] std::string signal_text(halt_signal signal, std::string_view metric);

/// One step of a rollout's timeline.
enum class rollout_step {
  started,    ///< a wave started
  applied,    ///< every node of the wave runs the candidate
  passed,     ///< the wave stayed healthy for its bake
  halted,     ///< the rollout halted (halt_signal says why)
  completed,  ///< the candidate is stable on every node
};

/// "started", "applied", "passed", "halted", "completed".
[[nodiscard]] std::string_view to_string(rollout_step step) noexcept;

}  // namespace cubridge::fleet
