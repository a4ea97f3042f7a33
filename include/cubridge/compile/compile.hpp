#pragma once
// Compiling off the driver: CUDA C++ source to a cubin through NVRTC, and PTX to a cubin through
// nvJitLink, for one exact real architecture (sm_90). A serving process should hand the driver
// machine code only: a driver PTX JIT stalls every thread of the process for the whole compile
// (FACTS.md). The resulting bytes go to module::load / library::load as they are.
//
// These functions need libnvrtc / libnvJitLink from the CUDA toolkit but no driver and no GPU.
// They live in the separate library cubridge::compile, so the core library does not depend on
// NVRTC. compile_cache.hpp adds an on-disk cache in front of them.
//
// NVRTC searches no directory of its own: a source that includes the toolkit's headers
// (<cooperative_groups.h>, <cuda/std/...>, <cub/...>) compiles because cubridge adds the toolkit's
// include directories after the caller's (toolkit_include_paths, compile_options::
// search_toolkit_headers), as nvcc searches its own.

#include <cubridge/core/error.hpp>

#include <cstddef>
#include <filesystem>
#include <map>
#include <source_location>
#include <string>
#include <string_view>
#include <vector>

namespace cubridge {

/// A CUDA C++ translation unit to compile.
struct cuda_source {
  /// Name used in the compiler's messages ("filters.cu"). NVRTC also searches the directory
  /// part of this name (relative to the working directory) for `#include "..."`, first: for a
  /// name without one, the working directory (nvrtc_compile_file names a file by its path).
  std::string name = "source.cu";
  /// The program text.
  std::string text{};
};

/// A header given to NVRTC in memory; `#include "name"` (or `<name>`) finds it.
struct source_header {
  std::string name{};
  std::string content{};
};

/// What NVRTC gets besides the source.
struct compile_options {
  /// Target architecture. nvrtc_compile needs a real one ("sm_90", "sm_90a", "sm_100f"), whose
  /// SASS NVRTC writes directly (--gpu-architecture); nvrtc_compile_ptx needs a virtual one
  /// ("compute_90").
  std::string architecture = "sm_90";
  /// Directories searched for `#include` (--include-path), in this order.
  std::vector<std::filesystem::path> include_paths{};
  /// Headers given in memory; names must be distinct.
  std::vector<source_header> headers{};
  /// Macros: {"N", "256"} becomes -DN=256, {"FAST", ""} becomes -DFAST= (defined, empty).
  std::map<std::string, std::string> defines{};
  /// Expressions naming __global__ functions or __device__ variables, e.g. "scale<float>",
  /// to instantiate and look up (nvrtcAddNameExpression); compiled_image::lowered_names maps
  /// each to its mangled name.
  std::vector<std::string> name_expressions{};
  /// Further NVRTC options, passed in this order, e.g. "-std=c++20", "--use_fast_math",
  /// "-lineinfo". The architecture must not be given here.
  std::vector<std::string> extra_options{};
  /// Search the CUDA toolkit's own headers (toolkit_include_paths()) after include_paths and any
  /// -I / --include-path of extra_options, so that the caller's headers come first. Off: NVRTC
  /// searches only what is given here.
  bool search_toolkit_headers = true;
};

/// Machine code made by nvrtc_compile or ptx_to_cubin.
struct compiled_image {
  /// An ELF cubin for exactly the requested architecture; hand it to module::load.
  std::vector<std::byte> cubin{};
  /// Each name expression -> its mangled ("lowered") name, for module::get_kernel.
  std::map<std::string, std::string> lowered_names{};
  /// The compiler's log (warnings, or nvJitLink's info log); often empty.
  std::string log{};
};

/// PTX made by nvrtc_compile_ptx.
struct compiled_ptx {
  /// PTX text (without a trailing NUL) for the requested virtual architecture.
  std::string ptx{};
  /// Each name expression -> its mangled name.
  std::map<std::string, std::string> lowered_names{};
  /// NVRTC's log; often empty.
  std::string log{};
};

/// How to turn PTX into a cubin with nvJitLink.
struct ptx_link_options {
  /// Target real architecture, e.g. "sm_90" (becomes -arch=sm_90).
  std::string architecture = "sm_90";
  /// A name for messages ("filters.ptx").
  std::string name = "input.ptx";
  /// Further nvJitLink options in this order, e.g. "-O3", "-lineinfo". Not -arch.
  std::vector<std::string> extra_options{};
};

/// A library version as the library reports it at run time.
struct library_version {
  int major = 0;
  int minor = 0;
};

/// Raised when NVRTC or nvJitLink fails. source() is error_source::nvrtc (code() an
/// nvrtcResult) or error_source::nvjitlink (code() an nvJitLinkResult); code_name() its name,
/// e.g. "NVRTC_ERROR_COMPILATION". what() contains the source's name, the architecture and
/// the compiler's whole log, which names the failing line ("filters.cu(12): error: ...").
class compile_error : public error {
 public:
  compile_error(error_source source, int code, std::string code_name, std::string description,
                std::string call, std::string source_name, std::string architecture,
                std::string log, std::source_location where);
  /// The name of the source or PTX that failed to compile.
  [[nodiscard]] const std::string& source_name() const noexcept { return source_name_; }
  /// The architecture it was compiled for.
  [[nodiscard]] const std::string& architecture() const noexcept { return architecture_; }
  /// The compiler's log (NVRTC's program log, or nvJitLink's error log); may be empty.
  [[nodiscard]] const std::string& log() const noexcept { return log_; }

