#pragma once
// The one exception type of cubridge and the checks that raise it.

#include <array>
#include <cstddef>
#include <source_location>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace cubridge {

/// Which library reported a failure.
enum class error_source {
  driver,     ///< a CUresult from the Driver API
  runtime,    ///< a cudaError_t from the Runtime API
  nvrtc,      ///< an nvrtcResult
  nvjitlink,  ///< an nvJitLinkResult
  cubridge,   ///< a check of cubridge itself: a code of one layer's error_domain (error::domain())
};

/// One code of a layer: its value, its name ("CUBRIDGE_BAD_IMAGE") and what it means.
struct error_code_info {
  int code = 0;
  std::string_view name{};
  std::string_view description{};
};

/// The codes one layer of cubridge reports itself (as std::error_category does for
/// std::error_code): each layer owns its enum and its domain, so the core knows none of the
/// others'. A domain is an `inline constexpr` object named by `error_domain_of<Enum>`.
class error_domain {
 public:
  template <std::size_t N>
  constexpr error_domain(std::string_view layer,
                         const std::array<error_code_info, N>& codes) noexcept
      : layer_(layer), codes_(codes.data()), count_(N) {}

  /// The layer, e.g. "core", "swap": two domains are the same when their layers are.
  [[nodiscard]] constexpr std::string_view layer() const noexcept { return layer_; }
  /// The code's name, or "CUBRIDGE_UNKNOWN" for a value the layer does not list.
  [[nodiscard]] constexpr std::string_view name(int code) const noexcept {
    const auto* info = find(code);
    return info ? info->name : "CUBRIDGE_UNKNOWN";
  }
  [[nodiscard]] constexpr std::string_view description(int code) const noexcept {
    const auto* info = find(code);
    return info ? info->description : "unknown cubridge error";
  }

 private:
  [[nodiscard]] constexpr const error_code_info* find(int code) const noexcept {
    for (std::size_t i = 0; i < count_; ++i)
      if (codes_[i].code == code) return &codes_[i];
    return nullptr;
  }
  std::string_view layer_;
  const error_code_info* codes_;
  std::size_t count_;
};

/// The domain of a layer's code enum; each layer specialises it next to its enum.
template <class Code>
inline constexpr const error_domain* error_domain_of = nullptr;

/// Codes of the core (error_source::cubridge, domain "core"): the driver, images, launches,
/// contexts, preconditions and files. The other layers' codes: swap/error.hpp,
/// isolation/error.hpp, update/error.hpp.
enum class errc {
  no_driver = 1,         ///< libcuda.so.1 could not be loaded or lacks an entry point
  bad_image,             ///< bytes that are not a valid cubin, fatbin or PTX image
  incompatible_image,    ///< a valid image with no code for the target device
  bad_launch_arguments,  ///< argument count or sizes do not match the kernel
  context_reset,         ///< a context was destroyed or reset behind the program's back
  precondition,          ///< a caller broke a documented precondition
  io,                    ///< reading a file failed
};

inline constexpr std::array<error_code_info, 7> core_error_codes{{
    {static_cast<int>(errc::no_driver), "CUBRIDGE_NO_DRIVER", "no usable CUDA driver"},
    {static_cast<int>(errc::bad_image), "CUBRIDGE_BAD_IMAGE", "not a valid GPU image"},
    {static_cast<int>(errc::incompatible_image), "CUBRIDGE_INCOMPATIBLE_IMAGE",
     "image has no code for this device"},
    {static_cast<int>(errc::bad_launch_arguments), "CUBRIDGE_BAD_LAUNCH_ARGUMENTS",
     "launch arguments do not match the kernel"},
    {static_cast<int>(errc::context_reset), "CUBRIDGE_CONTEXT_RESET",
     "context was reset or destroyed by someone else"},
    {static_cast<int>(errc::precondition), "CUBRIDGE_PRECONDITION", "precondition violated"},
    {static_cast<int>(errc::io), "CUBRIDGE_IO", "input/output failure"},
}};
inline constexpr error_domain core_error_domain{"core", core_error_codes};
template <>
inline constexpr const error_domain* error_domain_of<errc> = &core_error_domain;

/// Name of a core code, e.g. "CUBRIDGE_BAD_IMAGE".
[[nodiscard]] std::string_view to_string(errc code) noexcept;
/// Name of any other layer's code, e.g. "CUBRIDGE_VERSION_REJECTED" (swap_errc), through the
/// domain its layer registered as error_domain_of<Code>: one definition for every layer.
template <class Code>
requires std::is_enum_v<Code> &&(error_domain_of<Code> != nullptr)
    [[nodiscard]] constexpr std::string_view to_string(Code code) noexcept {
  return error_domain_of<Code>->name(static_cast<int>(code));
}

/// Every failure cubridge reports. what() reads like
/// "cuModuleUnload CUDA_ERROR_INVALID_HANDLE (invalid resource handle): unloading module 'filters'
///  in context 0x5581 on device 0 [src/core/module.cpp:42]".
class error : public std::runtime_error {
 public:
  /// A failure of a library (driver, runtime, NVRTC, nvJitLink): its code, named and described.
  error(error_source source, int code, std::string code_name, std::string description,
        std::string call, std::string involved, std::source_location where);
  /// A failure cubridge detected itself: `code` of `domain`, named by it and described by
  /// `description` (empty: the domain's description of the code).
  error(const error_domain& domain, int code, std::string description, std::string call,
        std::string involved, std::source_location where);

  [[nodiscard]] error_source source() const noexcept { return source_; }
  /// The raw code: a CUresult, cudaError_t, nvrtcResult, nvJitLinkResult or a layer's code.
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
  /// For error_source::cubridge: the layer's domain the code belongs to; otherwise nullptr.
  [[nodiscard]] const error_domain* domain() const noexcept { return domain_; }
  /// True for a failure with this code of its layer (errc, swap_errc, isolation_errc, ...).
  template <class Code>
  [[nodiscard]] bool is(Code c) const noexcept {
    static_assert(error_domain_of<Code> != nullptr, "not a cubridge error code enum");
    return domain_ && domain_->layer() == error_domain_of<Code>->layer() &&
           code_ == static_cast<int>(c);
  }

 private:
  error_source source_;
  int code_;
  std::string code_name_;
  std::string description_;
  std::string call_;
  std::string involved_;
  std::source_location where_;
  const error_domain* domain_ = nullptr;
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

/// Raised when a context was reset or destroyed by someone else (e.g. cudaDeviceReset).
class context_reset_error : public error {
 public:
  using error::error;
};

namespace detail {
/// Throws the errc-specific subclass of error (image_error, launch_argument_error, ...).
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
