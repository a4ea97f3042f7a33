#pragma once
// One way from a source to machine code for a device: CUDA C++ through NVRTC, PTX through
// nvJitLink, a cubin or fatbin checked to run there and passed through as it is. Reloading from
// a directory (hot_reload.hpp), the update endpoint's sink (hot_module_sink.hpp) and
// `cubridge push` all build their code here, so a source becomes the same code whichever way it
// came, and the driver is never handed PTX to JIT (FACTS.md).
//
//   const auto code = cubridge::build_machine_code(cubridge::source_kind::cuda_source, text,
//                                                  "filters.cu", device.capability());
//   auto filters = cubridge::module::load(ctx, code);
//
// Needs NVRTC and nvJitLink (cubridge::compile) but no driver and no GPU.

#include <cubridge/compile/compile.hpp>
#include <cubridge/compile/compile_cache.hpp>
#include <cubridge/core/compute_capability.hpp>

#include <cstddef>
#include <filesystem>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace cubridge {

/// What a source is, as build_machine_code takes it.
enum class source_kind {
  cuda_source,  ///< CUDA C++ text (.cu): compiled by NVRTC
  ptx,          ///< PTX text (.ptx): linked by nvJitLink
  cubin,        ///< machine code for one architecture (.cubin)
  fatbin,       ///< a fat binary (.fatbin), as nvcc -fatbin writes it
};

/// The kind a file's extension names: .cu, .ptx, .cubin or .fatbin (exactly these, in lower
/// case); nullopt for any other.
[[nodiscard]] std::optional<source_kind> source_kind_of(const std::filesystem::path& file);

/// How build_machine_code compiles and links.
struct build_options {
  /// For CUDA C++: include paths, in-memory headers, defines, name expressions, further NVRTC
  /// options. Its architecture is not used: the code is built for the target.
  compile_options compile{};
  /// When given, CUDA C++ and PTX are built through it (get_or_compile, get_or_link); it must
  /// outlive the call.
  compile_cache* cache = nullptr;
};

/// Machine code for a device of compute capability `target` from `bytes`, a source of `kind`
/// called `name` (the source's name for NVRTC and nvJitLink, and in every message):
///   - cuda_source: an NVRTC cubin for to_string(target) ("sm_90", "sm_90a");
///   - ptx: an nvJitLink cubin for to_string(target);
///   - cubin, fatbin: `bytes` as they are, once inspect_image finds code in them that runs on
///     `target` (require_runs_on).
/// @throws compile_error with the compiler's log; image_error (errc::bad_image) for a cubin or
///         fatbin that is no image, (errc::incompatible_image) for one with no code for
///         `target`, naming `name`; error (errc::precondition) for an empty PTX text or options
///         NVRTC or nvJitLink refuse (see compile.hpp); error (errc::io) when the cache cannot
///         read an included file.
[[nodiscard]] std::vector<std::byte> build_machine_code(source_kind kind,
                                                        std::span<const std::byte> bytes,
                                                        std::string_view name,
                                                        compute_capability target,
                                                        const build_options& options = {});

}  // namespace cubridge
