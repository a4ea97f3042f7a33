#pragma once
// An owned stream (cuStreamCreate) in a context it keeps alive.

#include <cubridge/core/stream_ref.hpp>

#include <utility>

namespace cubridge {

/// Owning, move-only CUstream / cudaStream_t. A moved-from or released stream holds a sentinel
/// (not 0, the legacy default stream): every use of it, a launch on it included, throws error
/// (errc::precondition) instead of running on another stream.
class stream : public stream_ref {
 public:
  /// Creates a stream in `ctx` (CU_STREAM_NON_BLOCKING by default: it does not synchronise with
  /// the legacy default stream). @throws error naming the context.
  [[nodiscard]] static stream create(context_arg ctx, unsigned flags = CU_STREAM_NON_BLOCKING);

  stream(stream&& other) noexcept;
  stream& operator=(stream&& other) noexcept;
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  ~stream();

  /// Gives up ownership; the caller destroys the handle. The stream is then as if moved from.
  /// @throws error (errc::precondition) if it was moved from or released already.
  [[nodiscard]] CUstream release();

 private:
  stream(context_arg ctx, CUstream handle) noexcept;
  context_arg ctx_;
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
