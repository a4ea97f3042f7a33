// module, library and kernel: bytes -> (inspected) image -> loaded module -> kernel -> launch.
#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/detail/describe.hpp>
#include <cubridge/core/detail/file_io.hpp>
#include <cubridge/core/detail/loaded_kernels.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/image.hpp>
#include <cubridge/core/kernel.hpp>
#include <cubridge/core/library.hpp>
#include <cubridge/core/module.hpp>
#include <cubridge/core/scoped_current.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace cubridge {

std::vector<std::byte> read_file_bytes(const std::filesystem::path& path) {
  // A regular file only: a FIFO or device named here would block the loader or never end. 2 GiB
  // is the most an image may have (inspect_image_file).
  return detail::read_regular_file(path, std::uint64_t{2} << 30, "file");
}

namespace {

/// The driver's JIT options and the log buffers they point into.
struct jit_logs {
  explicit jit_logs(const load_options& o)
      : info(o.log_bytes + 1, '\0'), error(o.log_bytes + 1, '\0') {
    add(CU_JIT_INFO_LOG_BUFFER, info.data());
    add(CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, reinterpret_cast<void*>(o.log_bytes));
    add(CU_JIT_ERROR_LOG_BUFFER, error.data());
    add(CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, reinterpret_cast<void*>(o.log_bytes));
    if (o.jit_optimization_level >= 0)
      add(CU_JIT_OPTIMIZATION_LEVEL,
          reinterpret_cast<void*>(static_cast<std::uintptr_t>(o.jit_optimization_level)));
  }
  void add(CUjit_option option, void* value) {
    options.push_back(option);
    values.push_back(value);
  }
  [[nodiscard]] std::string info_text() const { return info.c_str(); }
  [[nodiscard]] std::string error_text() const { return error.c_str(); }
  std::string info, error;
  std::vector<CUjit_option> options;
  std::vector<void*> values;
};

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

/// Bytes the driver can take: the caller's image as it is, or, for PTX without its trailing NUL
/// (as a file's bytes usually are), a terminated copy. Machine code is never copied.
class driver_image {
 public:
  /// Checks the targets of `image`, whose inspect_image is `info`. @throws image_error
  driver_image(std::span<const std::byte> image, const image_info& info,
               const load_options& options, std::optional<compute_capability> target,
               const std::string& what)
      : image_(image) {
    if (options.check_target && target) require_runs_on(info, *target, what);
    if (target) expected_kernels_ = detail::kernels_every_entry_defines(info, *target);
    if (info.kind == image_kind::ptx && (image.empty() || image.back() != std::byte{0})) {
      terminated_.assign(image.begin(), image.end());
      terminated_.push_back(std::byte{0});
    }
  }
  [[nodiscard]] const void* data() const noexcept {
    return terminated_.empty() ? static_cast<const void*>(image_.data()) : terminated_.data();
  }
  /// The kernels the loaded module or library must have (kernels_every_entry_defines).
  [[nodiscard]] const std::vector<std::string>& expected_kernels() const noexcept {
    return expected_kernels_;
  }

