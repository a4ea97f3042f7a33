#pragma once
// `cubridge coldstart`: every phase of a CUDA program's start, timed in a fresh child process per
// run (the tool runs itself as `cubridge coldstart-probe`, see probe.hpp), under LAZY and EAGER
// module loading; median / min / max per phase as a table, every run's numbers as JSON, and a
// stacked-bar chart as SVG.

#include "phase_timings.hpp"
#include "probe.hpp"
#include "spawn.hpp"

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace cubridge::tool::coldstart {

/// The command line of `cubridge coldstart`.
struct options {
  int runs = 10;
  std::string loading = "both";        ///< lazy | eager | both
  std::vector<std::string> scenarios;  ///< scenarios() keys; empty: all
  std::string json_path;               ///< --json FILE
  std::string chart_path;              ///< --chart FILE.svg
  std::string from_path;               ///< --from FILE: render an earlier --json, run nothing
  int device = 0;
  int timeout_s = 60;  ///< per child
  /// Hidden (--probe-command): the program run as the child instead of this cubridge; it gets
  /// the same arguments ("coldstart-probe ..."). For tests of the parent without a GPU.
  std::string probe_command;
};

/// The loading modes `options::loading` names, LAZY first.
[[nodiscard]] std::vector<loading_mode> loading_modes(const std::string& loading);

/// The scenarios to run for `keys` (all when empty), in scenarios() order. ptx-warm needs a
/// ptx-cold child before it to fill the JIT cache: `warm_up_only` tells whether ptx-cold runs
/// only for that (and is then not reported).
struct run_plan {
  std::vector<scenario> scenarios;
  bool warm_up_only = false;
};
[[nodiscard]] run_plan plan_scenarios(const std::vector<std::string>& keys);

/// What one child's outcome means: its measurements, or the phase it failed, crashed or hung in.
[[nodiscard]] run_result interpret_child(const child_outcome& outcome, loading_mode loading,
                                         scenario scen, int run);

/// Registers `coldstart` and the hidden `coldstart-probe` on `app`. Not movable: CLI11 keeps
/// pointers to the members.
class command {
 public:
  explicit command(CLI::App& app);
  command(const command&) = delete;
  command& operator=(const command&) = delete;

  /// True when the command line named coldstart or coldstart-probe.
  [[nodiscard]] bool parsed() const;
  /// Runs what was parsed; returns the exit status (tools/exit_codes.hpp). Never throws.
  [[nodiscard]] int run() const noexcept;

  [[nodiscard]] const options& parsed_options() const noexcept { return options_; }

 private:
  CLI::App* coldstart_ = nullptr;
  CLI::App* probe_ = nullptr;
  options options_;
  probe_options probe_options_;
};

/// `cubridge coldstart` with `o`: measures (or renders --from), prints the table on stdout,
/// progress on stderr. Returns the exit status; never throws.
[[nodiscard]] int run_coldstart(const options& o) noexcept;

}  // namespace cubridge::tool::coldstart
