#pragma once
// The one shape of cubridge's owning handles: stream, event, module, library, context,
// driver_buffer / runtime_buffer and pinned_buffer are each an owning_handle<Traits>.
//
// - Move-only. A moved-from or released handle holds Traits::moved_from(), a sentinel that is no
//   valid value (for a stream not 0, which would mean the legacy default stream).
// - Move assignment is move-construct-and-swap (as CCCL's stream): the old value goes to a
//   temporary whose destructor gives it back, so the destructor's logic is written once, in
//   Traits::destroy, and self-move is harmless.
// - The destructor never throws; Traits::destroy checks its calls with detail::check_release
//   (asserts in Debug builds, tolerates CUDA_ERROR_DEINITIALIZED at process exit).
// - get() and release(), and every accessor the public types build on owned(), throw
//   cubridge::error (errc::precondition) naming the type once the handle is moved from or
//   released; none dereferences a null state.
//
// The choice for get(): it throws, and is not noexcept, on every owning handle (and on the
// stream_ref / event_ref views, which can hold the sentinel a moved-from handle leaves). A
// handle that silently became 0 is the bug these types exist to prevent: a moved-from stream's 0
// is the legacy default stream, a moved-from module's 0 is an invalid handle the driver reports
// far from the move. is_moved_from() is the one accessor that never throws.
//
// A public type derives from owning_handle<Traits, Base> and adds no data members, so its
// defaulted moves are the template's. Base holds the value in a protected member `handle_` and
// has a protected constructor from it: the type's *_ref view where it has one (stream_ref,
// event_ref), otherwise handle_storage<Value>.
//
// Traits provides:
//   using value_type = ...;                  what is stored (CUstream, shared_ptr<state>, ...)
//   static constexpr bool keeps_context;     true: holds a context_arg, keeping its context alive
//   static constexpr std::string_view name;  "cubridge::stream", for messages
//   static value_type moved_from() noexcept; the sentinel, compared with ==
//   static auto native(const value_type&) noexcept;   the raw handle get() returns
//   static void destroy(value_type&, const owner_type&) noexcept;   never for the sentinel
//   static auto release(value_type&);        gives up ownership and returns native(); may refuse
//                                            (throw) before changing anything

#include <cubridge/core/context_ref.hpp>

#include <string_view>
#include <type_traits>
#include <utility>

namespace cubridge::detail {

/// Throws error (errc::precondition), call `type`, saying it was moved from or released and,
/// where not empty, what using it would otherwise have done.
[[noreturn]] void throw_moved_from(std::string_view type, std::string_view consequence = {});

/// The value of an owning handle that has no *_ref view to hold it.
template <class Value>
class handle_storage {
 protected:
  explicit handle_storage(Value value) noexcept : handle_(std::move(value)) {}
  Value handle_;
};

/// What a handle that keeps no context alive holds instead of a context_arg.
struct no_context {};

template <class Traits, class Base = handle_storage<typename Traits::value_type>>
class owning_handle : public Base {
 public:
  using value_type = typename Traits::value_type;
  using native_type = decltype(Traits::native(std::declval<const value_type&>()));
  using owner_type = std::conditional_t<Traits::keeps_context, context_arg, no_context>;
  static_assert(std::is_nothrow_move_constructible_v<value_type>);

  owning_handle(owning_handle&& other) noexcept
      : Base(std::exchange(other.handle_, Traits::moved_from())), owner_(std::move(other.owner_)) {}
  owning_handle& operator=(owning_handle&& other) noexcept {
    owning_handle(std::move(other)).swap(*this);
    return *this;
  }
  owning_handle(const owning_handle&) = delete;
  owning_handle& operator=(const owning_handle&) = delete;
  ~owning_handle() {
    if (!is_moved_from()) Traits::destroy(this->handle_, owner_);
  }

  void swap(owning_handle& other) noexcept {
    using std::swap;
    swap(this->handle_, other.handle_);
    swap(owner_, other.owner_);
  }

  /// True once moved from or released. Never throws.
  [[nodiscard]] bool is_moved_from() const noexcept {
    return this->handle_ == Traits::moved_from();
  }
  /// The raw handle. @throws error (errc::precondition) naming the type if moved from or released.
  [[nodiscard]] native_type get() const { return Traits::native(owned()); }
  /// Gives up ownership: the caller destroys the handle and keeps its context alive; this object
  /// is then as if moved from. @throws error (errc::precondition) if moved from or released
  /// already, or where the type refuses (a module or library whose kernels are alive, a context
  /// something created in it still holds).
  [[nodiscard]] native_type release() {
    (void)owned();
    native_type raw = Traits::release(this->handle_);
    this->handle_ = Traits::moved_from();
    owner_type gone = std::move(owner_);
    (void)gone;
    return raw;
  }
  /// The context it was created in (and keeps alive when that is an owning context).
  /// @throws error (errc::precondition) if moved from or released.
  [[nodiscard]] context_ref context() const requires Traits::keeps_context { return owner().ref(); }

 protected:
  owning_handle(value_type value, owner_type owner) noexcept
      : Base(std::move(value)), owner_(std::move(owner)) {}

  /// The stored value. @throws error (errc::precondition) naming the type if moved from or
  /// released.
  [[nodiscard]] const value_type& owned() const {
    if (is_moved_from()) [[unlikely]]
      throw_moved_from(Traits::name);
    return this->handle_;
  }
  /// The context share. @throws as owned().
  [[nodiscard]] const owner_type& owner() const {
    (void)owned();
    return owner_;
  }

 private:
  [[no_unique_address]] owner_type owner_;
};

}  // namespace cubridge::detail
