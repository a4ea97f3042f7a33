#pragma once
// A CUDA device, as the driver numbers it.

#include <cuda.h>
#include <cubridge/core/compute_capability.hpp>
#include <cubridge/core/error.hpp>

#include <array>
#include <cstddef>
#include <string>

namespace cubridge {

/// State of a device's primary context as the driver reports it (cuDevicePrimaryCtxGetState).
struct primary_context_state {
  bool active = false;
  unsigned flags = 0;  ///< CU_CTX_SCHED_* and friends
};

/// A device: a cheap value wrapping a CUdevice. Copyable.
class device {
 public:
  /// Number of devices. @throws driver_unavailable without a driver or GPU.
  [[nodiscard]] static int count();
  /// Device by ordinal. @throws error (CUDA_ERROR_INVALID_DEVICE) for an ordinal out of range.
  [[nodiscard]] static device get(int ordinal);
  /// Adopts a CUdevice obtained elsewhere (e.g. cuCtxGetDevice).
  [[nodiscard]] static device from_native(CUdevice handle) noexcept { return device(handle); }

  [[nodiscard]] CUdevice get() const noexcept { return handle_; }
  /// The ordinal (CUdevice values are ordinals on every current driver).
  [[nodiscard]] int ordinal() const noexcept { return static_cast<int>(handle_); }

  [[nodiscard]] std::string name() const;
  [[nodiscard]] int attribute(CUdevice_attribute which) const;
  [[nodiscard]] compute_capability capability() const;
  [[nodiscard]] std::size_t total_memory() const;
  [[nodiscard]] int multiprocessor_count() const;
  [[nodiscard]] std::array<unsigned char, 16> uuid() const;
  [[nodiscard]] primary_context_state primary_state() const;

  friend bool operator==(const device&, const device&) = default;

 private:
  explicit device(CUdevice handle) noexcept : handle_(handle) {}
  CUdevice handle_ = 0;
};

}  // namespace cubridge
