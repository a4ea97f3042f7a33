// module: bytes -> (inspected) image -> loaded module -> kernel (module.hpp).
#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/detail/file_io.hpp>
#include <cubridge/core/detail/loaded_kernels.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/image.hpp>
#include <cubridge/core/kernel.hpp>
#include <cubridge/core/module.hpp>
#include <cubridge/core/scoped_current.hpp>

#include "loading.hpp"

#include <string>
#include <utility>
#include <vector>

namespace cubridge {

namespace {

using core_internal::driver_image;
using core_internal::jit_logs;
using core_internal::with_log;

/// The names of the kernels the driver loaded for `handle` (cuModuleEnumerateFunctions).
std::vector<std::string> module_kernel_names(CUmodule handle, const std::string& what) {
  unsigned count = 0;
  CUBRIDGE_CU(cuModuleGetFunctionCount, (&count, handle), "counting the kernels of " + what);
  std::vector<CUfunction> functions(count);
  if (count != 0)
    CUBRIDGE_CU(cuModuleEnumerateFunctions, (functions.data(), count, handle),
                "listing the kernels of " + what);
  std::vector<std::string> names;
  for (CUfunction f : functions) {
    const char* name = nullptr;
    CUBRIDGE_CU(cuFuncGetName, (&name, f), "naming a kernel of " + what);
    if (name) names.emplace_back(name);
  }
  return names;
}

}  // namespace

struct detail::module_state {
  context_arg ctx;
  CUmodule handle = nullptr;
  std::string name;
  std::string info_log;
  module_state(context_arg c, CUmodule h, std::string n, std::string log)
      : ctx(std::move(c)), handle(h), name(std::move(n)), info_log(std::move(log)) {}
  module_state(const module_state&) = delete;
  module_state& operator=(const module_state&) = delete;
  ~module_state() {
    // cuModuleUnload blocks until the module's running kernels finish (FACTS.md). A released
    // module's handle is null: the caller unloads it.
    if (handle) detail::check_release(driver::api().cuModuleUnload(handle), "cuModuleUnload");
  }
  [[nodiscard]] std::string describe() const {
    return "module '" + name + "' in " + ctx.ref().describe();
  }
};

module module::load(context_arg ctx, std::span<const std::byte> image, load_options options) {
  return load(std::move(ctx), image, inspect_image(image), std::move(options));
}

module module::load(context_arg ctx, std::span<const std::byte> image, const image_info& info,
                    load_options options) {
  if (options.name.empty()) options.name = "<memory>";
  const std::string what = "module '" + options.name + "' in " + ctx.ref().describe();
  const auto target = ctx.ref().device().capability();
  const driver_image bytes(image, info, options, target, what);
  scoped_current guard(ctx.ref());
  jit_logs logs(options);
  CUmodule handle = nullptr;
  const CUresult r = driver::api().cuModuleLoadDataEx(&handle, bytes.data(),
                                                      static_cast<unsigned>(logs.options.size()),
                                                      logs.options.data(), logs.values.data());
  if (r != CUDA_SUCCESS)
    detail::throw_driver_error(r, "cuModuleLoadDataEx",
                               with_log("loading " + what, logs.error_text()),
                               std::source_location::current());
  // Owned before the check, so that a refused module is unloaded.
  auto loaded = std::make_shared<detail::module_state>(std::move(ctx), handle,
                                                       std::move(options.name), logs.info_text());
  detail::require_loaded_kernels(bytes.expected_kernels(), module_kernel_names(handle, what),
                                 "cuModuleEnumerateFunctions", what);
  return module(std::move(loaded));
}

module module::load_file(context_arg ctx, const std::filesystem::path& path, load_options options) {
  if (options.name.empty()) options.name = path.filename().string();
  // A regular file only: a FIFO or device named here would block the loader or never end.
  const auto bytes = detail::read_regular_file(path, detail::max_image_bytes, "image");
  return load(std::move(ctx), bytes, std::move(options));
}

module module::from_native(CUmodule handle, context_arg ctx, std::string name) {
  CUBRIDGE_EXPECTS(handle != nullptr, "adopting a module: a null handle is no module to own");
  if (name.empty()) name = "<adopted>";
  return module(std::make_shared<detail::module_state>(std::move(ctx), handle, std::move(name),
                                                       std::string{}));
}

CUmodule detail::module_traits::native(const value_type& state) noexcept {
  return state->handle;
}

CUmodule detail::module_traits::release(value_type& state) {
  // A kernel holds a share of the state: released under it, the module would be unloaded by the
  // caller while the kernel still launches from it.
  CUBRIDGE_EXPECTS(state.use_count() == 1, "releasing " + state->describe() + " while " +
                                               std::to_string(state.use_count() - 1) +
                                               " kernels taken from it are alive");
  return std::exchange(state->handle, nullptr);
}

const std::string& module::name() const {
  return owned()->name;
}
context_ref module::context() const {
  return owned()->ctx.ref();
}
const std::string& module::info_log() const {
  return owned()->info_log;
}

kernel module::get_kernel(std::string_view name) const {
  const auto& state = owned();
  const std::string kernel_name(name);
  CUfunction function = nullptr;
  CUBRIDGE_CU(cuModuleGetFunction, (&function, state->handle, kernel_name.c_str()),
              "kernel '" + kernel_name + "' in " + state->describe());
  return kernel::make(state, kernel_name, function, nullptr);
}

device_span<std::byte> module::get_global(std::string_view name) const {
  const auto& state = owned();
  const std::string variable(name);
  CUdeviceptr address = 0;
  std::size_t bytes = 0;
  CUBRIDGE_CU(cuModuleGetGlobal, (&address, &bytes, state->handle, variable.c_str()),
              "variable '" + variable + "' in " + state->describe());
  return device_span<std::byte>::from_native(address, bytes);
}

}  // namespace cubridge
