#pragma once
// A context-independent library (cuLibraryLoadData): loaded once, usable in every context of
// the process; its kernels launch in whatever context is current. Under lazy loading the
// per-context load happens at the first launch or lookup (FACTS.md).

#include <cubridge/core/kernel.hpp>
#include <cubridge/core/module.hpp>

#include <memory>

namespace cubridge {

/// Owning, move-only CUlibrary. Kernels taken from it keep it loaded.
class library {
 public:
  /// Loads `image`. With options.check_target, the image must have code for `target` (default:
  /// device 0's capability). @throws image_error, or error with the driver's JIT log.
  [[nodiscard]] static library load(std::span<const std::byte> image, load_options options = {});
  /// @throws error (errc::io) naming the path, and as load().
  [[nodiscard]] static library load_file(const std::filesystem::path& path,
                                         load_options options = {});

  library(library&&) noexcept = default;
  library& operator=(library&&) noexcept = default;
  ~library() = default;

  [[nodiscard]] CUlibrary get() const noexcept;
  [[nodiscard]] const std::string& name() const noexcept;
  /// The kernel named `name`; needs a current context (any), in which the driver reads its
  /// parameter list. @throws error naming library and kernel; errc::precondition without a
  /// current context.
  [[nodiscard]] kernel get_kernel(std::string_view name) const;

 private:
  struct state;
  explicit library(std::shared_ptr<const state> s) noexcept : state_(std::move(s)) {}
  std::shared_ptr<const state> state_;
};

}  // namespace cubridge
