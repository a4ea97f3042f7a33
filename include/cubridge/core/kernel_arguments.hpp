#pragma once
// A kernel argument list assembled at run time (from Python, a configuration, an RPC), for the
// callers that cannot name the argument types at compile time. kernel::launch checks it against
// the kernel's real parameter list as the typed launch does.

#include <cstddef>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

namespace cubridge {

/// The values of a launch's arguments, in order, each copied into one buffer at its alignment,
/// with the pointer table cuLaunchKernel takes. Reusable: clear() keeps the capacity, so a
/// launcher that keeps one per thread allocates nothing per launch.
class kernel_arguments {
 public:
  kernel_arguments() = default;
  // A copy's table would point into the original's buffer.
  kernel_arguments(const kernel_arguments&) = delete;
  kernel_arguments& operator=(const kernel_arguments&) = delete;
  kernel_arguments(kernel_arguments&&) noexcept = default;
  kernel_arguments& operator=(kernel_arguments&&) noexcept = default;
  ~kernel_arguments() = default;

  /// Appends `size` bytes from `value` as the next argument, at `alignment` (a power of two of
  /// at most 16) in the buffer.
  void push(const void* value, std::size_t size, std::size_t alignment) {
    const std::size_t at = (storage_.size() + alignment - 1) & ~(alignment - 1);
    const std::byte* before = storage_.data();
    storage_.resize(at + size);
    std::memcpy(storage_.data() + at, value, size);
    offsets_.push_back(at);
    sizes_.push_back(size);
    if (storage_.data() != before) {  // the buffer moved: every pointer moves with it
      pointers_.clear();
      for (const auto offset : offsets_) pointers_.push_back(storage_.data() + offset);
    } else {
      pointers_.push_back(storage_.data() + at);
    }
  }
  /// Appends `value` (a trivially copyable value of the kernel parameter's type).
  template <class T>
  void push(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>, "kernel arguments must be trivially copyable");
    push(&value, sizeof(T), alignof(T) < 16 ? alignof(T) : 16);
  }
  /// Forgets every argument; the memory is kept for the next list.
  void clear() noexcept {
    storage_.clear();
    offsets_.clear();
    sizes_.clear();
    pointers_.clear();
  }

  [[nodiscard]] std::size_t count() const noexcept { return sizes_.size(); }
  /// Each argument's size in bytes, in order.
  [[nodiscard]] std::span<const std::size_t> sizes() const noexcept { return sizes_; }
  /// The table cuLaunchKernel takes as kernelParams; valid until the next push or clear.
  [[nodiscard]] void** pointers() const noexcept {
    return const_cast<void**>(pointers_.data());  // cuLaunchKernel reads it, never writes
  }

 private:
  // Heap storage is aligned for any fundamental type, so offsets aligned within it are too.
  std::vector<std::byte> storage_;
  std::vector<std::size_t> offsets_;
  std::vector<std::size_t> sizes_;
  std::vector<void*> pointers_;
};

}  // namespace cubridge
