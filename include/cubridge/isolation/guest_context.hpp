#pragma once
// A guest context: third-party CUDA code runs inside a context of its own (cuCtxCreate on the
// device), so that its runtime calls use that context and not the host's.
//
// What it protects, and what it does not (FACTS.md, measured on the H200):
// - A cudaDeviceReset() made while the guest context is current destroys nothing of the host's:
//   the primary context and its buffers survive.
// - A cudaDeviceReset() the guest makes from a thread it creates itself runs with no guest
//   context current on that thread and resets the primary context: the guest context cannot
//   prevent that (the reset guard can); it detects it after the call and says so.
// - A fault (illegal address) poisons every context of the process, the host's included: the
//   guest context only reports it. A separate process is the boundary: see sandbox.hpp.
//
// Buffers go in and out without copies as shared_device_memory (VMM, access granted per device,
// so a kernel in the guest context reads and writes them and the host sees the result): the
// documented way. A plain cuMemAlloc pointer of another context also worked on the H200, but the
// programming guide does not promise it (FACTS.md "Memory across contexts").
//
// After every call the guest checks the host's state and throws guest_error naming what broke:
// the caller's context stack (restored exactly either way), the watched primary context (reset),
// watched host buffers (gone or replaced), and a sticky error in the guest context.
//
// Under NVIDIA MPS a fault reaches every client on the GPU and the guest context is one more of
// the few client contexts the MPS server has per device: guest_options::mps says what create()
// does then (mps_policy.hpp).

#include <cubridge/core/context.hpp>
#include <cubridge/core/context_ref.hpp>
#include <cubridge/core/device.hpp>
#include <cubridge/core/device_span.hpp>
#include <cubridge/core/primary_context.hpp>
#include <cubridge/core/shared_device_memory.hpp>
#include <cubridge/isolation/error.hpp>
#include <cubridge/isolation/mps_policy.hpp>

#include <cuda.h>

#include <any>
#include <cstddef>
#include <memory>
#include <source_location>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace cubridge {

/// What a guest call broke in the host's state.
enum class guest_breakage {
  context_stack,          ///< the caller's context stack was not as before (repaired)
  primary_context_reset,  ///< the watched primary context was reset or destroyed
  host_buffer_lost,       ///< a watched host buffer is gone or was replaced
  sticky_error,           ///< the guest context holds a sticky error (the process is poisoned)
};

/// "context_stack", "primary_context_reset", ...
[[nodiscard]] std::string_view to_string(guest_breakage what) noexcept;

/// One thing a guest call broke, with the details: which buffer, which ids, which error.
struct guest_finding {
  guest_breakage what{};
  std::string detail{};
};

/// Raised after a guest call that broke the host's state (isolation_errc::guest_damage); what()
/// lists every finding, e.g. "... guest 'vendor-fft': primary_context_reset: primary context 0x..
/// of device 0 retained with id 1 was reset and re-created with id 5; host_buffer_lost: host buffer
/// 'input' (0x7f.., 4096 bytes) is gone (cuPointerGetAttribute CUDA_ERROR_INVALID_VALUE)".
class guest_error : public error {
 public:
  guest_error(std::string guest, std::vector<guest_finding> findings,
              std::source_location where = std::source_location::current());
  [[nodiscard]] const std::vector<guest_finding>& findings() const noexcept { return findings_; }
  /// True if one of the findings is `what`.
  [[nodiscard]] bool broke(guest_breakage what) const noexcept;
  /// The guest's name.
  [[nodiscard]] const std::string& guest() const noexcept { return guest_; }
  /// What the function given to guest_context::call returned, when it returned a value that can
  /// be copied (a library's status: std::any_cast<int>(e.result())): the call did return, and
  /// broke something on the way. Empty for a void function, a result that cannot be copied, and
  /// an error from check_host() or guest_scope::leave().
  [[nodiscard]] const std::any& result() const noexcept { return result_; }

 private:
  friend class guest_context;  // sets result_ in call()
  std::string guest_;
  std::vector<guest_finding> findings_;
  std::any result_;
};

/// How a guest context is made and checked.
struct guest_options {
  /// Name used in messages ("vendor-fft").
  std::string name = "guest";
  /// cuCtxCreate flags of the guest context.
  unsigned flags = CU_CTX_SCHED_AUTO;
  /// Watch the device's primary context if it is active when the guest is created (it is
  /// retained for that). Watch one explicitly with guest_context::watch.
  bool watch_active_primary = true;
  /// Synchronize the guest context after each call, so that a fault of the work the call issued
  /// is caught at the call that caused it (sticky_error). Off: only errors already raised show.
  bool synchronize_after_call = true;
  /// What create() does when NVIDIA MPS serves the device (mps_policy.hpp). warn by default: a
  /// guest context never contained a fault (it poisons the whole process), so MPS takes nothing
  /// a caller could rely on away, and a program that runs under MPS on purpose keeps working; the
  /// line says that a fault now reaches other processes too. refuse to fail instead.
  mps_policy mps = mps_policy::warn;
};

class guest_scope;

