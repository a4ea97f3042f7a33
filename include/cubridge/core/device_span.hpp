#pragma once
// A typed, non-owning view of device memory, usable as T* (Runtime API, <<<>>> kernels, cuBLAS)
// and as CUdeviceptr (Driver API) at no cost: both are the same address under unified addressing.

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace cubridge {

template <class T>
class device_span {
 public:
  using element_type = T;
  constexpr device_span() noexcept = default;
  constexpr device_span(T* data, std::size_t size) noexcept : data_(data), size_(size) {}
  /// Adopts driver memory: `address` must point to `size` elements of T.
  [[nodiscard]] static device_span from_native(CUdeviceptr address, std::size_t size) noexcept {
    return device_span(reinterpret_cast<T*>(static_cast<std::uintptr_t>(address)), size);
  }
  /// A span of const T converts from a span of T.
  template <class U>
  requires std::is_convertible_v<U (*)[], T (*)[]>
  constexpr device_span(device_span<U> other) noexcept  // NOLINT(google-explicit-constructor)
      : data_(other.data()), size_(other.size()) {}

  [[nodiscard]] constexpr T* data() const noexcept { return data_; }
  /// The same address as a CUdeviceptr, for Driver API calls.
  [[nodiscard]] CUdeviceptr address() const noexcept {
    return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(data_));
  }
  [[nodiscard]] constexpr std::size_t size() const noexcept { return size_; }
  [[nodiscard]] constexpr std::size_t size_bytes() const noexcept { return size_ * sizeof(T); }
  [[nodiscard]] constexpr bool empty() const noexcept { return size_ == 0; }
  /// Elements [offset, offset + count). No bounds check beyond a debug assertion's worth: it is
  /// a view, like std::span.
  [[nodiscard]] constexpr device_span subspan(std::size_t offset,
                                              std::size_t count) const noexcept {
    return device_span(data_ + offset, count);
  }
  /// Device pointer for runtime code and kernels.
  constexpr operator T*() const noexcept { return data_; }  // NOLINT(google-explicit-constructor)

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace cubridge
