#pragma once
// What a guest context or a sandbox does when NVIDIA MPS serves its device (core/mps.hpp):
// under MPS a fatal fault of one client reaches every client on the GPU, so neither contains a
// fault there, and the MPS server's client contexts per device are few
// (mps_client_contexts_per_device). The caller chooses: go on silently, warn, or refuse.

#include <cubridge/core/error.hpp>
#include <cubridge/core/mps.hpp>
#include <cubridge/isolation/error.hpp>

#include <functional>
#include <source_location>
#include <string>
#include <string_view>

namespace cubridge {

/// What to do when MPS serves the device.
enum class mps_policy {
  allow,   ///< go on; MPS is not even looked for
  warn,    ///< go on after one line to the MPS warning sink (set_mps_warning_sink)
  refuse,  ///< throw mps_active_error
};

/// "allow", "warn", "refuse".
[[nodiscard]] std::string_view to_string(mps_policy policy) noexcept;

/// Raised under mps_policy::refuse when MPS serves the device (isolation_errc::mps_active).
/// what() names the component, the device, the signal that said so and what MPS means, e.g.
/// "enforce_mps_policy CUBRIDGE_MPS_ACTIVE (...): guest context 'vendor-fft' refused on device 0:
/// NVIDIA MPS serves device 0 (CU_DEVICE_ATTRIBUTE_MPS_ENABLED is 1): ...".
class mps_active_error : public error {
 public:
  mps_active_error(std::string component, mps_status status,
                   std::source_location where = std::source_location::current());
  /// What was refused, e.g. "guest context 'vendor-fft'".
  [[nodiscard]] const std::string& component() const noexcept { return component_; }
  /// What detect_mps found.
  [[nodiscard]] const mps_status& status() const noexcept { return status_; }

 private:
  std::string component_;
  mps_status status_;
};

/// Receives the warnings of mps_policy::warn, one line each (no trailing newline).
using mps_warning_sink = std::function<void(std::string_view line)>;

/// Replaces the process's MPS warning sink (thread-safe) and returns the previous one; an empty
/// sink restores the default, which writes each line to stderr.
mps_warning_sink set_mps_warning_sink(mps_warning_sink sink);

/// Applies `policy` for `component` ("guest context 'vendor-fft'", "sandbox 'libfft.so'") on
/// device `device`, with detect_mps(device) (the process's probe: core/mps.hpp).
/// allow: nothing, not even the detection; warn: if MPS is active, one line to the sink;
/// refuse: if MPS is active, throws.
/// @throws mps_active_error under refuse when MPS is active.
void enforce_mps_policy(mps_policy policy, int device, std::string_view component);

/// The same with a status detected already (detect_mps).
/// @throws mps_active_error under refuse when status.active.
void enforce_mps_policy(mps_policy policy, const mps_status& status, std::string_view component);

}  // namespace cubridge