/// An owned context for third-party code, with the checks that tell what it broke. Move-only.
/// Entering is per thread: use it from any thread, each entering for itself.
class guest_context {
 public:
  /// Creates the guest context on `dev` (the caller's stack is unchanged), after applying
  /// options.mps (nothing is created when it refuses).
  /// @throws mps_active_error under mps_policy::refuse when MPS serves `dev`; error naming the
  ///         device and the guest.
  [[nodiscard]] static guest_context create(device dev, guest_options options = {});

  guest_context(guest_context&&) noexcept;
  guest_context& operator=(guest_context&&) noexcept;
  guest_context(const guest_context&) = delete;
  guest_context& operator=(const guest_context&) = delete;
  ~guest_context();

  /// Runs `fn()` with the guest context current, restores the caller's context stack, checks
  /// the host's state and returns what `fn` returned. An exception from `fn` propagates after the
  /// stack was restored (the host check is then skipped).
  /// @throws guest_error naming everything the call broke, with what `fn` returned
  ///         (guest_error::result()); error if a check itself fails.
  template <class Fn>
  decltype(auto) call(Fn&& fn);

  /// Enters the guest context on this thread until the returned scope ends (see guest_scope).
  /// @throws error if the caller's stack cannot be read or the context cannot be pushed.
  [[nodiscard]] guest_scope enter();

  /// Watches the primary context `primary` (retains it again; its id must not change).
  /// @throws context_reset_error if it was already reset.
  void watch(const primary_context& primary);
  /// Watches a host buffer by its address: after each call it must still be the same allocation
  /// (CU_POINTER_ATTRIBUTE_BUFFER_ID, or CU_POINTER_ATTRIBUTE_MAPPED for VMM memory).
  /// @throws error (errc::precondition) if `address` is not device memory known to the driver.
  void watch(std::string name, CUdeviceptr address, std::size_t bytes);
  template <class T>
  void watch(std::string name, device_span<T> span) {
    watch(std::move(name), span.address(), span.size_bytes());
  }
  void watch(std::string name, const shared_device_memory& memory) {
    watch(std::move(name), memory.address(), memory.size_bytes());
  }
  /// Stops watching the buffer at `address` (call before freeing it). No effect if not watched.
  void unwatch(CUdeviceptr address) noexcept;

  /// Checks the watched host state now. @throws guest_error naming what broke.
  void check_host() const;

  /// The guest's own context (what runtime calls inside a call use).
  [[nodiscard]] context_ref ref() const noexcept;
  [[nodiscard]] const std::string& name() const noexcept;
  [[nodiscard]] cubridge::device device() const noexcept;

  struct state;  // the context, the options and the watched host state

 private:
  explicit guest_context(std::unique_ptr<state> s) noexcept;
  std::unique_ptr<state> state_;
};

/// The guest context entered on one thread: pushed on construction (after a snapshot of the
/// caller's context stack), left by leave() or the destructor. Neither copyable nor movable.
class guest_scope {
 public:
  guest_scope(const guest_scope&) = delete;
  guest_scope& operator=(const guest_scope&) = delete;
  guest_scope(guest_scope&&) = delete;
  guest_scope& operator=(guest_scope&&) = delete;
  /// Leaves without checking if leave() was not called: restores the stack, never throws.
  ~guest_scope();

  /// Restores the caller's context stack exactly (popping what the guest left pushed, pushing
  /// back what it popped), then checks the guest context for a sticky error and the host's
  /// watched state. @throws guest_error naming everything that broke (the stack is restored
  /// first either way).
  void leave();

 private:
  friend class guest_context;
  explicit guest_scope(const guest_context::state& guest);
  /// Restores the stack; returns what was wrong with it (empty: nothing).
  std::vector<guest_finding> restore() noexcept;
  const guest_context::state* guest_;    // stays put when the guest_context is moved
  std::vector<CUcontext> caller_stack_;  // top first
  bool left_ = false;
};

template <class Fn>
decltype(auto) guest_context::call(Fn&& fn) {
  auto scope = enter();
  if constexpr (std::is_void_v<std::invoke_result_t<Fn&&>>) {
    std::forward<Fn>(fn)();
    scope.leave();
  } else {
    decltype(auto) result = std::forward<Fn>(fn)();
    using value = std::remove_cvref_t<decltype(result)>;
    if constexpr (std::is_copy_constructible_v<value>) {
      try {
        scope.leave();
      } catch (guest_error& e) {
        e.result_ = value(result);  // the caller may still want the library's status
        throw;
      }
    } else {
      scope.leave();
    }
    return result;
  }
}

namespace detail {
/// The calling thread's whole context stack, top first, read by popping every context and
/// pushing them back (the driver offers no other way to see below the top). Leaves the stack as
/// it found it. @throws error if a push fails.
[[nodiscard]] std::vector<CUcontext> context_stack();
/// Replaces the calling thread's context stack with `stack` (top first). Never throws; returns
/// false if a push failed.
bool set_context_stack(const std::vector<CUcontext>& stack) noexcept;
}  // namespace detail

}  // namespace cubridge
