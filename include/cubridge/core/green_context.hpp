#pragma once
// A green context: a context restricted to a subset of the device's SMs (cuGreenCtxCreate).

#include <cubridge/core/context_ref.hpp>
#include <cubridge/core/device.hpp>

#include <memory>

namespace cubridge {

/// Owning, move-only green context. Usable wherever a context_ref is (driver launches, runtime
/// calls and <<<>>> kernels run in it when it is current: FACTS.md).
class green_context {
 public:
  /// A green context with at least `sm_count` SMs of `dev` (the driver rounds up to its
  /// partition granularity). @throws error naming the device and the count.
  [[nodiscard]] static green_context create(cubridge::device dev, unsigned sm_count);

  green_context(green_context&&) noexcept = default;
  green_context& operator=(green_context&&) noexcept = default;
  ~green_context() = default;

  [[nodiscard]] CUgreenCtx get_green() const noexcept;
  /// The CUcontext the driver made for it (cuCtxFromGreenCtx).
  [[nodiscard]] CUcontext get() const noexcept;
  [[nodiscard]] context_ref ref() const noexcept { return context_ref::from_native(get()); }
  operator context_ref() const noexcept { return ref(); }  // NOLINT(google-explicit-constructor)
  operator context_arg() const noexcept;                   // NOLINT(google-explicit-constructor)
  /// Number of SMs the context got.
  [[nodiscard]] unsigned sm_count() const noexcept;
  /// Waits for all work in the context, made current for the call (cuCtxSynchronize); the
  /// caller's context stack is left as it was. @throws error naming the context
  void synchronize() const { ref().synchronize(); }

 private:
  class owner;
  explicit green_context(std::shared_ptr<const owner> state) noexcept;
  std::shared_ptr<const owner> state_;
};

}  // namespace cubridge
