#pragma once
// Events: CUevent and cudaEvent_t are the same type (struct CUevent_st*).

#include <cubridge/core/context_ref.hpp>
#include <cubridge/core/detail/owning_handle.hpp>
#include <cubridge/core/stream_ref.hpp>

#include <cuda.h>
#include <driver_types.h>

#include <cstdint>
#include <string_view>
#include <type_traits>

namespace cubridge {

static_assert(std::is_same_v<CUevent, cudaEvent_t>, "CUevent and cudaEvent_t must be one type");

namespace detail {
/// The handle a moved-from or released cubridge::event holds: no event's. event_ref::get()
/// refuses it.
inline CUevent moved_from_event() noexcept {
  return reinterpret_cast<CUevent>(~std::uintptr_t{0});
}
[[noreturn]] void throw_moved_from_event();
}  // namespace detail

/// Non-owning CUevent / cudaEvent_t.
class event_ref {
 public:
  [[nodiscard]] static constexpr event_ref from_native(CUevent handle) noexcept {
    return event_ref(handle);
  }
  event_ref(std::nullptr_t) = delete;
  event_ref(int) = delete;

  /// The handle. @throws error (errc::precondition) for a moved-from or released
  /// cubridge::event.
  [[nodiscard]] CUevent get() const {
    if (handle_ == detail::moved_from_event()) [[unlikely]]
      detail::throw_moved_from_event();
    return handle_;
  }
  /// The same handle, spelled for Runtime API calls. @throws as get().
  [[nodiscard]] cudaEvent_t runtime_handle() const { return get(); }
  /// True for what a moved-from or released cubridge::event holds.
  [[nodiscard]] bool is_moved_from() const noexcept {
    return handle_ == detail::moved_from_event();
  }

  // Each throws error (errc::precondition) for a moved-from event, as get().
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

namespace detail {
/// What makes cubridge::event an owning handle (detail/owning_handle.hpp).
struct event_traits {
  using value_type = CUevent;
  static constexpr bool keeps_context = true;
  static constexpr std::string_view name = "cubridge::event";
  static CUevent moved_from() noexcept { return moved_from_event(); }
  static CUevent native(CUevent handle) noexcept { return handle; }
  static void destroy(CUevent handle, const context_arg& ctx) noexcept;
  static CUevent release(CUevent handle) noexcept { return handle; }
};
}  // namespace detail

/// Owning, move-only event in a context it keeps alive (the shape of every owning handle:
/// detail/owning_handle.hpp). Every use of a moved-from or released event throws error
/// (errc::precondition).
class event : public detail::owning_handle<detail::event_traits, event_ref> {
  using base = detail::owning_handle<detail::event_traits, event_ref>;

 public:
  /// Creates an event in `ctx`; CU_EVENT_DISABLE_TIMING by default (cheapest to record).
  /// @throws error naming the context.
  [[nodiscard]] static event create(context_arg ctx, unsigned flags = CU_EVENT_DISABLE_TIMING);
  /// Adopts `handle`, an event of `ctx` made elsewhere: the event destroys it. For an event
  /// someone else destroys, use event_ref::from_native. @throws error (errc::precondition) for
  /// a null handle or the moved-from sentinel.
  [[nodiscard]] static event from_native(CUevent handle, context_arg ctx);

  // Inherited: get(), release() (the caller then destroys it and keeps its context alive),
  // context(), is_moved_from(); moves.

 private:
  event(CUevent handle, context_arg ctx) noexcept : base(handle, std::move(ctx)) {}
};

}  // namespace cubridge