 private:
  std::string source_name_;
  std::string architecture_;
  std::string log_;
};

/// Compiles CUDA C++ to a cubin for options.architecture with NVRTC (nvrtcGetCUBIN), and looks
/// up the lowered names of options.name_expressions.
/// Throws cubridge::error (errc::precondition) for an architecture that is not "sm_<digits>"
/// with an optional "a"/"f" suffix, an architecture option in extra_options or duplicate
/// header names; compile_error (error_source::nvrtc) with NVRTC's log when NVRTC fails.
[[nodiscard]] compiled_image nvrtc_compile(const cuda_source& source,
                                           const compile_options& options = {});

/// Compiles the CUDA C++ file `file` as nvrtc_compile does. Messages (compile_error::source_name,
/// what()) name it by its file name ("filters.cu"); NVRTC is given its absolute path, so that a
/// quoted include is looked for beside it first, as nvcc does, never in the working directory
/// (where NVRTC looks for a source named without a directory). The file's directory also goes
/// first in options.include_paths.
/// Throws cubridge::error (errc::io) naming the path when the file cannot be read, is not a
/// regular file or is over 2 GiB (detail::max_image_bytes); otherwise as nvrtc_compile.
[[nodiscard]] compiled_image nvrtc_compile_file(const std::filesystem::path& file,
                                                const compile_options& options = {});

/// The CUDA toolkit's header directories that compiles search after the caller's
/// (compile_options::search_toolkit_headers): <cuda>/include and, where there is one (CUDA 13),
/// <cuda>/include/cccl, of the toolkit the loaded libnvrtc belongs to (<cuda>/lib64/libnvrtc.so
/// -> <cuda>/include, also through the links of a libnvrtc.so elsewhere). Only directories that
/// exist; empty where NVRTC's toolkit has none (a runtime-only install, a Python wheel). Looked
/// up once per process. Never throws.
[[nodiscard]] const std::vector<std::filesystem::path>& toolkit_include_paths() noexcept;

/// Compiles CUDA C++ to PTX for a virtual options.architecture ("compute_90") with NVRTC
/// (nvrtcGetPTX). The PTX can be linked later with ptx_to_cubin.
/// Throws as nvrtc_compile, except that the architecture must be "compute_<digits>" with an
/// optional "a"/"f" suffix.
[[nodiscard]] compiled_ptx nvrtc_compile_ptx(const cuda_source& source,
                                             const compile_options& options);

/// Compiles and links PTX text to a cubin for options.architecture with nvJitLink
/// (NVJITLINK_INPUT_PTX). The log is nvJitLink's info log.
/// Throws cubridge::error (errc::precondition) for an empty PTX text, an architecture that is
/// not "sm_<digits>[a|f]" or -arch in extra_options; compile_error (error_source::nvjitlink)
/// with nvJitLink's error log when nvJitLink refuses the options or the PTX.
[[nodiscard]] compiled_image ptx_to_cubin(std::string_view ptx,
                                          const ptx_link_options& options = {});

/// The NVRTC library's version (nvrtcVersion). Throws compile_error if NVRTC fails.
[[nodiscard]] library_version nvrtc_version();

/// The nvJitLink library's version (nvJitLinkVersion). Throws compile_error if it fails.
[[nodiscard]] library_version nvjitlink_version();

}  // namespace cubridge
