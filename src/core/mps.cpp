#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/detail/enum_names.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/mps.hpp>

#include <cuda.h>

#include <array>
#include <cstdlib>
#include <mutex>
#include <system_error>
#include <utility>

namespace cubridge {

std::string_view to_string(mps_attribute value) noexcept {
  static constexpr std::array<detail::enum_name<mps_attribute>, 3> names{{
      {mps_attribute::unknown, "unknown"},
      {mps_attribute::enabled, "enabled"},
      {mps_attribute::disabled, "disabled"},
  }};
  static_assert(detail::lists_values_in_order(names));
  return detail::name_of(names, value, "unknown");
}

std::string_view to_string(mps_signal value) noexcept {
  static constexpr std::array<detail::enum_name<mps_signal>, 3> names{{
      {mps_signal::none, "none"},
      {mps_signal::device_attribute, "device_attribute"},
      {mps_signal::control_pipe, "control_pipe"},
  }};
  static_assert(detail::lists_values_in_order(names));
  return detail::name_of(names, value, "unknown");
}

namespace {

std::optional<std::string> process_environment(const char* name) {
  const char* value = std::getenv(name);
  if (!value) return std::nullopt;
  return std::string(value);
}

std::optional<bool> driver_mps_attribute(int ordinal, std::string& why_unknown) {
  if (!driver::available()) {
    why_unknown = "no driver (" + driver::unavailable_reason() + ")";
    return std::nullopt;
  }
  const auto& cu = driver::api();
  CUdevice dev{};
  if (const CUresult r = cu.cuDeviceGet(&dev, ordinal); r != CUDA_SUCCESS) {
    why_unknown = "no device " + std::to_string(ordinal) + " (cuDeviceGet " +
                  detail::driver_error_name(r) + ")";
    return std::nullopt;
  }
  int value = 0;
  if (const CUresult r = cu.cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_MPS_ENABLED, dev);
      r != CUDA_SUCCESS) {
    why_unknown = "cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_MPS_ENABLED) on device " +
                  std::to_string(ordinal) + " returned " + detail::driver_error_name(r);
    return std::nullopt;
  }
  return value != 0;
}

/// What the control daemon listens on: a named pipe (FIFO) in older drivers, a UNIX socket in
/// newer ones; anything else (a plain file, nothing) is no daemon.
bool is_control_pipe(const std::filesystem::path& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  return !ec && (std::filesystem::is_fifo(status) || std::filesystem::is_socket(status));
}

std::string describe_meaning(const mps_status& s) {
  const std::string device = "device " + std::to_string(s.device);
  const std::string pipe = s.control_pipe().string();
  if (s.active) {
    const std::string found =
        s.decided_by == mps_signal::device_attribute
            ? "NVIDIA MPS serves " + device + " (CU_DEVICE_ATTRIBUTE_MPS_ENABLED is 1)"
            : "an NVIDIA MPS control daemon listens at " + pipe + " (the device attribute is " +
                  s.attribute_detail + "), so CUDA started here would be its client";
    return found + ": the MPS server takes at most " +
           std::to_string(mps_client_contexts_per_device) +
           " client contexts per device (48 up to CUDA 13.0) among all its clients, and a fatal "
           "fault in one client "
           "reaches every client on that GPU, so neither a guest context nor the sandbox "
           "contains a fault there";
  }
  if (s.decided_by == mps_signal::device_attribute)
    return "no MPS on " + device +
           " (CU_DEVICE_ATTRIBUTE_MPS_ENABLED is 0): guest contexts and the sandbox contain "
           "what docs/isolation.md says";
  std::string text = "no MPS seen: no control pipe at " + pipe + " and the device attribute is " +
                     s.attribute_detail;
  if (!s.environment.empty()) text += "; MPS variables are set but no daemon listens";
  return text;
}

struct process_probe {
  std::mutex mutex;
  mps_probe probe = system_mps_probe();
};

process_probe& process() {
  static process_probe p;
  return p;
}

}  // namespace

mps_probe system_mps_probe() {
  mps_probe probe;
  probe.environment = process_environment;
  probe.device_attribute = driver_mps_attribute;
  return probe;
}

mps_status detect_mps(int device, const mps_probe& probe) {
  mps_status s;
  s.device = device;
  for (const auto name : mps_environment_variables) {
    const std::string n(name);
    if (auto value = probe.environment ? probe.environment(n.c_str()) : std::nullopt)
      s.environment.push_back({n, std::move(*value)});
  }
  const auto pipe_dir = probe.environment ? probe.environment("CUDA_MPS_PIPE_DIRECTORY")
                                          : std::optional<std::string>{};
  s.pipe_directory_from_environment = pipe_dir && !pipe_dir->empty();
  s.pipe_directory = s.pipe_directory_from_environment ? std::filesystem::path(*pipe_dir)
                                                       : probe.default_pipe_directory;
  s.control_pipe_present = is_control_pipe(s.control_pipe());

  std::string why_unknown = "not asked (the probe has no attribute reader)";
  const auto enabled =
      probe.device_attribute ? probe.device_attribute(device, why_unknown) : std::nullopt;
  if (enabled) {
    s.attribute = *enabled ? mps_attribute::enabled : mps_attribute::disabled;
    s.attribute_detail = std::string(to_string(s.attribute));
    // The driver knows: a daemon it did not connect to (another user's, a stale pipe) does not
    // serve this process.
    s.active = *enabled;
    s.decided_by = mps_signal::device_attribute;
  } else {
    s.attribute_detail = "unknown: " + why_unknown;
    s.active = s.control_pipe_present;
    s.decided_by = s.control_pipe_present ? mps_signal::control_pipe : mps_signal::none;
  }
  s.meaning = describe_meaning(s);
  return s;
}

mps_status detect_mps(int device) {
  auto& p = process();
  mps_probe probe;
  {
    std::lock_guard lock(p.mutex);
    probe = p.probe;
  }
  return detect_mps(device, probe);
}

mps_probe set_mps_probe(mps_probe probe) {
  auto& p = process();
  std::lock_guard lock(p.mutex);
  return std::exchange(p.probe, std::move(probe));
}

}  // namespace cubridge
