#pragma once
// Owning device memory, allocated through either API and freed by the one that allocated it.
// Which API is part of the type: driver_buffer<T> (cuMemAlloc / cuMemFree) and runtime_buffer<T>
// (cudaMalloc / cudaFree). Both view as device_span<T>, usable by either API.

#include <cubridge/core/context_ref.hpp>
#include <cubridge/core/detail/owned_array.hpp>
#include <cubridge/core/device_span.hpp>
#include <cubridge/core/error.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace cubridge {

/// The API that allocated (and will free) a buffer.
enum class allocator_api { driver, runtime };

namespace detail {
/// Allocates `bytes` in `ctx` (pushed for the call) through `api`. @throws error naming the size
/// and the context.
void* allocate_device(allocator_api api, context_ref ctx, std::size_t bytes);
/// Frees what allocate_device returned, through the same API. Never throws.
void free_device(allocator_api api, context_ref ctx, void* pointer) noexcept;

/// Frees device memory through the API that allocated it.
template <allocator_api Api>
struct device_free {
  static constexpr std::string_view owner_name =
      Api == allocator_api::driver ? "cubridge::driver_buffer" : "cubridge::runtime_buffer";
  void operator()(context_ref ctx, void* pointer) const noexcept { free_device(Api, ctx, pointer); }
};
}  // namespace detail

/// Owning, move-only array of `size` T in device memory of one context (the shape of every
/// owning handle: detail/owning_handle.hpp). Keeps its context alive when made from an owning
/// context. Contents are uninitialised. Every accessor of a moved-from or released buffer throws
/// error (errc::precondition).
template <class T, allocator_api Api>
class device_buffer : public detail::owned_array<T, detail::device_free<Api>> {
  static_assert(std::is_trivially_copyable_v<T>, "device memory holds trivially copyable types");
  using base = detail::owned_array<T, detail::device_free<Api>>;

 public:
  /// Allocates `size` elements in `ctx`. @throws error (e.g. CUDA_ERROR_OUT_OF_MEMORY) naming
  /// the byte count and the context; errc::precondition if the byte count overflows.
  [[nodiscard]] static device_buffer allocate(context_arg ctx, std::size_t size) {
    CUBRIDGE_EXPECTS(size <= SIZE_MAX / sizeof(T), "allocation of " + std::to_string(size) +
                                                       " elements of " + std::to_string(sizeof(T)) +
                                                       " bytes overflows");
    void* p = detail::allocate_device(Api, ctx.ref(), size * sizeof(T));
    return device_buffer(std::move(ctx), static_cast<T*>(p), size);
  }
  /// Adopts `size` elements at `data`, allocated in `ctx` through this buffer's API (cuMemAlloc,
  /// cudaMalloc) elsewhere: the buffer frees them. For memory someone else frees, use
  /// device_span<T>::from_native. @throws error (errc::precondition) for a null `data` with a
  /// size.
  [[nodiscard]] static device_buffer from_native(T* data, std::size_t size, context_arg ctx) {
    CUBRIDGE_EXPECTS(data != nullptr || size == 0,
                     "adopting " + std::to_string(size) + " elements of device memory at nullptr");
    return device_buffer(std::move(ctx), data, size);
  }

  // Each throws error (errc::precondition) once moved from or released, as data().
  [[nodiscard]] CUdeviceptr address() const { return span().address(); }
  [[nodiscard]] device_span<T> span() const { return {this->data(), this->size()}; }
  operator device_span<T>() const { return span(); }        // NOLINT
  operator device_span<const T>() const { return span(); }  // NOLINT
  static constexpr allocator_api api = Api;

 private:
  device_buffer(context_arg ctx, T* data, std::size_t size) noexcept
      : base(std::move(ctx), data, size) {}
};

/// Device memory from cuMemAlloc, freed with cuMemFree.
template <class T>
using driver_buffer = device_buffer<T, allocator_api::driver>;
/// Device memory from cudaMalloc (in whatever context is pushed), freed with cudaFree.
template <class T>
using runtime_buffer = device_buffer<T, allocator_api::runtime>;

}  // namespace cubridge
