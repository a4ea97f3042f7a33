#pragma once
// The one exception type of cubridge and the checks that raise it.

#include <source_location>
#include <stdexcept>
#include <string>
#include <string_view>

namespace cubridge {

/// Which layer reported a failure.
enum class error_source {
  driver,     ///< a CUresult from the Driver API
  runtime,    ///< a cudaError_t from the Runtime API
  nvrtc,      ///< an nvrtcResult
  nvjitlink,  ///< an nvJitLinkResult
  cubridge,   ///< a precondition or input check of cubridge itself (see errc)
};

/// Codes for failures that cubridge detects itself (error_source::cubridge).
enum class errc {
  no_driver = 1,         ///< libcuda.so.1 could not be loaded or lacks an entry point
  bad_image,             ///< bytes that are not a valid cubin, fatbin or PTX image
  incompatible_image,    ///< a valid image with no code for the target device
  bad_launch_arguments,  ///< argument count or sizes do not match the kernel
  context_reset,         ///< a context was destroyed or reset behind the program's back
  precondition,          ///< a caller broke a documented precondition
  io,                    ///< reading a file failed
  version_rejected,      ///< a new module version failed validation; the current one serves on
  bad_bundle,            ///< a signed module bundle was refused (see bundle_error::reason)
  guest_damage,          ///< a guest call broke the host's state (see guest_error::findings)
  sandbox_failure,       ///< a sandboxed call failed in its worker (see sandbox_error::reason)
};

/// Name of an errc value, e.g. "CUBRIDGE_BAD_IMAGE".
[[nodiscard]] std::string_view to_string(errc code) noexcept;

/// Every failure cubridge reports. what() reads like
/// "cuModuleUnload CUDA_ERROR_INVALID_HANDLE (invalid resource handle): unloading module 'filters'
///  in context 0x5581 on device 0 [src/module.cpp:42]".
class error : public std::runtime_error {
 public:
  error(error_source source, int code, std::string code_name, std::string description,
        std::string call, std::string involved, std::source_location where);

  [[nodiscard]] error_source source() const noexcept { return source_; }
  /// The raw code: a CUresult, cudaError_t, nvrtcResult, nvJitLinkResult or errc value.
  [[nodiscard]] int code() const noexcept { return code_; }
  /// Symbolic name of the code, e.g. "CUDA_ERROR_INVALID_HANDLE".
  [[nodiscard]] const std::string& code_name() const noexcept { return code_name_; }
  /// The library's own description of the code, e.g. "invalid resource handle".
  [[nodiscard]] const std::string& description() const noexcept { return description_; }
  /// The call that failed, e.g. "cuModuleLoadDataEx".
  [[nodiscard]] const std::string& call() const noexcept { return call_; }
  /// What was involved: module, kernel, context, device, parameter index.
  [[nodiscard]] const std::string& involved() const noexcept { return involved_; }
  [[nodiscard]] const std::source_location& where() const noexcept { return where_; }
  /// True for errc failures with this code.
  [[nodiscard]] bool is(errc e) const noexcept {
    return source_ == error_source::cubridge && code_ == static_cast<int>(e);
  }

 private:
  error_source source_;
  int code_;
  std::string code_name_;
  std::string description_;
  std::string call_;
  std::string involved_;
  std::source_location where_;
};

/// Raised when no usable CUDA driver is present (no libcuda.so.1, or it is too old).
class driver_unavailable : public error {
 public:
  using error::error;
};

/// Raised for bytes that are not a usable GPU image.
class image_error : public error {
 public:
  using error::error;
};

/// Raised when launch arguments do not match the kernel's parameter list.
class launch_argument_error : public error {
 public:
  using error::error;
};

/// Raised when a staged module version fails validation (missing kernel, changed parameters,
/// resources, smoke test). The version that was serving keeps serving.
class version_rejected_error : public error {
 public:
  using error::error;
};

/// Raised when a context was reset or destroyed by someone else (e.g. cudaDeviceReset).
class context_reset_error : public error {
 public:
  using error::error;
};

namespace detail {
/// Throws the errc-specific subclass of error.
[[noreturn]] void throw_errc(errc code, std::string call, std::string involved,
                             std::source_location where = std::source_location::current());
}  // namespace detail

}  // namespace cubridge

/// Precondition check: throws cubridge::error (errc::precondition) naming the broken condition.
#define CUBRIDGE_EXPECTS(condition, involved)                                      \
  do {                                                                             \
    if (!(condition)) [[unlikely]]                                                 \
      ::cubridge::detail::throw_errc(::cubridge::errc::precondition,               \
                                     "precondition (" #condition ")", (involved)); \
  } while (false)
