#pragma once
// `cubridge coldstart`: what is measured (scenarios, phases) and the measurements themselves, with
// their JSON form. The child process (probe.cpp) writes a run_result as one JSON line; the parent
// collects them into a report, which --json writes and --from reads back.

#include <nlohmann/json.hpp>

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cubridge::tool::coldstart {

/// CUDA_MODULE_LOADING in the child's environment.
enum class loading_mode { lazy, eager };

/// "lazy" / "eager" (command line and JSON).
[[nodiscard]] std::string_view to_string(loading_mode mode) noexcept;
/// "LAZY" / "EAGER" (the value of CUDA_MODULE_LOADING).
[[nodiscard]] std::string_view env_value(loading_mode mode) noexcept;
/// Parses "lazy" / "eager" (any case); nullopt otherwise.
[[nodiscard]] std::optional<loading_mode> parse_loading(std::string_view text) noexcept;

/// One way to start: which first context, and which kind of module the program loads.
enum class scenario {
  cubin,       ///< primary context, cubin (NVRTC-built by the parent, read from a file)
  ctx_create,  ///< cuCtxCreate context instead of the primary one, same cubin
  ptx_cold,    ///< primary context, PTX through the driver JIT with an empty JIT cache
  ptx_warm,    ///< primary context, the same PTX again, with the cache ptx_cold filled
  nvrtc,       ///< primary context, NVRTC compile in the child, then its cubin
};

struct scenario_info {
  scenario id;
  std::string_view key;    ///< command line and JSON: "cubin", "ctx-create", ...
  std::string_view label;  ///< for people: "cubin, primary context"
};

/// Every scenario, in the order runs, tables and charts show them.
[[nodiscard]] std::span<const scenario_info> scenarios() noexcept;
[[nodiscard]] std::string_view to_string(scenario s) noexcept;
[[nodiscard]] std::string_view label(scenario s) noexcept;
[[nodiscard]] std::optional<scenario> parse_scenario(std::string_view key) noexcept;

/// One phase of a start, as a child pays them.
struct phase_info {
  std::string_view key;     ///< JSON and progress: "cu_init"
  std::string_view label;   ///< legend: "cuInit"
  std::string_view colour;  ///< chart fill, "#rrggbb"
};

/// Every phase, in the order the child runs them (a scenario skips those it does not have).
[[nodiscard]] std::span<const phase_info> phases() noexcept;
/// The phase with this key, or nullptr.
[[nodiscard]] const phase_info* find_phase(std::string_view key) noexcept;
/// The label of `phase` in a scenario's table, naming the exact call ("context: cuCtxCreate");
/// the key itself for unknown phases.
[[nodiscard]] std::string phase_label(std::string_view phase, scenario s);

/// One phase of one run.
struct phase_time {
  std::string phase;  ///< a phases() key
  double ms = 0;      ///< wall time, std::chrono::steady_clock, milliseconds
  friend bool operator==(const phase_time&, const phase_time&) = default;
};

/// One child process: one scenario under one loading mode.
struct run_result {
  int run = 0;  ///< 1-based run number (set by the parent)
  loading_mode loading = loading_mode::lazy;
  scenario scen = scenario::cubin;
  bool ok = false;
  std::vector<phase_time> phases;  ///< in the order paid; a failed run keeps those it finished
  std::string failed_phase;        ///< !ok: the phase that failed, crashed or timed out
  std::string error;               ///< !ok: what happened
  std::string loading_reported;    ///< cuModuleGetLoadingMode in the child: "LAZY" / "EAGER"
  friend bool operator==(const run_result&, const run_result&) = default;
};

/// The machine, as a child saw it.
struct machine_info {
  std::string gpu;             ///< "NVIDIA H200"
  int compute_capability = 0;  ///< major * 10 + minor, e.g. 90
  int driver_version = 0;      ///< cuDriverGetVersion, e.g. 13000
  std::string driver_release;  ///< from /proc/driver/nvidia/version, e.g. "580.159.04"
  std::string nvrtc_version;   ///< "13.0"
  int cublas_version = 0;      ///< cublasGetVersion, e.g. 130000
  std::string host;            ///< host name
  friend bool operator==(const machine_info&, const machine_info&) = default;
};

/// Everything one `cubridge coldstart` measured.
struct report {
  machine_info machine;
  int runs_per_scenario = 0;
  std::string created;  ///< UTC, ISO 8601
  std::vector<run_result> runs;
  friend bool operator==(const report&, const report&) = default;
};

/// Sum of a run's phases, in ms.
[[nodiscard]] double total_ms(const run_result& r) noexcept;

void to_json(nlohmann::json& j, const phase_time& p);
void from_json(const nlohmann::json& j, phase_time& p);
void to_json(nlohmann::json& j, const run_result& r);
/// @throws nlohmann::json::exception or std::invalid_argument for unknown scenarios / modes.
void from_json(const nlohmann::json& j, run_result& r);
void to_json(nlohmann::json& j, const machine_info& m);
void from_json(const nlohmann::json& j, machine_info& m);
/// The report without its summary (see aggregate.hpp: document()).
void to_json(nlohmann::json& j, const report& r);
/// Reads runs and machine; a "summary" member is ignored (it is recomputed from the runs).
void from_json(const nlohmann::json& j, report& r);

}  // namespace cubridge::tool::coldstart
