#pragma once
// Page-locked host memory (cuMemAllocHost): the fast path for host <-> device copies.

#include <cubridge/core/context_ref.hpp>
#include <cubridge/core/detail/owned_array.hpp>
#include <cubridge/core/error.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace cubridge {

namespace detail {
void* allocate_pinned(context_ref ctx, std::size_t bytes);
void free_pinned(void* pointer) noexcept;
/// Frees pinned host memory (the context plays no part).
struct pinned_free {
  static constexpr std::string_view owner_name = "cubridge::pinned_buffer";
  void operator()(context_ref, void* pointer) const noexcept { free_pinned(pointer); }
};
}  // namespace detail

/// Owning, move-only array of `size` T in pinned host memory (the shape of every owning handle:
/// detail/owning_handle.hpp). Keeps its context alive. Every accessor of a moved-from or
/// released buffer throws error (errc::precondition).
template <class T>
class pinned_buffer : public detail::owned_array<T, detail::pinned_free> {
  static_assert(std::is_trivially_copyable_v<T>);
  using base = detail::owned_array<T, detail::pinned_free>;

 public:
  /// @throws error naming the byte count and the context; errc::precondition on overflow.
  [[nodiscard]] static pinned_buffer allocate(context_arg ctx, std::size_t size) {
    CUBRIDGE_EXPECTS(size <= SIZE_MAX / sizeof(T), "allocation of " + std::to_string(size) +
                                                       " elements of " + std::to_string(sizeof(T)) +
                                                       " bytes overflows");
    void* p = detail::allocate_pinned(ctx.ref(), size * sizeof(T));
    return pinned_buffer(std::move(ctx), static_cast<T*>(p), size);
  }
  /// Adopts `size` elements at `data`, allocated with cuMemAllocHost for `ctx` elsewhere: the
  /// buffer frees them (cuMemFreeHost). @throws error (errc::precondition) for a null `data`
  /// with a size.
  [[nodiscard]] static pinned_buffer from_native(T* data, std::size_t size, context_arg ctx) {
    CUBRIDGE_EXPECTS(data != nullptr || size == 0,
                     "adopting " + std::to_string(size) + " elements of pinned memory at nullptr");
    return pinned_buffer(std::move(ctx), data, size);
  }

  // Each throws error (errc::precondition) once moved from or released, as data().
  [[nodiscard]] std::span<T> span() const { return {this->data(), this->size()}; }
  [[nodiscard]] T& operator[](std::size_t i) const { return this->data()[i]; }

 private:
  pinned_buffer(context_arg ctx, T* data, std::size_t size) noexcept
      : base(std::move(ctx), data, size) {}
};

}  // namespace cubridge
