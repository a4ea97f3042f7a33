#pragma once
// A non-owning stream. CUstream and cudaStream_t are the same type (struct CUstream_st*), so one
// view serves both APIs with no conversion.

#include <cubridge/core/context_ref.hpp>

#include <cuda.h>
#include <driver_types.h>

#include <cstdint>
#include <type_traits>

namespace cubridge {

static_assert(std::is_same_v<CUstream, cudaStream_t>, "CUstream and cudaStream_t must be one type");

class event_ref;

namespace detail {
/// The handle a moved-from or released cubridge::stream holds: no stream's, and not 0, which
/// would silently mean the legacy default stream. stream_ref::get() refuses it.
inline CUstream moved_from_stream() noexcept {
  return reinterpret_cast<CUstream>(~std::uintptr_t{0});
}
[[noreturn]] void throw_moved_from_stream();
}  // namespace detail

/// Non-owning CUstream / cudaStream_t. Not default-constructible: a launch_config names its
/// stream, the legacy default stream too (legacy_default()).
class stream_ref {
 public:
  /// Adopts a stream of either API. A null handle is the legacy default stream of the context
  /// current when it is used (in cubridge's own calls, whatever nvcc's --default-stream says).
  [[nodiscard]] static constexpr stream_ref from_native(CUstream handle) noexcept {
    return stream_ref(handle);
  }
  /// The legacy default stream (handle 0): one per context, shared by every thread, and
  /// synchronising with the context's blocking streams.
  [[nodiscard]] static constexpr stream_ref legacy_default() noexcept {
    return stream_ref(CUstream{});
  }
  stream_ref(std::nullptr_t) = delete;
  stream_ref(int) = delete;

  /// The handle. @throws error (errc::precondition) for a moved-from or released
  /// cubridge::stream, so that nothing launches on a stream that is gone.
  [[nodiscard]] CUstream get() const {
    if (handle_ == detail::moved_from_stream()) [[unlikely]]
      detail::throw_moved_from_stream();
    return handle_;
  }
  /// The same handle, spelled for Runtime API calls. @throws as get().
  [[nodiscard]] cudaStream_t runtime_handle() const { return get(); }
  /// True for the legacy default stream: 0 or CU_STREAM_LEGACY (cudaStreamLegacy).
  [[nodiscard]] bool is_legacy() const noexcept {
    return handle_ == nullptr || handle_ == CU_STREAM_LEGACY;
  }
  /// True for CU_STREAM_PER_THREAD (cudaStreamPerThread): the calling thread's default stream,
  /// another stream on every thread.
  [[nodiscard]] bool is_per_thread() const noexcept { return handle_ == CU_STREAM_PER_THREAD; }
  /// True for what a moved-from or released cubridge::stream holds.
  [[nodiscard]] bool is_moved_from() const noexcept {
    return handle_ == detail::moved_from_stream();
  }

  // Each of these throws error (errc::precondition) for a moved-from stream, as get().
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
