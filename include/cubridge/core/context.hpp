#pragma once
// An owned CUDA context (cuCtxCreate): the "driver first" way. Make it current and runtime
// calls, <<<>>> kernels, cuBLAS and cuFFT all work in it (FACTS.md), while the device's primary
// context stays inactive. Do not call cudaSetDevice while it is current: that switches the
// thread to the primary context.

#include <cubridge/core/context_ref.hpp>
#include <cubridge/core/detail/owning_handle.hpp>
#include <cubridge/core/device.hpp>

#include <memory>
#include <string_view>

namespace cubridge {

namespace detail {
/// What makes cubridge::context an owning handle (detail/owning_handle.hpp). The value is the
/// share of the context that everything created in it holds too (context_arg).
struct context_traits {
  using value_type = std::shared_ptr<context_owner>;
  static constexpr bool keeps_context = false;
  static constexpr std::string_view name = "cubridge::context";
  static value_type moved_from() noexcept { return nullptr; }
  static CUcontext native(const value_type& owner) noexcept { return owner->get(); }
  /// Nothing: the owner destroys the context (cuCtxDestroy) when its last share is gone.
  static void destroy(value_type&, no_context) noexcept {}
  /// @throws error (errc::precondition) while something created in the context holds it.
  static CUcontext release(value_type& owner);
};
}  // namespace detail

/// Owning, move-only cuCtxCreate context (the shape of every owning handle:
/// detail/owning_handle.hpp). Destroyed when it and everything created in it are gone. Every
/// accessor of a moved-from or released context throws error (errc::precondition).
class context : public detail::owning_handle<detail::context_traits> {
  using base = detail::owning_handle<detail::context_traits>;

 public:
  /// Creates a context on `dev` without making it current (the caller's stack is unchanged).
  /// @throws error naming the device and flags.
  [[nodiscard]] static context create(cubridge::device dev, unsigned flags = CU_CTX_SCHED_AUTO);
  /// Adopts `handle`, a context made with cuCtxCreate elsewhere: it is destroyed (cuCtxDestroy)
  /// when this and everything created in it are gone. For a context someone else destroys, use
  /// context_ref::from_native. @throws error (errc::precondition) for a null handle.
  [[nodiscard]] static context from_native(CUcontext handle);

  // Inherited: get(), release() (refused while streams, buffers, modules ... created in it
  // hold it), is_moved_from(); moves. Each accessor below throws as get() once moved from.
  [[nodiscard]] context_ref ref() const { return context_ref::from_native(get()); }
  operator context_ref() const { return ref(); }             // NOLINT(google-explicit-constructor)
  operator context_arg() const { return {ref(), owned()}; }  // NOLINT
  [[nodiscard]] cubridge::device device() const { return ref().device(); }
  [[nodiscard]] unsigned long long id() const { return ref().id(); }
  /// Waits for all work in the context, made current for the call (cuCtxSynchronize); the
  /// caller's context stack is left as it was. @throws error naming the context
  void synchronize() const { ref().synchronize(); }

 private:
  explicit context(std::shared_ptr<detail::context_owner> owner) noexcept
      : base(std::move(owner), {}) {}
};

}  // namespace cubridge
