#pragma once
// What loading a module and loading a library share (module.cpp, library.cpp): the driver's JIT
// options and log buffers, the image as the driver takes it (targets checked, PTX terminated),
// and a load error with its JIT log. Internal to cubridge_core.
#include <cubridge/core/detail/loaded_kernels.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/image.hpp>
#include <cubridge/core/module.hpp>

#include <cuda.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace cubridge::core_internal {

/// The driver's JIT options and the log buffers they point into.
struct jit_logs {
  explicit jit_logs(const load_options& o)
      : info(o.log_bytes + 1, '\0'), error(o.log_bytes + 1, '\0') {
    add(CU_JIT_INFO_LOG_BUFFER, info.data());
    add(CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, reinterpret_cast<void*>(o.log_bytes));
    add(CU_JIT_ERROR_LOG_BUFFER, error.data());
    add(CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, reinterpret_cast<void*>(o.log_bytes));
    if (o.jit_optimization_level >= 0)
      add(CU_JIT_OPTIMIZATION_LEVEL,
          reinterpret_cast<void*>(static_cast<std::uintptr_t>(o.jit_optimization_level)));
  }
  void add(CUjit_option option, void* value) {
    options.push_back(option);
    values.push_back(value);
  }
  [[nodiscard]] std::string info_text() const { return info.c_str(); }
  [[nodiscard]] std::string error_text() const { return error.c_str(); }
  std::string info, error;
  std::vector<CUjit_option> options;
  std::vector<void*> values;
};

/// Bytes the driver can take: the caller's image as it is, or, for PTX without its trailing NUL
/// (as a file's bytes usually are), a terminated copy. Machine code is never copied.
class driver_image {
 public:
  /// Checks the targets of `image`, whose inspect_image is `info`. @throws image_error
  driver_image(std::span<const std::byte> image, const image_info& info,
               const load_options& options, std::optional<compute_capability> target,
               const std::string& what)
      : image_(image) {
    if (options.check_target && target) require_runs_on(info, *target, what);
    if (target) expected_kernels_ = detail::kernels_every_entry_defines(info, *target);
    if (info.kind == image_kind::ptx && (image.empty() || image.back() != std::byte{0})) {
      terminated_.assign(image.begin(), image.end());
      terminated_.push_back(std::byte{0});
    }
  }
  [[nodiscard]] const void* data() const noexcept {
    return terminated_.empty() ? static_cast<const void*>(image_.data()) : terminated_.data();
  }
  /// The kernels the loaded module or library must have (kernels_every_entry_defines).
  [[nodiscard]] const std::vector<std::string>& expected_kernels() const noexcept {
    return expected_kernels_;
  }

 private:
  std::span<const std::byte> image_;
  std::vector<std::byte> terminated_;
  std::vector<std::string> expected_kernels_;
};

inline std::string with_log(std::string what, const std::string& log) {
  if (!log.empty()) what += "; JIT log: " + log;
  return what;
}

}  // namespace cubridge::core_internal
