#pragma once
// The compile cache's include scan (compile_cache_includes.cpp): the files on disk a compile may
// read, so that its key covers them. Internal to cubridge_compile; not installed.

#include <cubridge/compile/compile.hpp>

#include <map>
#include <string>

namespace cubridge::compile_cache_internal {

/// Every file on disk that the source, its in-memory headers and the files they include may
/// read: absolute path -> content. compile_cache.hpp says what it looks at and its limits.
/// Throws cubridge::error (errc::io) naming the path when a file found cannot be read.
std::map<std::string, std::string> scan_includes(const cuda_source& source,
                                                 const compile_options& options);

}  // namespace cubridge::compile_cache_internal
