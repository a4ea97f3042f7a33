#pragma once
// The compile cache's trust checks (compile_cache_directory.cpp): who may own and write the cache
// directory, the directories above it and the files the cache reads, and opening the directory
// so that what was checked is what is used (docs/compile-cache.md, "On open"). Internal to
// cubridge_compile; not installed.

#include <cubridge/core/unique_fd.hpp>

#include <sys/stat.h>

#include <filesystem>
#include <string>

namespace cubridge::compile_cache_internal {

/// "a directory owned by uid 1000, mode 0777", from what fstat found.
std::string describe(const struct stat& info);

/// Throws cubridge::error (errc::io, call "compile_cache::open"):
/// "refusing <which>: found <found>; required: <required>".
[[noreturn]] void refuse(const std::string& which, const std::string& found,
                         const std::string& required);

/// A file the cache reads (an entry): a regular file of the user's, writable only by them.
bool safe_file(const struct stat& info);

/// Opens `directory` (creating what is missing, mode 0700) one component at a time from "/",
/// never following a link, checking each directory through the descriptor it opened: what is
/// checked is what is used. Links in the given path are resolved first (so $HOME may be one);
/// the resolved path is what is checked. Throws cubridge::error (errc::io) naming the path.
unique_fd open_cache_directory(const std::filesystem::path& directory);

}  // namespace cubridge::compile_cache_internal
