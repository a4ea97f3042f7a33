#pragma once
// The owning handle under device_buffer and pinned_buffer: `size` elements of T at `data`,
// allocated in a context it keeps alive and given back through `Free` exactly once. The shape
// (moves, release, moved-from accessors that throw) is owning_handle's.

#include <cubridge/core/context_ref.hpp>
#include <cubridge/core/detail/owning_handle.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

namespace cubridge::detail {

/// What an owned array stores. An empty array (allocated with size 0) is {nullptr, 0}.
template <class T>
struct array_value {
  T* data = nullptr;
  std::size_t size = 0;
  friend bool operator==(const array_value&, const array_value&) = default;
};

/// What makes an owned_array an owning handle. `Free{}(ctx, data)` gives the memory back (never
/// throws); `Free::owner_name` names the public type in messages.
template <class T, class Free>
struct array_traits {
  using value_type = array_value<T>;
  static constexpr bool keeps_context = true;
  static constexpr std::string_view name = Free::owner_name;
  /// No array's: an empty one has size 0.
  static value_type moved_from() noexcept { return {nullptr, SIZE_MAX}; }
  static T* native(const value_type& v) noexcept { return v.data; }
  static void destroy(value_type& v, const context_arg& ctx) noexcept {
    if (v.data) Free{}(ctx.ref(), v.data);
  }
  static T* release(value_type& v) noexcept { return v.data; }
};

/// Owns `size` elements of T at `data`, allocated in a context. get() and data() are the
/// pointer; every accessor of a moved-from or released array throws error (errc::precondition).
template <class T, class Free>
class owned_array : public owning_handle<array_traits<T, Free>> {
  using base = owning_handle<array_traits<T, Free>>;

 public:
  /// @throws error (errc::precondition) if moved from or released, as every accessor.
  [[nodiscard]] T* data() const { return this->get(); }
  [[nodiscard]] std::size_t size() const { return this->owned().size; }
  [[nodiscard]] std::size_t size_bytes() const { return size() * sizeof(T); }
  // Inherited: context(), release() (the caller frees the pointer the same way and keeps its
  // context alive), is_moved_from(); moves.

 protected:
  owned_array(context_arg ctx, T* data, std::size_t size) noexcept
      : base(array_value<T>{data, size}, std::move(ctx)) {}
};

}  // namespace cubridge::detail
