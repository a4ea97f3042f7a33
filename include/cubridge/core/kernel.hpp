#pragma once
// A kernel found in a module or library, with its real parameter list from the driver, and the
// typed launch that checks arguments against it before anything reaches the GPU.

#include <cubridge/core/device_span.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/core/kernel_arguments.hpp>
#include <cubridge/core/launch_config.hpp>

#include <cuda.h>

#include <array>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace cubridge {

/// One kernel parameter as the driver reports it (cuFuncGetParamInfo / cuKernelGetParamInfo).
struct parameter_info {
  std::size_t offset = 0;
  std::size_t size = 0;
};

/// A launch shape with the most resident threads per SM, as cuOccupancyMaxPotentialBlockSize
/// suggests it (kernel::suggested_block_size).
struct occupancy_suggestion {
  /// Threads per block.
  unsigned block_size = 0;
  /// The fewest blocks of that size that fill every SM of the device as far as occupancy allows:
  /// a grid smaller than this leaves SMs idle.
  unsigned min_grid_size = 0;
};

namespace detail {
/// What a host argument becomes on the way to the kernel: spans and buffers pass their pointer.
template <class A>
struct kernel_argument {
  using type = A;
  static const A& convert(const A& a) noexcept { return a; }
};
template <class T>
struct kernel_argument<device_span<T>> {
  using type = T*;
  static T* convert(const device_span<T>& s) noexcept { return s.data(); }
};
}  // namespace detail
enum class allocator_api;
template <class T, allocator_api Api>
class device_buffer;
namespace detail {
template <class T, allocator_api Api>
struct kernel_argument<device_buffer<T, Api>> {
  using type = T*;
  /// @throws error (errc::precondition) for a moved-from buffer, so nothing launches on it.
  static T* convert(const device_buffer<T, Api>& b) { return b.data(); }
};
template <class A>
using kernel_argument_t = typename kernel_argument<std::remove_cvref_t<A>>::type;

/// Calls `f(arguments)` with `args` converted (spans and buffers to T*) and laid out as
/// cuLaunchKernel's kernelParams; the array and the values it points to live for the call.
template <class F, class... Args>
decltype(auto) with_kernel_arguments(F&& f, const Args&... args) {
  std::tuple<kernel_argument_t<Args>...> values{
      kernel_argument<std::remove_cvref_t<Args>>::convert(args)...};
  return std::apply(
      [&](auto&... v) -> decltype(auto) {
        void* arguments[] = {static_cast<void*>(&v)..., nullptr};
        return f(arguments);
      },
      values);
}
}  // namespace detail

template <class... Args>
class typed_kernel;

/// A launchable kernel. Copyable; every copy keeps the module or library it came from loaded.
/// Launches go to the calling thread's current context (push one with scoped_current), which
/// for a module kernel must be its module's context; the launch's stream must belong to it too.
/// The launch path itself never switches contexts: that would cost more than the launch check.
class kernel {
 public:
  /// Where the handle came from: a module (context-bound CUfunction) or a library (CUkernel,
  /// launched in whatever context is current).
  enum class origin { module, library };

  /// Adopts a CUfunction made elsewhere; the caller keeps its module loaded.
  /// @throws error if the driver cannot report its parameters.
  [[nodiscard]] static kernel from_native(CUfunction function, std::string name = {});

  [[nodiscard]] const std::string& name() const noexcept { return state_->name; }
  [[nodiscard]] origin source() const noexcept { return state_->source; }
  /// The handle cuLaunchKernel takes (a CUkernel is cast, as the driver documents).
  [[nodiscard]] CUfunction launch_handle() const noexcept { return state_->launch_handle; }
  /// The kernel's parameters, in order, as the driver reports them.
  [[nodiscard]] std::span<const parameter_info> parameters() const noexcept {
    return state_->parameters;
  }
  /// A function attribute (registers, shared memory, max threads per block ...). For a library
  /// kernel, as loaded on `dev` (default device 0). @throws error naming the kernel
  [[nodiscard]] int attribute(CUfunction_attribute which, int device_ordinal = 0) const;

