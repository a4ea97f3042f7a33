// library: bytes -> (inspected) image -> context-independent library -> kernel (library.hpp).
#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/detail/file_io.hpp>
#include <cubridge/core/detail/loaded_kernels.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/image.hpp>
#include <cubridge/core/kernel.hpp>
#include <cubridge/core/library.hpp>
#include <cubridge/core/module.hpp>

#include "loading.hpp"

#include <string>
#include <utility>
#include <vector>

namespace cubridge {
namespace {

using core_internal::driver_image;
using core_internal::jit_logs;
using core_internal::with_log;

/// The names of the kernels the driver has for `handle` (cuLibraryEnumerateKernels).
std::vector<std::string> library_kernel_names(CUlibrary handle, const std::string& what) {
  unsigned count = 0;
  CUBRIDGE_CU(cuLibraryGetKernelCount, (&count, handle), "counting the kernels of " + what);
  std::vector<CUkernel> kernels(count);
  if (count != 0)
    CUBRIDGE_CU(cuLibraryEnumerateKernels, (kernels.data(), count, handle),
                "listing the kernels of " + what);
  std::vector<std::string> names;
  for (CUkernel k : kernels) {
    const char* name = nullptr;
    CUBRIDGE_CU(cuKernelGetName, (&name, k), "naming a kernel of " + what);
    if (name) names.emplace_back(name);
  }
  return names;
}

}  // namespace

struct detail::library_state {
  CUlibrary handle = nullptr;
  std::string name;
  library_state(CUlibrary h, std::string n) : handle(h), name(std::move(n)) {}
  library_state(const library_state&) = delete;
  library_state& operator=(const library_state&) = delete;
  ~library_state() {
    // A released library's handle is null: the caller unloads it.
    if (handle) detail::check_release(driver::api().cuLibraryUnload(handle), "cuLibraryUnload");
  }
};

library library::load(std::span<const std::byte> image, load_options options) {
  if (options.name.empty()) options.name = "<memory>";
  const std::string what = "library '" + options.name + "'";
  // A library is loaded for every context; check against the current context's device, or
  // device 0 when none is current. The kernel list is checked against the same device.
  const auto current = context_ref::current();
  const std::optional<compute_capability> target =
      (current ? current.device() : device::get(0)).capability();
  const driver_image bytes(image, inspect_image(image), options, target, what);
  jit_logs logs(options);
  CUlibrary handle = nullptr;
  const CUresult r = driver::api().cuLibraryLoadData(
      &handle, bytes.data(), logs.options.data(), logs.values.data(),
      static_cast<unsigned>(logs.options.size()), nullptr, nullptr, 0);
  if (r != CUDA_SUCCESS)
    detail::throw_driver_error(r, "cuLibraryLoadData",
                               with_log("loading " + what, logs.error_text()),
                               std::source_location::current());
  // Owned before the check, so that a refused library is unloaded.
  auto loaded = std::make_shared<detail::library_state>(handle, std::move(options.name));
  detail::require_loaded_kernels(bytes.expected_kernels(), library_kernel_names(handle, what),
                                 "cuLibraryEnumerateKernels", what);
  return library(std::move(loaded));
}

library library::load_file(const std::filesystem::path& path, load_options options) {
  if (options.name.empty()) options.name = path.filename().string();
  const auto bytes = detail::read_regular_file(path, detail::max_image_bytes, "image");
  return load(bytes, std::move(options));
}

library library::from_native(CUlibrary handle, std::string name) {
  CUBRIDGE_EXPECTS(handle != nullptr, "adopting a library: a null handle is no library to own");
  if (name.empty()) name = "<adopted>";
  return library(std::make_shared<detail::library_state>(handle, std::move(name)));
}

CUlibrary detail::library_traits::native(const value_type& state) noexcept {
  return state->handle;
}

CUlibrary detail::library_traits::release(value_type& state) {
  // A kernel holds a share of the state: released under it, the library would be unloaded by
  // the caller while the kernel still launches from it.
  CUBRIDGE_EXPECTS(state.use_count() == 1, "releasing library '" + state->name + "' while " +
                                               std::to_string(state.use_count() - 1) +
                                               " kernels taken from it are alive");
  return std::exchange(state->handle, nullptr);
}

const std::string& library::name() const {
  return owned()->name;
}

kernel library::get_kernel(std::string_view name) const {
  const auto& state = owned();
  const std::string kernel_name(name);
  // The driver reports a library kernel's parameters only with a context current
  // (cuKernelGetParamInfo gives CUDA_ERROR_INVALID_CONTEXT otherwise, seen on the H200).
  CUBRIDGE_EXPECTS(context_ref::current(),
                   "looking up kernel '" + kernel_name + "' in library '" + state->name +
                       "' needs a current context (push one with scoped_current)");
  CUkernel handle = nullptr;
  CUBRIDGE_CU(cuLibraryGetKernel, (&handle, state->handle, kernel_name.c_str()),
              "kernel '" + kernel_name + "' in library '" + state->name + "'");
  return kernel::make(state, kernel_name, reinterpret_cast<CUfunction>(handle), handle);
}

}  // namespace cubridge
