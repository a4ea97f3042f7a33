#pragma once
// Page-locked host memory (cuMemAllocHost): the fast path for host <-> device copies.

#include <cubridge/context_ref.hpp>
#include <cubridge/error.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <span>
#include <type_traits>
#include <utility>

namespace cubridge {

namespace detail {
void* allocate_pinned(context_ref ctx, std::size_t bytes);
void free_pinned(void* pointer) noexcept;
}  // namespace detail

/// Owning, move-only array of `size` T in pinned host memory. Keeps its context alive.
template <class T>
class pinned_buffer {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  /// @throws error naming the byte count and the context.
  [[nodiscard]] static pinned_buffer allocate(context_arg ctx, std::size_t size) {
    CUBRIDGE_EXPECTS(size <= SIZE_MAX / sizeof(T), "allocation of " + std::to_string(size) +
                                                      " elements of " + std::to_string(sizeof(T)) +
                                                      " bytes overflows");
    void* p = detail::allocate_pinned(ctx.ref(), size * sizeof(T));
    return pinned_buffer(std::move(ctx), static_cast<T*>(p), size);
  }
  pinned_buffer(pinned_buffer&& other) noexcept
      : ctx_(std::move(other.ctx_)),
        data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)) {}
  pinned_buffer& operator=(pinned_buffer&& other) noexcept {
    if (this != &other) {
      reset();
      ctx_ = std::move(other.ctx_);
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  ~pinned_buffer() { reset(); }

  [[nodiscard]] T* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::size_t size_bytes() const noexcept { return size_ * sizeof(T); }
  [[nodiscard]] std::span<T> span() const noexcept { return {data_, size_}; }
  [[nodiscard]] T& operator[](std::size_t i) const noexcept { return data_[i]; }

 private:
  pinned_buffer(context_arg ctx, T* data, std::size_t size) noexcept
      : ctx_(std::move(ctx)), data_(data), size_(size) {}
  void reset() noexcept {
    if (data_) detail::free_pinned(std::exchange(data_, nullptr));
    size_ = 0;
  }
  context_arg ctx_;
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace cubridge
