#pragma once
// An owned stream (cuStreamCreate) in a context it keeps alive.

#include <cubridge/core/detail/owning_handle.hpp>
#include <cubridge/core/stream_ref.hpp>

#include <string_view>
#include <utility>

namespace cubridge {

namespace detail {
/// What makes cubridge::stream an owning handle (detail/owning_handle.hpp).
struct stream_traits {
  using value_type = CUstream;
  static constexpr bool keeps_context = true;
  static constexpr std::string_view name = "cubridge::stream";
  static CUstream moved_from() noexcept { return moved_from_stream(); }
  static CUstream native(CUstream handle) noexcept { return handle; }
  /// Runs the stream destroy hook, then cuStreamDestroy.
  static void destroy(CUstream handle, const context_arg& ctx) noexcept;
  static CUstream release(CUstream handle) noexcept { return handle; }
};
}  // namespace detail

/// Owning, move-only CUstream / cudaStream_t in a context it keeps alive (the shape of every
/// owning handle: detail/owning_handle.hpp). A moved-from or released stream holds a sentinel
/// (not 0, the legacy default stream): every use of it, a launch on it included, throws error
/// (errc::precondition) instead of running on another stream.
class stream : public detail::owning_handle<detail::stream_traits, stream_ref> {
  using base = detail::owning_handle<detail::stream_traits, stream_ref>;

 public:
  /// Creates a stream in `ctx` (CU_STREAM_NON_BLOCKING by default: it does not synchronise with
  /// the legacy default stream). @throws error naming the context.
  [[nodiscard]] static stream create(context_arg ctx, unsigned flags = CU_STREAM_NON_BLOCKING);
  /// Adopts `handle`, a stream of `ctx` made elsewhere (cuStreamCreate, cudaStreamCreate): the
  /// stream destroys it. For a stream someone else destroys, use stream_ref::from_native.
  /// @throws error (errc::precondition) for 0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD or the
  /// moved-from sentinel, none of which can be destroyed.
  [[nodiscard]] static stream from_native(CUstream handle, context_arg ctx);

  // Inherited: get(), release() (the caller then destroys it with before_stream_destroy first,
  // and keeps its context alive), context() (without a driver call), is_moved_from(); moves.

 private:
  stream(CUstream handle, context_arg ctx) noexcept : base(handle, std::move(ctx)) {}
};

/// Told a stream's handle just before the stream is destroyed, while the handle is still valid.
/// Must not throw, block for long, or destroy streams.
using stream_destroy_hook = void (*)(CUstream stream) noexcept;

/// The core's one generic hook: installs `hook` (nullptr: none) for every stream destruction and
/// returns the hook it replaced, which the new one must call too. The swap layer installs one
/// (swap/detail/stream_listeners.hpp) so that hot modules fence their work on dying streams.
stream_destroy_hook set_stream_destroy_hook(stream_destroy_hook hook) noexcept;

/// Call before destroying a stream with the raw driver or runtime (cuStreamDestroy,
/// cudaStreamDestroy) if hot kernels (swap/hot_module.hpp) were launched on it: it lets their
/// old versions be unloaded once that stream's work is done. cubridge::stream does this itself.
void before_stream_destroy(CUstream stream) noexcept;

}  // namespace cubridge
