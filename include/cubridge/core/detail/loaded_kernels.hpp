#pragma once
// The check after a module or library load (module.cpp): the kernels the image says it defines
// must be among those the driver lists (cuModuleEnumerateFunctions / cuLibraryEnumerateKernels).
// GPU-free, so it is tested on the CPU (tests/test_image.cpp).

#include <cubridge/core/image.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace cubridge::detail {

/// The kernels that every cubin or PTX target of `info` able to run on a device of compute
/// capability `device` defines: whichever of them the driver picks, it has these. Empty when no
/// target can run there. Throws cubridge::error (errc::precondition) for a bad capability, as
/// can_run_on does.
[[nodiscard]] std::vector<std::string> kernels_every_entry_defines(const image_info& info,
                                                                   compute_capability device);

/// Does nothing if every name of `expected` is in `loaded`; otherwise throws
/// cubridge::image_error (errc::bad_image) from `call`, naming `what` and each missing kernel.
/// Kernels only the driver lists are fine: it may know entries the image reader skips.
void require_loaded_kernels(const std::vector<std::string>& expected,
                            const std::vector<std::string>& loaded, std::string_view call,
                            const std::string& what);

}  // namespace cubridge::detail
