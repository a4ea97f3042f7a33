#pragma once
// An owned CUDA context (cuCtxCreate): the "driver first" way. Make it current and runtime
// calls, <<<>>> kernels, cuBLAS and cuFFT all work in it (FACTS.md), while the device's primary
// context stays inactive. Do not call cudaSetDevice while it is current: that switches the
// thread to the primary context.

#include <cubridge/core/context_ref.hpp>
#include <cubridge/core/device.hpp>

#include <memory>

namespace cubridge {

/// Owning, move-only cuCtxCreate context. Destroyed when it and everything created in it are gone.
class context {
 public:
  /// Creates a context on `dev` without making it current (the caller's stack is unchanged).
  /// @throws error naming the device and flags.
  [[nodiscard]] static context create(cubridge::device dev, unsigned flags = CU_CTX_SCHED_AUTO);

  context(context&&) noexcept = default;
  context& operator=(context&&) noexcept = default;
  ~context() = default;

  [[nodiscard]] CUcontext get() const noexcept { return owner_ ? owner_->get() : nullptr; }
  [[nodiscard]] context_ref ref() const noexcept { return context_ref::from_native(get()); }
  operator context_ref() const noexcept { return ref(); }  // NOLINT(google-explicit-constructor)
  operator context_arg() const noexcept { return {ref(), owner_}; }  // NOLINT
  [[nodiscard]] cubridge::device device() const { return ref().device(); }
  [[nodiscard]] unsigned long long id() const { return ref().id(); }

 private:
  explicit context(std::shared_ptr<const detail::context_owner> owner) noexcept
      : owner_(std::move(owner)) {}
  std::shared_ptr<const detail::context_owner> owner_;
};

}  // namespace cubridge