  // Occupancy, asked in the calling thread's current context as a launch is: for a module kernel
  // its module's context, for a library kernel the context whose device it is computed for.
  /// How many blocks of `block_size` threads, each with `dynamic_shared_bytes` of dynamic shared
  /// memory, fit on one SM at once (cuOccupancyMaxActiveBlocksPerMultiprocessor).
  /// @throws error (errc::precondition) for a block size of 0 or above INT_MAX; error naming the
  ///         kernel, the block size and the shared memory if the driver refuses.
  [[nodiscard]] unsigned max_active_blocks_per_sm(unsigned block_size,
                                                  unsigned dynamic_shared_bytes = 0) const;
  /// The block size that puts the most threads on each SM, with `dynamic_shared_bytes` of dynamic
  /// shared memory per block, and the grid that fills the device at that size
  /// (cuOccupancyMaxPotentialBlockSize). `block_size_limit` caps the block size; 0: the kernel's
  /// own limit. @throws error naming the kernel if the driver refuses; error
  /// (errc::precondition) for a limit above INT_MAX.
  [[nodiscard]] occupancy_suggestion suggested_block_size(unsigned dynamic_shared_bytes = 0,
                                                          unsigned block_size_limit = 0) const;

  /// Launches with `args`, checked against parameters(): a wrong count or size throws
  /// launch_argument_error naming the kernel, the parameter index and both sizes, and nothing is
  /// launched. device_span<T> and device_buffer<T> arguments pass as T*. @throws error if the
  /// driver refuses.
  template <class... Args>
  void launch(const launch_config& config, const Args&... args) const {
    static_assert((std::is_trivially_copyable_v<detail::kernel_argument_t<Args>> && ...),
                  "kernel arguments must be trivially copyable");
    static constexpr std::array<std::size_t, sizeof...(Args)> sizes{
        sizeof(detail::kernel_argument_t<Args>)...};
    check_arguments(sizes);
    launch_unchecked(config, args...);
  }

  /// Launches with an argument list assembled at run time, checked against parameters() as the
  /// typed launch checks its arguments (count, then each size). @throws launch_argument_error
  /// naming the kernel, the parameter index and both sizes; error if the driver refuses.
  void launch(const launch_config& config, const kernel_arguments& args) const;

  /// A view of this kernel for one argument list, checked once here so that its launches skip
  /// the check. @throws launch_argument_error as launch does.
  template <class... Args>
  [[nodiscard]] typed_kernel<Args...> typed() const;

  /// Launches with a prepared argument array (as cuLaunchKernel's kernelParams). No checks.
  /// @throws error naming the kernel and the configuration if the driver refuses.
  void launch_raw(const launch_config& config, void** arguments) const;

 private:
  template <class... Args>
  friend class typed_kernel;
  friend class module;
  friend class library;

  struct state {
    std::shared_ptr<const void> owner;  // keeps the module or library loaded
    std::string name;
    origin source = origin::module;
    CUfunction launch_handle = nullptr;
    CUkernel library_kernel = nullptr;
    std::vector<parameter_info> parameters;
  };
  explicit kernel(std::shared_ptr<const state> s) noexcept : state_(std::move(s)) {}
  static kernel make(std::shared_ptr<const void> owner, std::string name, CUfunction function,
                     CUkernel library_kernel);

  template <std::size_t N>
  void check_arguments(const std::array<std::size_t, N>& sizes) const {
    const auto& p = state_->parameters;
    if (p.size() != N) [[unlikely]]
      throw_argument_count(N);
    for (std::size_t i = 0; i < N; ++i)
      if (p[i].size != sizes[i]) [[unlikely]]
        throw_argument_size(i, sizes[i]);
  }
  [[noreturn]] void throw_argument_count(std::size_t given) const;
  [[noreturn]] void throw_argument_size(std::size_t index, std::size_t given) const;

  template <class... Args>
  void launch_unchecked(const launch_config& config, const Args&... args) const {
    detail::with_kernel_arguments([&](void** arguments) { launch_raw(config, arguments); },
                                  args...);
  }

  std::shared_ptr<const state> state_;
};

/// A kernel whose argument list was checked once; launches go straight to the driver.
template <class... Args>
class typed_kernel {
 public:
  void launch(const launch_config& config, const Args&... args) const {
    kernel_.launch_unchecked(config, args...);
  }
  [[nodiscard]] const kernel& untyped() const noexcept { return kernel_; }

 private:
  friend class kernel;
  explicit typed_kernel(kernel k) noexcept : kernel_(std::move(k)) {}
  kernel kernel_;
};

template <class... Args>
typed_kernel<Args...> kernel::typed() const {
  static constexpr std::array<std::size_t, sizeof...(Args)> sizes{
      sizeof(detail::kernel_argument_t<Args>)...};
  check_arguments(sizes);
  return typed_kernel<Args...>(*this);
}

}  // namespace cubridge
