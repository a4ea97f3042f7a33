#pragma once
// The ownership part shared by device_buffer and pinned_buffer: move-only, frees through `Free`
// exactly once, keeps its context alive, moved-from objects hold nullptr and size 0.

#include <cubridge/core/context_ref.hpp>

#include <cstddef>
#include <utility>

namespace cubridge::detail {

/// Owns `size` elements of T at `data`, allocated in a context; `Free{}(ctx, data)` gives them
/// back (never throws).
template <class T, class Free>
class owned_array {
 public:
  owned_array(owned_array&& other) noexcept
      : ctx_(std::move(other.ctx_)),
        data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)) {}
  owned_array& operator=(owned_array&& other) noexcept {
    if (this != &other) {
      reset();
      ctx_ = std::move(other.ctx_);
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  owned_array(const owned_array&) = delete;
  owned_array& operator=(const owned_array&) = delete;
  ~owned_array() { reset(); }

  [[nodiscard]] T* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::size_t size_bytes() const noexcept { return size_ * sizeof(T); }
  [[nodiscard]] context_ref context() const noexcept { return ctx_.ref(); }

  /// Gives up ownership; the caller frees the pointer the same way.
  [[nodiscard]] T* release() noexcept {
    size_ = 0;
    return std::exchange(data_, nullptr);
  }

 protected:
  owned_array(context_arg ctx, T* data, std::size_t size) noexcept
      : ctx_(std::move(ctx)), data_(data), size_(size) {}

 private:
  void reset() noexcept {
    if (data_) Free{}(ctx_.ref(), std::exchange(data_, nullptr));
    size_ = 0;
  }
  context_arg ctx_;
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace cubridge::detail