 private:
  std::span<const std::byte> image_;
  std::vector<std::byte> terminated_;
  std::vector<std::string> expected_kernels_;
};

std::string with_log(std::string what, const std::string& log) {
  if (!log.empty()) what += "; JIT log: " + log;
  return what;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// module

struct module::state {
  context_arg ctx;
  CUmodule handle = nullptr;
  std::string name;
  std::string info_log;
  state(context_arg c, CUmodule h, std::string n, std::string log)
      : ctx(std::move(c)), handle(h), name(std::move(n)), info_log(std::move(log)) {}
  state(const state&) = delete;
  state& operator=(const state&) = delete;
  ~state() {
    // cuModuleUnload blocks until the module's running kernels finish (FACTS.md).
    detail::check_release(driver::api().cuModuleUnload(handle), "cuModuleUnload");
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
  auto loaded = std::make_shared<const state>(std::move(ctx), handle, std::move(options.name),
                                              logs.info_text());
  detail::require_loaded_kernels(bytes.expected_kernels(), module_kernel_names(handle, what),
                                 "cuModuleEnumerateFunctions", what);
  return module(std::move(loaded));
}

module module::load_file(context_arg ctx, const std::filesystem::path& path, load_options options) {
  if (options.name.empty()) options.name = path.filename().string();
  const auto bytes = read_file_bytes(path);
  return load(std::move(ctx), bytes, std::move(options));
}

CUmodule module::get() const noexcept {
  return state_ ? state_->handle : nullptr;
}
const std::string& module::name() const noexcept {
  return state_->name;
}
context_ref module::context() const noexcept {
  return state_->ctx.ref();
}
const std::string& module::info_log() const noexcept {
  return state_->info_log;
}

kernel module::get_kernel(std::string_view name) const {
  CUBRIDGE_EXPECTS(state_ != nullptr, "module was moved from");
  const std::string kernel_name(name);
  CUfunction function = nullptr;
  CUBRIDGE_CU(cuModuleGetFunction, (&function, state_->handle, kernel_name.c_str()),
              "kernel '" + kernel_name + "' in " + state_->describe());
  return kernel::make(state_, kernel_name, function, nullptr);
}

device_span<std::byte> module::get_global(std::string_view name) const {
  CUBRIDGE_EXPECTS(state_ != nullptr, "module was moved from");
  const std::string variable(name);
  CUdeviceptr address = 0;
  std::size_t bytes = 0;
  CUBRIDGE_CU(cuModuleGetGlobal, (&address, &bytes, state_->handle, variable.c_str()),
              "variable '" + variable + "' in " + state_->describe());
  return device_span<std::byte>::from_native(address, bytes);
}

// ---------------------------------------------------------------------------------------------
// library

struct library::state {
  CUlibrary handle = nullptr;
  std::string name;
  state(CUlibrary h, std::string n) : handle(h), name(std::move(n)) {}
  state(const state&) = delete;
  state& operator=(const state&) = delete;
  ~state() { detail::check_release(driver::api().cuLibraryUnload(handle), "cuLibraryUnload"); }
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
  auto loaded = std::make_shared<const state>(handle, std::move(options.name));
  detail::require_loaded_kernels(bytes.expected_kernels(), library_kernel_names(handle, what),
                                 "cuLibraryEnumerateKernels", what);
  return library(std::move(loaded));
}

library library::load_file(const std::filesystem::path& path, load_options options) {
  if (options.name.empty()) options.name = path.filename().string();
  const auto bytes = read_file_bytes(path);
  return load(bytes, std::move(options));
}

CUlibrary library::get() const noexcept {
  return state_ ? state_->handle : nullptr;
}
const std::string& library::name() const noexcept {
  return state_->name;
}

kernel library::get_kernel(std::string_view name) const {
  CUBRIDGE_EXPECTS(state_ != nullptr, "library was moved from");
  const std::string kernel_name(name);
  // The driver reports a library kernel's parameters only with a context current
  // (cuKernelGetParamInfo gives CUDA_ERROR_INVALID_CONTEXT otherwise, seen on the H200).
  CUBRIDGE_EXPECTS(context_ref::current(),
                   "looking up kernel '" + kernel_name + "' in library '" + state_->name +
                       "' needs a current context (push one with scoped_current)");
  CUkernel handle = nullptr;
  CUBRIDGE_CU(cuLibraryGetKernel, (&handle, state_->handle, kernel_name.c_str()),
              "kernel '" + kernel_name + "' in library '" + state_->name + "'");
  return kernel::make(state_, kernel_name, reinterpret_cast<CUfunction>(handle), handle);
}

// ---------------------------------------------------------------------------------------------
// kernel

kernel kernel::make(std::shared_ptr<const void> owner, std::string name, CUfunction function,
                    CUkernel library_kernel) {
  auto s = std::make_shared<state>();
  s->owner = std::move(owner);
  s->name = std::move(name);
  s->source = library_kernel ? origin::library : origin::module;
  s->launch_handle = function;
  s->library_kernel = library_kernel;
  // Ask for parameters until the driver says there are no more.
  for (std::size_t index = 0;; ++index) {
    parameter_info p;
    const CUresult r =
        library_kernel
            ? driver::api().cuKernelGetParamInfo(library_kernel, index, &p.offset, &p.size)
            : driver::api().cuFuncGetParamInfo(function, index, &p.offset, &p.size);
    if (r == CUDA_ERROR_INVALID_VALUE) break;
    if (r != CUDA_SUCCESS)
      detail::throw_driver_error(
          r, library_kernel ? "cuKernelGetParamInfo" : "cuFuncGetParamInfo",
          "parameter " + std::to_string(index) + " of kernel '" + s->name + "'",
          std::source_location::current());
    s->parameters.push_back(p);
  }
  return kernel(std::move(s));
}

kernel kernel::from_native(CUfunction function, std::string name) {
  if (name.empty()) {
    const char* driver_name = nullptr;
    if (driver::api().cuFuncGetName(&driver_name, function) == CUDA_SUCCESS && driver_name)
      name = driver_name;
  }
  return make(nullptr, std::move(name), function, nullptr);
}

int kernel::attribute(CUfunction_attribute which, int device_ordinal) const {
  int value = 0;
  const std::string what =
      "attribute " + std::to_string(static_cast<int>(which)) + " of kernel '" + state_->name + "'";
  if (state_->library_kernel) {
    CUBRIDGE_CU(cuKernelGetAttribute, (&value, which, state_->library_kernel, device_ordinal),
                what);
  } else {
    CUBRIDGE_CU(cuFuncGetAttribute, (&value, which, state_->launch_handle), what);
  }
  return value;
}

void kernel::throw_argument_count(std::size_t given) const {
  detail::throw_errc(errc::bad_launch_arguments, "kernel::launch",
                     "kernel '" + state_->name + "' takes " +
                         std::to_string(state_->parameters.size()) + " parameters, " +
                         std::to_string(given) + " arguments given");
}

void kernel::throw_argument_size(std::size_t index, std::size_t given) const {
  detail::throw_errc(errc::bad_launch_arguments, "kernel::launch",
                     "kernel '" + state_->name + "' parameter " + std::to_string(index) + " is " +
                         std::to_string(state_->parameters[index].size) +
                         " bytes, the argument given is " + std::to_string(given) + " bytes");
}

void kernel::launch(const launch_config& config, const kernel_arguments& args) const {
  const auto& p = state_->parameters;
  const auto sizes = args.sizes();
  if (p.size() != sizes.size()) [[unlikely]]
    throw_argument_count(sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i)
    if (p[i].size != sizes[i]) [[unlikely]]
      throw_argument_size(i, sizes[i]);
  launch_raw(config, args.pointers());
}

void kernel::launch_raw(const launch_config& c, void** arguments) const {
  CUresult r;
  if (c.cluster.x == 0) [[likely]] {
    r = driver::api().cuLaunchKernel(state_->launch_handle, c.grid.x, c.grid.y, c.grid.z, c.block.x,
                                     c.block.y, c.block.z, c.dynamic_shared_bytes, c.stream.get(),
                                     arguments, nullptr);
  } else {
    CUlaunchAttribute cluster{};
    cluster.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    cluster.value.clusterDim.x = c.cluster.x;
    cluster.value.clusterDim.y = c.cluster.y;
    cluster.value.clusterDim.z = c.cluster.z;
    CUlaunchConfig ex{};
    detail::set_launch_shape(ex, c);
    ex.hStream = c.stream.get();
    ex.attrs = &cluster;
    ex.numAttrs = 1;
    r = driver::api().cuLaunchKernelEx(&ex, state_->launch_handle, arguments, nullptr);
  }
  if (r != CUDA_SUCCESS) [[unlikely]]
    detail::throw_driver_error(r, c.cluster.x ? "cuLaunchKernelEx" : "cuLaunchKernel",
                               "launching kernel '" + state_->name + "' with " + c.describe(),
                               std::source_location::current());
}

std::string launch_config::describe() const {
  auto d = [](const dims& v) {
    return "(" + std::to_string(v.x) + "," + std::to_string(v.y) + "," + std::to_string(v.z) + ")";
  };
  std::string text = "grid " + d(grid) + " block " + d(block) + " shared " +
                     std::to_string(dynamic_shared_bytes) + " B";
  if (cluster.x) text += " cluster " + d(cluster);
  if (stream.is_moved_from()) return text + " on a moved-from stream";
  return text + " on stream " + detail::hex(stream.get());
}

}  // namespace cubridge
