#pragma once
// A module loaded into one context (cuModuleLoadDataEx): cubin, fatbin or PTX.
// The bytes are inspected first (image.hpp), so an image with no code for the context's device
// is refused with a clear error before the driver sees it. PTX is JIT-compiled by the driver,
// which stalls the whole process for the compile (FACTS.md): serving processes should hand the
// driver machine code only.

#include <cubridge/core/context_ref.hpp>
#include <cubridge/core/detail/owning_handle.hpp>
#include <cubridge/core/device_span.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/core/image.hpp>
#include <cubridge/core/kernel.hpp>

#include <cuda.h>

#include <cstddef>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace cubridge {

/// How to load an image.
struct load_options {
  /// A name for messages ("filters"); load_file uses the file name when this is empty.
  std::string name{};
  /// Refuse images with no code for the target device before calling the driver.
  bool check_target = true;
  /// Driver JIT optimisation level 0-4 for PTX; -1 leaves the driver's default.
  int jit_optimization_level = -1;
  /// Room for the driver's JIT info and error logs, each.
  std::size_t log_bytes = std::size_t{16} * 1024;
};

namespace detail {
/// A loaded module, shared by the module and the kernels taken from it (module.cpp).
struct module_state;
/// What makes cubridge::module an owning handle (detail/owning_handle.hpp).
struct module_traits {
  using value_type = std::shared_ptr<module_state>;
  static constexpr bool keeps_context = false;  // the state does: kernels need it too
  static constexpr std::string_view name = "cubridge::module";
  static value_type moved_from() noexcept { return nullptr; }
  static CUmodule native(const value_type& state) noexcept;
  /// Nothing: the state unloads the module when its last share (module or kernel) is gone.
  static void destroy(value_type&, no_context) noexcept {}
  /// @throws error (errc::precondition) while kernels taken from the module are alive.
  static CUmodule release(value_type& state);
};
}  // namespace detail

/// Owning, move-only context-bound module (the shape of every owning handle:
/// detail/owning_handle.hpp). Kernels taken from it keep it loaded. Every accessor of a
/// moved-from or released module throws error (errc::precondition).
class module : public detail::owning_handle<detail::module_traits> {
  using base = detail::owning_handle<detail::module_traits>;

 public:
  /// Loads `image` into `ctx` (pushed for the call). @throws image_error for bytes that are not
  /// an image or have no code for the device; error (with the driver's JIT log) if the driver
  /// refuses it.
  [[nodiscard]] static module load(context_arg ctx, std::span<const std::byte> image,
                                   load_options options = {});
  /// As load(ctx, image, options), for bytes inspected already: `info` is what
  /// inspect_image(image) returned (e.g. verified_bundle::image), and the bytes are not parsed
  /// again. @throws as load().
  [[nodiscard]] static module load(context_arg ctx, std::span<const std::byte> image,
                                   const image_info& info, load_options options = {});
  /// Reads and loads a file. @throws error (errc::io) naming the path, and as load().
  [[nodiscard]] static module load_file(context_arg ctx, const std::filesystem::path& path,
                                        load_options options = {});
  /// Adopts `handle`, a module loaded into `ctx` elsewhere (cuModuleLoad...): it is unloaded
  /// when this and the kernels taken from it are gone. `name` is for messages. @throws error
  /// (errc::precondition) for a null handle.
  [[nodiscard]] static module from_native(CUmodule handle, context_arg ctx, std::string name = {});

  // Inherited: get(), release() (refused while kernels taken from it are alive; the caller then
  // unloads it), is_moved_from(); moves. Each accessor below throws as get() once moved from.
  [[nodiscard]] const std::string& name() const;
  [[nodiscard]] context_ref context() const;
  /// What the driver's JIT printed (empty for machine code).
  [[nodiscard]] const std::string& info_log() const;

  /// The kernel named `name` (mangled, or extern "C"). @throws error naming module and kernel
  [[nodiscard]] kernel get_kernel(std::string_view name) const;
  /// A __device__ variable's memory. @throws error naming module and variable
  [[nodiscard]] device_span<std::byte> get_global(std::string_view name) const;

 private:
  explicit module(std::shared_ptr<detail::module_state> s) noexcept : base(std::move(s), {}) {}
};

}  // namespace cubridge
