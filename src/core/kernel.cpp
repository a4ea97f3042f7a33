// kernel: its real parameter list, and checked launches (kernel.hpp).
#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/detail/describe.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/kernel.hpp>
#include <cubridge/core/launch_config.hpp>

#include <limits>
#include <string>
#include <vector>

namespace cubridge {

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

namespace {
/// `value` as the int the occupancy calls take. @throws error (errc::precondition) above INT_MAX.
int occupancy_int(unsigned value, const char* what, const std::string& kernel_name) {
  CUBRIDGE_EXPECTS(value <= static_cast<unsigned>(std::numeric_limits<int>::max()),
                   std::string(what) + " " + std::to_string(value) + " for kernel '" + kernel_name +
                       "' is above INT_MAX");
  return static_cast<int>(value);
}
}  // namespace

unsigned kernel::max_active_blocks_per_sm(unsigned block_size,
                                          unsigned dynamic_shared_bytes) const {
  CUBRIDGE_EXPECTS(block_size > 0,
                   "occupancy of kernel '" + state_->name + "': a block of 0 threads");
  const int threads = occupancy_int(block_size, "block size", state_->name);
  int blocks = 0;
  CUBRIDGE_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor,
              (&blocks, state_->launch_handle, threads, dynamic_shared_bytes),
              "occupancy of kernel '" + state_->name + "' with blocks of " +
                  std::to_string(block_size) + " threads and " +
                  std::to_string(dynamic_shared_bytes) + " B of dynamic shared memory");
  return static_cast<unsigned>(blocks);
}

occupancy_suggestion kernel::suggested_block_size(unsigned dynamic_shared_bytes,
                                                  unsigned block_size_limit) const {
  const int limit = occupancy_int(block_size_limit, "block size limit", state_->name);
  int min_grid_size = 0;
  int block_size = 0;
  // No block-size-to-shared-memory callback: the same dynamic shared memory at every size.
  CUBRIDGE_CU(
      cuOccupancyMaxPotentialBlockSize,
      (&min_grid_size, &block_size, state_->launch_handle, nullptr, dynamic_shared_bytes, limit),
      "suggesting a block size for kernel '" + state_->name + "' with " +
          std::to_string(dynamic_shared_bytes) + " B of dynamic shared memory" +
          (block_size_limit ? ", at most " + std::to_string(block_size_limit) + " threads"
                            : std::string()));
  return {static_cast<unsigned>(block_size), static_cast<unsigned>(min_grid_size)};
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

}  // namespace cubridge
