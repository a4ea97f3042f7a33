#pragma once
// A non-owning view of a CUDA context, whatever made it (cuCtxCreate, the runtime's primary
// context, a green context, a third-party library).

#include <cubridge/core/device.hpp>
#include <cubridge/core/error.hpp>

#include <cuda.h>

#include <cstddef>
#include <memory>

namespace cubridge {

/// Non-owning CUcontext. Cheap to copy; the caller keeps the context alive.
class context_ref {
 public:
  /// Adopts a context made elsewhere. A null handle is allowed and means "no context".
  [[nodiscard]] static context_ref from_native(CUcontext handle) noexcept {
    return context_ref(handle);
  }
  context_ref(std::nullptr_t) = delete;  // say from_native(nullptr) if "no context" is meant
  context_ref(int) = delete;

  /// The calling thread's current context (cuCtxGetCurrent); null when none.
  /// @throws driver_unavailable
  [[nodiscard]] static context_ref current();

  [[nodiscard]] CUcontext get() const noexcept { return handle_; }
  [[nodiscard]] explicit operator bool() const noexcept { return handle_ != nullptr; }

  /// The driver's unique id of this context (cuCtxGetId); a re-created context gets a new one.
  /// @throws context_reset_error if the context was destroyed.
  [[nodiscard]] unsigned long long id() const;
  /// The device the context runs on. @throws error
  [[nodiscard]] cubridge::device device() const;
  /// Waits for all work in the context (cuCtxSynchronize with the context pushed, then popped:
  /// the caller's context stack is left as it was). @throws error naming the context
  void synchronize() const;
  /// "context 0x55d1 (id 3) on device 0", for messages; never throws.
  [[nodiscard]] std::string describe() const noexcept;

  friend bool operator==(const context_ref&, const context_ref&) = default;

 private:
  explicit context_ref(CUcontext handle) noexcept : handle_(handle) {}
  CUcontext handle_ = nullptr;
};

namespace detail {
/// Shared state of an owning context; its destructor gives the context back to the driver.
/// Objects created in a context hold a shared_ptr to it, so a context outlives its streams,
/// buffers and modules whatever order the program drops them in.
class context_owner {
 public:
  explicit context_owner(CUcontext handle) noexcept : handle_(handle) {}
  virtual ~context_owner() = default;
  context_owner(const context_owner&) = delete;
  context_owner& operator=(const context_owner&) = delete;
  [[nodiscard]] CUcontext get() const noexcept { return handle_; }

 private:
  CUcontext handle_;
};
}  // namespace detail

/// Where to create something: a context plus, when cubridge owns it, a share of its lifetime.
/// Built implicitly from any owning context (context, primary_context, green_context), which
/// then stays alive as long as what is created in it, or from a context_ref, which the caller
/// keeps alive.
class context_arg {
 public:
  context_arg(context_ref ref) noexcept : ref_(ref) {}  // NOLINT(google-explicit-constructor)
  context_arg(context_ref ref, std::shared_ptr<const detail::context_owner> owner) noexcept
      : ref_(ref), owner_(std::move(owner)) {}
  [[nodiscard]] context_ref ref() const noexcept { return ref_; }
  [[nodiscard]] const std::shared_ptr<const detail::context_owner>& owner() const noexcept {
    return owner_;
  }

 private:
  context_ref ref_;
  std::shared_ptr<const detail::context_owner> owner_;
};

}  // namespace cubridge
