#pragma once
// A non-owning stream. CUstream and cudaStream_t are the same type (struct CUstream_st*), so one
// view serves both APIs with no conversion.

#include <cubridge/context_ref.hpp>

#include <cuda.h>
#include <driver_types.h>

#include <type_traits>

namespace cubridge {

static_assert(std::is_same_v<CUstream, cudaStream_t>, "CUstream and cudaStream_t must be one type");

class event_ref;

/// Non-owning CUstream / cudaStream_t.
class stream_ref {
 public:
  /// Adopts a stream of either API. A null handle is the legacy default stream of the context
  /// current when it is used.
  [[nodiscard]] static constexpr stream_ref from_native(CUstream handle) noexcept {
    return stream_ref(handle);
  }
  /// The legacy default stream (handle 0).
  [[nodiscard]] static constexpr stream_ref legacy_default() noexcept { return stream_ref(CUstream{}); }
  stream_ref(std::nullptr_t) = delete;
  stream_ref(int) = delete;

  [[nodiscard]] constexpr CUstream get() const noexcept { return handle_; }
  /// The same handle, spelled for Runtime API calls.
  [[nodiscard]] constexpr cudaStream_t runtime_handle() const noexcept { return handle_; }

  /// The context the stream belongs to (cuStreamGetCtx). @throws error
  [[nodiscard]] context_ref context() const;
  /// Waits until all work queued so far has completed. @throws error naming the stream
  void synchronize() const;
  /// True if all work queued so far has completed. @throws error (e.g. a sticky fault)
  [[nodiscard]] bool ready() const;
  /// Later work on this stream waits for `event`. @throws error
  void wait(event_ref event) const;

  friend constexpr bool operator==(const stream_ref&, const stream_ref&) = default;

 protected:
  constexpr explicit stream_ref(CUstream handle) noexcept : handle_(handle) {}
  CUstream handle_ = nullptr;
};

}  // namespace cubridge
