#pragma once
// A context-independent library (cuLibraryLoadData): loaded once, usable in every context of
// the process; its kernels launch in whatever context is current. Under lazy loading the
// per-context load happens at the first launch or lookup (FACTS.md).

#include <cubridge/core/detail/owning_handle.hpp>
#include <cubridge/core/kernel.hpp>
#include <cubridge/core/module.hpp>

#include <memory>
#include <string>
#include <string_view>

namespace cubridge {

namespace detail {
/// A loaded library, shared by the library and the kernels taken from it (library.cpp).
struct library_state;
/// What makes cubridge::library an owning handle (detail/owning_handle.hpp).
struct library_traits {
  using value_type = std::shared_ptr<library_state>;
  static constexpr bool keeps_context = false;  // a library belongs to no context
  static constexpr std::string_view name = "cubridge::library";
  static value_type moved_from() noexcept { return nullptr; }
  static CUlibrary native(const value_type& state) noexcept;
  /// Nothing: the state unloads the library when its last share (library or kernel) is gone.
  static void destroy(value_type&, no_context) noexcept {}
  /// @throws error (errc::precondition) while kernels taken from the library are alive.
  static CUlibrary release(value_type& state);
};
}  // namespace detail

/// Owning, move-only CUlibrary (the shape of every owning handle: detail/owning_handle.hpp).
/// Kernels taken from it keep it loaded. Every accessor of a moved-from or released library
/// throws error (errc::precondition).
class library : public detail::owning_handle<detail::library_traits> {
  using base = detail::owning_handle<detail::library_traits>;

 public:
  /// Loads `image`. With options.check_target, the image must have code for `target` (default:
  /// device 0's capability). @throws image_error, or error with the driver's JIT log.
  [[nodiscard]] static library load(std::span<const std::byte> image, load_options options = {});
  /// @throws error (errc::io) naming the path, and as load().
  [[nodiscard]] static library load_file(const std::filesystem::path& path,
                                         load_options options = {});
  /// Adopts `handle`, a library loaded elsewhere (cuLibraryLoad...): it is unloaded when this
  /// and the kernels taken from it are gone. `name` is for messages. @throws error
  /// (errc::precondition) for a null handle.
  [[nodiscard]] static library from_native(CUlibrary handle, std::string name = {});

  // Inherited: get(), release() (refused while kernels taken from it are alive; the caller then
  // unloads it), is_moved_from(); moves. Each accessor below throws as get() once moved from.
  [[nodiscard]] const std::string& name() const;
  /// The kernel named `name`; needs a current context (any), in which the driver reads its
  /// parameter list. @throws error naming library and kernel; errc::precondition without a
  /// current context.
  [[nodiscard]] kernel get_kernel(std::string_view name) const;

 private:
  explicit library(std::shared_ptr<detail::library_state> s) noexcept : base(std::move(s), {}) {}
};

}  // namespace cubridge
