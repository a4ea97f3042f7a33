// `cubridge doctor`: what this process would pay at start-up, and why.
#include "doctor.hpp"

#include <cubridge/core/compute_capability.hpp>
#include <cubridge/core/device.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/core/installation.hpp>
#include <cubridge/core/mps.hpp>
#include <cubridge/core/reset_guard_status.hpp>
#include <cubridge/version.hpp>

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <sstream>

namespace cubridge::tool {
namespace {

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

nlohmann::json environment() {
  nlohmann::json env;
  const std::string loading = env_or("CUDA_MODULE_LOADING", "");
  env["CUDA_MODULE_LOADING"] = loading.empty() ? "(unset: LAZY)" : loading;
  env["module_loading_note"] =
      loading == "EAGER" ? "every kernel of every module is loaded at module load: slower start, "
                           "no first-launch surprise"
                         : "kernels load at first use: fast start, the first launch of each kernel "
                           "pays its load (prewarm moves that out of the first request)";
  env["CUDA_CACHE_DISABLE"] = env_or("CUDA_CACHE_DISABLE", "(unset: 0)");
  env["CUDA_CACHE_PATH"] = env_or("CUDA_CACHE_PATH", "(unset: ~/.nv/ComputeCache)");
  env["CUDA_CACHE_MAXSIZE"] = env_or("CUDA_CACHE_MAXSIZE", "(unset: driver default)");
  env["jit_cache_note"] = env_or("CUDA_CACHE_DISABLE", "0") == std::string("1")
                              ? "the driver JIT cache is off: every PTX load compiles again "
                                "(~100 ms for a one-line kernel)"
                              : "PTX compiled by the driver is cached on disk; the first load on a "
                                "machine still pays the full JIT";
  return env;
}

/// MPS as detect_mps sees it for device 0 (the devices' own attribute: devices[].mps_enabled).
nlohmann::json mps() {
  const auto s = detect_mps(0);
  nlohmann::json variables = nlohmann::json::object();
  for (const auto& v : s.environment) variables[v.name] = v.value;
  return {{"active", s.active},
          {"decided_by", std::string(to_string(s.decided_by))},
          {"device", s.device},
          {"device_attribute", std::string(to_string(s.attribute))},
          {"device_attribute_detail", s.attribute_detail},
          {"pipe_directory", s.pipe_directory.string()},
          {"pipe_directory_source",
           s.pipe_directory_from_environment ? "CUDA_MPS_PIPE_DIRECTORY" : "default"},
          {"control_pipe", s.control_pipe().string()},
          {"control_pipe_present", s.control_pipe_present},
          {"environment", variables},
          {"client_contexts_per_device", mps_client_contexts_per_device},
          {"meaning", s.meaning}};
}

// cubridge itself: its version, where its code is, which helpers it would use, and whether this
// process runs under the reset guard.
nlohmann::json installation() {
  nlohmann::json helpers;
  for (const auto which :
       {helper_file::sandbox_worker, helper_file::reset_guard, helper_file::probation_entry}) {
    const auto at = locate(which);
    helpers[std::string(to_string(which))] = {
        {"path", at.path.string()}, {"found_by", at.found_by}, {"found", at.found}};
  }
  const auto guard = reset_guard_state();
  return {{"version", std::string(version())},
          {"code", code_location().string()},
          {"helpers", helpers},
          {"reset_guard",
           {{"loaded", guard.loaded},
            {"policy", guard.policy},
            {"library", guard.library.string()},
            {"requested_by", guard.requested_by}}}};
}

std::string render_helper(const nlohmann::json& h) {
  const auto path = h["path"].get<std::string>();
  const auto how = h["found_by"].get<std::string>();
  return h["found"].get<bool>() ? path + " (" + how + ")"
                                : "NOT FOUND (last looked at " + path + ", " + how + ")";
}

std::string render_guard(const nlohmann::json& g) {
  const auto requested = g["requested_by"].get<std::string>();
  if (g["loaded"].get<bool>())
    return "GUARDED, policy " + g["policy"].get<std::string>() + " (" +
           g["library"].get<std::string>() + ")";
  if (!requested.empty())
    return "NOT GUARDED though " + requested +
           " asks for it: give LD_PRELOAD the full path, or run `cubridge guard -- PROGRAM`";
  return "not guarded (`cubridge guard -- PROGRAM` runs a program under the reset guard)";
}

}  // namespace

nlohmann::json diagnose() {
  nlohmann::json report;
  int runtime_version = 0;
  report["runtime_version"] =
      cudaRuntimeGetVersion(&runtime_version) == cudaSuccess ? runtime_version : 0;
  report["environment"] = environment();
  report["mps"] = mps();
  report["cubridge"] = installation();
  report["driver"]["available"] = driver::available();
  if (!driver::available()) {
    report["driver"]["reason"] = driver::unavailable_reason();
    return report;
  }
  report["driver"]["path"] = driver::library_path();
  report["driver"]["version"] = driver::version();
  CUmoduleLoadingMode mode{};
  if (driver::api().cuModuleGetLoadingMode(&mode) == CUDA_SUCCESS)
    report["driver"]["module_loading"] = mode == CU_MODULE_LAZY_LOADING ? "LAZY" : "EAGER";
  nlohmann::json devices = nlohmann::json::array();
  for (int i = 0; i < device::count(); ++i) {
    const auto dev = device::get(i);
    const auto cc = dev.capability();
    const auto state = dev.primary_state();
    const auto device_mps = detect_mps(i);
    devices.push_back(
        {{"ordinal", i},
         {"name", dev.name()},
         {"compute_capability", std::to_string(cc.major) + "." + std::to_string(cc.minor)},
         {"arch", to_string(cc)},
         {"memory_bytes", dev.total_memory()},
         {"multiprocessors", dev.multiprocessor_count()},
         {"primary_context_active", state.active},
         {"primary_context_flags", state.flags},
         {"mps_enabled", device_mps.attribute == mps_attribute::unknown
                             ? nlohmann::json(nullptr)
                             : nlohmann::json(device_mps.attribute == mps_attribute::enabled)}});
  }
  report["devices"] = devices;
  return report;
}

std::string render_table(const nlohmann::json& r) {
  std::ostringstream out;
  const auto& d = r["driver"];
  out << "driver            ";
  if (!d["available"].get<bool>()) {
    out << "UNAVAILABLE: " << d["reason"].get<std::string>() << "\n";
  } else {
    const int v = d["version"].get<int>();
    out << v / 1000 << "." << v % 1000 / 10 << "  " << d["path"].get<std::string>() << "\n";
    out << "module loading    " << d.value("module_loading", std::string("?")) << "\n";
  }
  const int rv = r["runtime_version"].get<int>();
  out << "runtime           " << rv / 1000 << "." << rv % 1000 / 10 << " (linked statically)\n";
  if (r.contains("devices")) {
    for (const auto& dev : r["devices"]) {
      out << "device " << dev["ordinal"].get<int>() << "          "
          << dev["name"].get<std::string>() << ", " << dev["arch"].get<std::string>() << ", "
          << dev["memory_bytes"].get<std::size_t>() / (std::size_t{1024} * 1024) << " MiB, "
          << dev["multiprocessors"].get<int>() << " SMs, primary context "
          << (dev["primary_context_active"].get<bool>() ? "active" : "inactive") << " (flags "
          << dev["primary_context_flags"].get<unsigned>() << ")\n";
    }
  }
  if (r.contains("mps")) {
    const auto& m = r["mps"];
    const auto by = m["decided_by"].get<std::string>();
    out << "MPS               " << (m["active"].get<bool>() ? "DETECTED" : "not detected")
        << (by == "none" ? " (no signal)" : " (by " + by + ")") << ": device attribute "
        << m["device_attribute_detail"].get<std::string>() << ", control pipe "
        << m["control_pipe"].get<std::string>()
        << (m["control_pipe_present"].get<bool>() ? " present" : " absent") << "\n";
    out << "                  " << m["meaning"].get<std::string>() << "\n";
  }
  const auto& e = r["environment"];
  out << "CUDA_MODULE_LOADING " << e["CUDA_MODULE_LOADING"].get<std::string>() << ": "
      << e["module_loading_note"].get<std::string>() << "\n";
  out << "CUDA_CACHE_DISABLE  " << e["CUDA_CACHE_DISABLE"].get<std::string>() << ": "
      << e["jit_cache_note"].get<std::string>() << "\n";
  out << "CUDA_CACHE_PATH     " << e["CUDA_CACHE_PATH"].get<std::string>() << "\n";
  out << "CUDA_CACHE_MAXSIZE  " << e["CUDA_CACHE_MAXSIZE"].get<std::string>() << "\n";
  if (r.contains("cubridge")) {
    const auto& c = r["cubridge"];
    out << "cubridge          " << c["version"].get<std::string>() << "  "
        << c["code"].get<std::string>() << "\n";
    out << "sandbox worker    " << render_helper(c["helpers"]["sandbox_worker"]) << "\n";
    out << "reset guard       " << render_helper(c["helpers"]["reset_guard"]) << "\n";
    out << "probation entry   " << render_helper(c["helpers"]["probation_entry"]) << "\n";
    out << "this process      " << render_guard(c["reset_guard"]) << "\n";
  }
  return out.str();
}

}  // namespace cubridge::tool
