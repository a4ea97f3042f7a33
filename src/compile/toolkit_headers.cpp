// Where the CUDA toolkit's own headers are, found from the NVRTC this process loaded
// (toolkit_include_paths in compile.hpp).
#include <cubridge/compile/compile.hpp>

#include <dlfcn.h>
#include <nvrtc.h>

#include <filesystem>
#include <system_error>
#include <vector>

namespace cubridge {

namespace {

namespace fs = std::filesystem;

/// <cuda>/include and <cuda>/include/cccl beside `library_directory` (<cuda>/lib64, or
/// <cuda>/targets/<arch>/lib), those that are directories.
std::vector<fs::path> include_directories_beside(const fs::path& library_directory) {
  std::vector<fs::path> found;
  std::error_code ec;
  const fs::path include = library_directory.parent_path() / "include";
  if (!fs::is_directory(include, ec)) return found;
  found.push_back(include);
  // CUDA 13 moved CCCL (cuda/std, cub, thrust, nv/target), which cooperative_groups.h needs,
  // into include/cccl.
  if (fs::is_directory(include / "cccl", ec)) found.push_back(include / "cccl");
  return found;
}

std::vector<fs::path> find_toolkit_include_paths() {
  Dl_info info{};
  // Any NVRTC function: dladdr names the shared library that holds it.
  if (::dladdr(reinterpret_cast<void*>(&nvrtcVersion), &info) == 0 || !info.dli_fname ||
      !*info.dli_fname)
    return {};
  const fs::path loaded = info.dli_fname;
  if (!loaded.is_absolute()) return {};  // linked into the program itself: no toolkit to find
  // The path the loader used first (/usr/local/cuda/lib64/...), else where its links lead (a
  // libnvrtc.so in a system directory that links into a toolkit).
  if (auto found = include_directories_beside(loaded.parent_path()); !found.empty()) return found;
  std::error_code ec;
  const fs::path real = fs::canonical(loaded, ec);
  if (ec) return {};
  return include_directories_beside(real.parent_path());
}

}  // namespace

const std::vector<std::filesystem::path>& toolkit_include_paths() noexcept {
  // Looked up once: the NVRTC a process loaded does not move.
  static const std::vector<std::filesystem::path> paths = [] {
    try {
      return find_toolkit_include_paths();
    } catch (...) {  // never throws (compile.hpp): no headers found
      return std::vector<std::filesystem::path>{};
    }
  }();
  return paths;
}

}  // namespace cubridge
