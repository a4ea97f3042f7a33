#pragma once
// Events: CUevent and cudaEvent_t are the same type (struct CUevent_st*).

#include <cubridge/core/context_ref.hpp>
#include <cubridge/core/stream_ref.hpp>

#include <cuda.h>
#include <driver_types.h>

#include <type_traits>

namespace cubridge {

static_assert(std::is_same_v<CUevent, cudaEvent_t>, "CUevent and cudaEvent_t must be one type");

/// Non-owning CUevent / cudaEvent_t.
class event_ref {
 public:
  [[nodiscard]] static constexpr event_ref from_native(CUevent handle) noexcept {
    return event_ref(handle);
  }
  event_ref(std::nullptr_t) = delete;
  event_ref(int) = delete;

  [[nodiscard]] constexpr CUevent get() const noexcept { return handle_; }
  [[nodiscard]] constexpr cudaEvent_t runtime_handle() const noexcept { return handle_; }

  /// Captures the work queued on `stream` so far. @throws error
  void record(stream_ref stream) const;
  /// Waits for the captured work. @throws error
  void synchronize() const;
  /// True once the captured work completed. @throws error (e.g. a sticky fault)
  [[nodiscard]] bool ready() const;
  /// Milliseconds between two recorded, completed events (timing events only). @throws error
  [[nodiscard]] float elapsed_ms_since(event_ref start) const;

  friend constexpr bool operator==(const event_ref&, const event_ref&) = default;

 protected:
  constexpr explicit event_ref(CUevent handle) noexcept : handle_(handle) {}
  CUevent handle_ = nullptr;
};

/// Owning, move-only event in a context it keeps alive.
class event : public event_ref {
 public:
  /// Creates an event in `ctx`; CU_EVENT_DISABLE_TIMING by default (cheapest to record).
  /// @throws error naming the context.
  [[nodiscard]] static event create(context_arg ctx, unsigned flags = CU_EVENT_DISABLE_TIMING);

  event(event&& other) noexcept;
  event& operator=(event&& other) noexcept;
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  ~event();

  [[nodiscard]] CUevent release() noexcept;

 private:
  event(context_arg ctx, CUevent handle) noexcept;
  context_arg ctx_;
};

}  // namespace cubridge
