#pragma once
// Whether NVIDIA MPS (the Multi-Process Service) serves this process's contexts on a device.
//
// Under MPS the contexts of every client process on a GPU are served by one MPS server: it takes
// at most 60 client CUDA contexts per device (48 up to CUDA 13.0) among all its clients, and a
// fatal fault of one client reaches every client on that GPU. So neither a guest context nor a
// sandbox worker contains a fault there (docs/isolation.md, "Under MPS").
//
// Two signals, in this order:
// - the device attribute CU_DEVICE_ATTRIBUTE_MPS_ENABLED, which says whether contexts created on
//   the device are shared through MPS: it decides whenever the driver can be asked;
// - without a driver, the control daemon's pipe `control` in the pipe directory
//   (CUDA_MPS_PIPE_DIRECTORY, default /tmp/nvidia-mps): CUDA started here would connect to it.
// The MPS variables of the environment are reported; alone they decide nothing.
//
// The inputs are an mps_probe, replaceable (set_mps_probe), so that tests decide the result on
// machines without MPS.

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cubridge {

/// What CU_DEVICE_ATTRIBUTE_MPS_ENABLED says of a device.
enum class mps_attribute {
  unknown,   ///< it could not be read (no driver, no such device, a driver without it)
  enabled,   ///< contexts created on the device are shared through MPS
  disabled,  ///< they are not
};

/// "unknown", "enabled", "disabled".
[[nodiscard]] std::string_view to_string(mps_attribute value) noexcept;

/// Which signal decided mps_status::active.
enum class mps_signal {
  none,              ///< no signal: the attribute is unknown and there is no control pipe
  device_attribute,  ///< CU_DEVICE_ATTRIBUTE_MPS_ENABLED, enabled or disabled
  control_pipe,      ///< the attribute is unknown; the control daemon's pipe is there
};

/// "none", "device_attribute", "control_pipe".
[[nodiscard]] std::string_view to_string(mps_signal value) noexcept;

/// The client CUDA contexts an MPS server takes per device, among all its clients (NVIDIA's MPS
/// documentation: 60, up from 48 with CUDA 13.0 and before).
inline constexpr int mps_client_contexts_per_device = 60;

/// The MPS variables of the environment that detect_mps reports (those that are set).
inline constexpr std::string_view mps_environment_variables[] = {
    "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_CLIENT_PRIORITY"};

/// One MPS variable that is set, with its value.
struct mps_variable {
  std::string name{};
  std::string value{};
};

/// What detect_mps found for one device.
struct mps_status {
  /// MPS serves this process's contexts on the device (as far as the signals tell).
  bool active = false;
  /// The signal that decided `active`.
  mps_signal decided_by = mps_signal::none;
  /// The device ordinal the attribute was asked for.
  int device = 0;
  /// CU_DEVICE_ATTRIBUTE_MPS_ENABLED of the device.
  mps_attribute attribute = mps_attribute::unknown;
  /// "enabled", "disabled", or why it is unknown: "unknown: no driver (...)".
  std::string attribute_detail{};
  /// CUDA_MPS_PIPE_DIRECTORY, or the default /tmp/nvidia-mps when it is unset or empty.
  std::filesystem::path pipe_directory{};
  /// Whether pipe_directory came from CUDA_MPS_PIPE_DIRECTORY.
  bool pipe_directory_from_environment = false;
  /// pipe_directory/control exists and is a FIFO or a socket (what the control daemon listens on).
  bool control_pipe_present = false;
  /// The MPS variables that are set (mps_environment_variables, in that order).
  std::vector<mps_variable> environment{};
  /// One line: what was found and what it means for guest contexts and the sandbox.
  std::string meaning{};

  /// pipe_directory / "control".
  [[nodiscard]] std::filesystem::path control_pipe() const { return pipe_directory / "control"; }
};

/// The inputs of detect_mps. Tests replace them to decide the result without MPS.
struct mps_probe {
  /// The value of an environment variable, nullopt when unset. Default: the process's
  /// environment (std::getenv).
  std::function<std::optional<std::string>(const char* name)> environment{};
  /// CU_DEVICE_ATTRIBUTE_MPS_ENABLED of a device ordinal, or nullopt with the reason written to
  /// `why_unknown` ("no driver (...)"). Default: the driver, never throwing.
  std::function<std::optional<bool>(int device, std::string& why_unknown)> device_attribute{};
  /// The pipe directory when CUDA_MPS_PIPE_DIRECTORY is unset or empty.
  std::filesystem::path default_pipe_directory = "/tmp/nvidia-mps";
};

/// The real inputs: the process's environment, the driver, /tmp/nvidia-mps.
[[nodiscard]] mps_probe system_mps_probe();

/// What `probe` says of MPS for `device`. A probe function left empty counts as "unset" (the
/// environment) or "unknown" (the attribute).
/// @throws std::bad_alloc only; filesystem errors count as "no control pipe".
[[nodiscard]] mps_status detect_mps(int device, const mps_probe& probe);

/// detect_mps(device, the process's probe): system_mps_probe() unless set_mps_probe replaced it.
[[nodiscard]] mps_status detect_mps(int device);

/// Replaces the process's probe (thread-safe) and returns the previous one. Tests fake MPS with
/// it; restore what it returned at the end.
mps_probe set_mps_probe(mps_probe probe);

}  // namespace cubridge
