#pragma once
// The kernel `cubridge coldstart` loads and launches: CUDA C++ source embedded in the tool and
// compiled at run time with NVRTC, so the tool needs no files next to it. NVRTC needs no driver
// and no GPU.

#include <string>
#include <string_view>
#include <vector>

namespace cubridge::tool::coldstart {

/// extern "C" name of the kernel: coldstart_fill(float* y, float a, int n) writes y[i] = a * i.
inline constexpr std::string_view kernel_name = "coldstart_fill";

/// The CUDA C++ source of the kernel.
[[nodiscard]] std::string_view kernel_source() noexcept;

/// Compiles kernel_source() with NVRTC for `architecture`: a real one ("sm_90") gives a cubin,
/// a virtual one ("compute_90") gives PTX text (NUL-terminated, as cuModuleLoadData wants it).
/// @throws std::runtime_error naming the NVRTC call, its result and the compile log.
[[nodiscard]] std::vector<char> compile_kernel(std::string_view architecture);

/// NVRTC's version, e.g. "13.0"; empty if NVRTC cannot tell.
[[nodiscard]] std::string nvrtc_version();

}  // namespace cubridge::tool::coldstart
