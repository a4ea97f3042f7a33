#include "phase_timings.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <stdexcept>

namespace cubridge::tool::coldstart {
namespace {

constexpr std::array<scenario_info, 5> scenario_table{{
    {scenario::cubin, "cubin", "cubin, primary context"},
    {scenario::ctx_create, "ctx-create", "cubin, cuCtxCreate context"},
    {scenario::ptx_cold, "ptx-cold", "PTX, JIT cache cold"},
    {scenario::ptx_warm, "ptx-warm", "PTX, JIT cache warm"},
    {scenario::nvrtc, "nvrtc", "NVRTC compile, then cubin"},
}};

// Colours: Tableau 10 plus a light green, so that neighbouring phases differ clearly.
constexpr std::array<phase_info, 12> phase_table{{
    {"process_start", "process start (exec, shared libraries)", "#bab0ac"},
    {"driver_load", "driver load (dlopen + cuGetProcAddress)", "#9c755f"},
    {"cu_init", "cuInit", "#4e79a7"},
    {"context", "first context", "#f28e2b"},
    {"first_alloc", "first cuMemAlloc (1 MiB)", "#edc948"},
    {"nvrtc_compile", "NVRTC compile", "#b07aa1"},
    {"module_load", "module load", "#e15759"},
    {"get_function", "cuModuleGetFunction", "#ff9da7"},
    {"first_launch", "first launch + sync", "#59a14f"},
    {"second_launch", "second launch + sync", "#8cd17d"},
    {"cublas_load", "cuBLAS load (dlopen)", "#d4a6c8"},
    {"cublas_create", "cublasCreate", "#76b7b2"},
}};

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

}  // namespace

std::string_view to_string(loading_mode mode) noexcept {
  return mode == loading_mode::lazy ? "lazy" : "eager";
}

std::string_view env_value(loading_mode mode) noexcept {
  return mode == loading_mode::lazy ? "LAZY" : "EAGER";
}

std::optional<loading_mode> parse_loading(std::string_view text) noexcept {
  const std::string l = lower(text);
  if (l == "lazy") return loading_mode::lazy;
  if (l == "eager") return loading_mode::eager;
  return std::nullopt;
}

std::span<const scenario_info> scenarios() noexcept {
  return scenario_table;
}

std::string_view to_string(scenario s) noexcept {
  for (const auto& i : scenario_table)
    if (i.id == s) return i.key;
  return "?";
}

std::string_view label(scenario s) noexcept {
  for (const auto& i : scenario_table)
    if (i.id == s) return i.label;
  return "?";
}

std::optional<scenario> parse_scenario(std::string_view key) noexcept {
  for (const auto& i : scenario_table)
    if (i.key == key) return i.id;
  return std::nullopt;
}

std::span<const phase_info> phases() noexcept {
  return phase_table;
}

const phase_info* find_phase(std::string_view key) noexcept {
  for (const auto& p : phase_table)
    if (p.key == key) return &p;
  return nullptr;
}

std::string phase_label(std::string_view phase, scenario s) {
  if (phase == "context")
    return s == scenario::ctx_create ? "first context: cuCtxCreate"
                                     : "first context: cuDevicePrimaryCtxRetain";
  if (phase == "module_load") {
    switch (s) {
      case scenario::ptx_cold:
        return "cuModuleLoadData: PTX, JIT cache cold";
      case scenario::ptx_warm:
        return "cuModuleLoadData: PTX, JIT cache warm";
      case scenario::nvrtc:
        return "cuModuleLoadData: NVRTC's cubin";
      default:
        return "cuModuleLoadData: cubin";
    }
  }
  if (phase == "nvrtc_compile") return "NVRTC compile to cubin";
  if (const auto* p = find_phase(phase)) return std::string(p->label);
  return std::string(phase);
}

double total_ms(const run_result& r) noexcept {
  double sum = 0;
  for (const auto& p : r.phases) sum += p.ms;
  return sum;
}

void to_json(nlohmann::json& j, const phase_time& p) {
  j = {{"phase", p.phase}, {"ms", p.ms}};
}

void from_json(const nlohmann::json& j, phase_time& p) {
  j.at("phase").get_to(p.phase);
  j.at("ms").get_to(p.ms);
}

void to_json(nlohmann::json& j, const run_result& r) {
  j = {{"run", r.run},
       {"loading", to_string(r.loading)},
       {"scenario", to_string(r.scen)},
       {"ok", r.ok},
       {"phases", r.phases}};
  if (!r.loading_reported.empty()) j["loading_reported"] = r.loading_reported;
  if (!r.ok) {
    j["failed_phase"] = r.failed_phase;
    j["error"] = r.error;
  }
}

void from_json(const nlohmann::json& j, run_result& r) {
  r.run = j.value("run", 0);
  const auto loading = parse_loading(j.at("loading").get<std::string>());
  if (!loading) throw std::invalid_argument("unknown loading mode " + j.at("loading").dump());
  r.loading = *loading;
  const auto scen = parse_scenario(j.at("scenario").get<std::string>());
  if (!scen) throw std::invalid_argument("unknown scenario " + j.at("scenario").dump());
  r.scen = *scen;
  j.at("ok").get_to(r.ok);
  r.phases = j.value("phases", std::vector<phase_time>{});
  r.loading_reported = j.value("loading_reported", std::string{});
  r.failed_phase = j.value("failed_phase", std::string{});
  r.error = j.value("error", std::string{});
}

void to_json(nlohmann::json& j, const machine_info& m) {
  j = {{"gpu", m.gpu},
       {"compute_capability", m.compute_capability},
       {"driver_version", m.driver_version},
       {"driver_release", m.driver_release},
       {"nvrtc_version", m.nvrtc_version},
       {"cublas_version", m.cublas_version},
       {"host", m.host}};
}

void from_json(const nlohmann::json& j, machine_info& m) {
  m.gpu = j.value("gpu", std::string{});
  m.compute_capability = j.value("compute_capability", 0);
  m.driver_version = j.value("driver_version", 0);
  m.driver_release = j.value("driver_release", std::string{});
  m.nvrtc_version = j.value("nvrtc_version", std::string{});
  m.cublas_version = j.value("cublas_version", 0);
  m.host = j.value("host", std::string{});
}

void to_json(nlohmann::json& j, const report& r) {
  j = {{"tool", "cubridge coldstart"}, {"format", 1},
       {"created", r.created},         {"runs_per_scenario", r.runs_per_scenario},
       {"machine", r.machine},         {"runs", r.runs}};
}

void from_json(const nlohmann::json& j, report& r) {
  r.created = j.value("created", std::string{});
  r.runs_per_scenario = j.value("runs_per_scenario", 0);
  r.machine = j.value("machine", machine_info{});
  r.runs = j.at("runs").get<std::vector<run_result>>();
}

}  // namespace cubridge::tool::coldstart
