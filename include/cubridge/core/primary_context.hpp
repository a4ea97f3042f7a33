#pragma once
// The device's primary context, the one the Runtime API uses: the "runtime first" way.

#include <cubridge/core/context_ref.hpp>
#include <cubridge/core/device.hpp>

#include <memory>

namespace cubridge {

/// One retained reference to a device's primary context (cuDevicePrimaryCtxRetain), released
/// when it and everything created in it are gone. Move-only.
///
/// Someone else (a library calling cudaDeviceReset) can reset the primary context while we hold
/// it; the driver then re-creates it with a new id. check_not_reset() detects that and says so
/// instead of letting the program use a dead handle.
class primary_context {
 public:
  /// Retains the primary context of `dev` (creating it if needed). @throws error
  [[nodiscard]] static primary_context retain(cubridge::device dev);
  /// Adopts the context the Runtime API uses on this thread: initialises the runtime if nobody
  /// has (cudaFree(0)), also when a library initialised it first, then retains the primary
  /// context of the runtime's current device. @throws error if the runtime's current context is
  /// not a primary context (a driver context is current; adopt that with context_ref instead).
  [[nodiscard]] static primary_context adopt_runtime();

  primary_context(primary_context&&) noexcept = default;
  primary_context& operator=(primary_context&&) noexcept = default;
  ~primary_context() = default;

  [[nodiscard]] CUcontext get() const noexcept;
  [[nodiscard]] context_ref ref() const noexcept { return context_ref::from_native(get()); }
  operator context_ref() const noexcept { return ref(); }  // NOLINT(google-explicit-constructor)
  operator context_arg() const noexcept;                   // NOLINT(google-explicit-constructor)
  [[nodiscard]] cubridge::device device() const noexcept;
  /// The id the context had when it was retained.
  [[nodiscard]] unsigned long long retained_id() const noexcept;
  /// Waits for all work in the context, the Runtime API's included, made current for the call
  /// (cuCtxSynchronize); the caller's context stack is left as it was. @throws error naming the
  /// context
  void synchronize() const { ref().synchronize(); }

  /// True if the primary context was reset or destroyed since it was retained (its id changed,
  /// or the driver calls it destroyed). Never throws.
  [[nodiscard]] bool was_reset() const noexcept;
  /// @throws context_reset_error naming the device and both ids if was_reset().
  void check_not_reset() const;

 private:
  class owner;
  explicit primary_context(std::shared_ptr<const owner> state) noexcept;
  std::shared_ptr<const owner> state_;
};

}  // namespace cubridge
