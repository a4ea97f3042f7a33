#pragma once
// An on-disk cache of compiled machine code, in front of nvrtc_compile and ptx_to_cubin
// (compile.hpp), so a process compiles a kernel once per machine rather than once per start.
//
// The key is a BLAKE2b-256 hash (libsodium) of a canonical serialisation of everything that
// changes the output:
//   - the source text and its name (the name appears in line info and __FILE__);
//   - every in-memory header, name and content;
//   - every file on disk the source may include: the `#include "..."` / `<...>` directives of
//     the source, the in-memory headers and each file found are scanned recursively; each
//     spelled name is looked for where NVRTC looks (the directory of the including file, then
//     the include paths, in order, including -I / --include-path given in extra_options), and
//     EVERY file found there is hashed (path and content), not only the first; names found
//     nowhere are hashed too, so a header that appears later changes the key;
//   - the include paths in order, the defines (sorted by name: they are distinct), the name
//     expressions (sorted and deduplicated: they only ask for instantiations), the extra
//     options in their given order (later ones may override earlier ones), files given with
//     --pre-include / -include;
//   - the target architecture, the NVRTC version and the nvJitLink version, and the cache's
//     own format version.
// What the scan cannot see (limits): `#include MACRO` (a computed name), headers reached only
// through `__has_include`, or files NVRTC reads by other means; NVRTC's built-in headers (they
// change with the NVRTC version, which is in the key); environment variables. The scan does
// not evaluate `#if`, so it may hash files the compile does not read (a wasted miss at worst,
// never a wrong hit). Sources with computed includes should give their headers in memory.
//
// Entries are immutable files named by their key, "<64 hex digits>.entry", each a header
// (magic, format version, payload length, the key, a BLAKE2b-256 hash of the payload) and the
// payload (cubin, lowered names, log). Writes go to a temporary file in the same directory,
// which is fsync'ed and then renamed over the final name, so a crash never leaves a partial
// entry under a final name; reads check everything and drop an entry that is truncated,
// corrupt or not for its key (then compile again). Several processes may share a directory:
// they only ever rename complete files into place, and a reader keeps the file it opened.
// Each hit sets the entry's modification time to now; after each store (and on open) entries
// are evicted least recently used first until the directory is under its size limit, and
// temporary files left by crashed writers are removed once they are an hour old.
//
// Thread safety: one compile_cache may be used from many threads at once; threads asking for a
// key that another thread of the same cache is compiling wait for that compile.

#include <cubridge/compile.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

namespace cubridge {

/// Counters of one compile_cache object since it was opened.
struct compile_cache_stats {
  /// Results served without compiling: from disk, or from another thread's compile.
  std::uint64_t hits = 0;
  /// Compiles done because no valid entry was there.
  std::uint64_t misses = 0;
  /// Entries found truncated, corrupt or for another key, and deleted.
  std::uint64_t corrupt_dropped = 0;
  /// Entries deleted to keep the directory under its size limit.
  std::uint64_t evicted = 0;
  /// Compiled results that could not be written (disk full, read-only directory); the
  /// compile's result was still returned.
  std::uint64_t store_failures = 0;
};

/// An on-disk cache of cubins. Move-only; a moved-from cache may only be destroyed or assigned.
class compile_cache {
 public:
  /// The default size limit: 1 GiB.
  static constexpr std::uint64_t default_max_bytes = std::uint64_t{1} << 30;

  /// $CUBRIDGE_CACHE_DIR if set and not empty, else $XDG_CACHE_HOME/cubridge if that is an
  /// absolute path, else $HOME/.cache/cubridge.
  /// Throws cubridge::error (errc::io) when none of these variables is set.
  [[nodiscard]] static std::filesystem::path default_directory();

  /// Opens (creating it and its parents if needed) the cache in `directory`, which holds at
  /// most `max_bytes` of entries, and evicts down to that limit.
  /// Throws cubridge::error (errc::io) naming the directory when it cannot be created or is
  /// not a directory; errc::precondition if max_bytes is 0; compile_error if NVRTC or nvJitLink
  /// cannot report its version (part of every key).
  [[nodiscard]] static compile_cache open(const std::filesystem::path& directory,
                                          std::uint64_t max_bytes = default_max_bytes);

  /// open(default_directory(), max_bytes). Throws as both.
  [[nodiscard]] static compile_cache open_default(std::uint64_t max_bytes = default_max_bytes);

  compile_cache(compile_cache&&) noexcept;
  compile_cache& operator=(compile_cache&&) noexcept;
  ~compile_cache();

  /// The cached result of nvrtc_compile(source, options), compiling and storing it on a miss.
  /// A failure to store is counted (stats().store_failures), not thrown.
  /// Throws as nvrtc_compile for the compile, and cubridge::error (errc::io) when an included
  /// file exists but cannot be read while building the key.
  [[nodiscard]] compiled_image get_or_compile(const cuda_source& source,
                                              const compile_options& options = {});

  /// The cached result of ptx_to_cubin(ptx, options), linking and storing it on a miss.
  /// Throws as ptx_to_cubin.
  [[nodiscard]] compiled_image get_or_link(std::string_view ptx,
                                           const ptx_link_options& options = {});

  /// The key (64 lowercase hex digits) get_or_compile would use now: it reads the included
  /// files. Throws cubridge::error (errc::io) when an included file cannot be read.
  [[nodiscard]] std::string key_for(const cuda_source& source,
                                    const compile_options& options) const;
  /// The key get_or_link would use.
  [[nodiscard]] std::string key_for(std::string_view ptx, const ptx_link_options& options) const;

  /// Where the entry of `key` lives (whether or not it exists).
  [[nodiscard]] std::filesystem::path entry_path(std::string_view key) const;
  /// The cache's directory.
  [[nodiscard]] const std::filesystem::path& directory() const noexcept;
  /// The size limit in bytes.
  [[nodiscard]] std::uint64_t max_bytes() const noexcept;
  /// The counters so far.
  [[nodiscard]] compile_cache_stats stats() const noexcept;

  /// Evicts least recently used entries until the directory is under max_bytes(), and removes
  /// stale temporary files. Never throws for files that vanish meanwhile; throws cubridge::error
  /// (errc::io) only when the directory itself cannot be listed.
  void trim();

 private:
  struct state;
  explicit compile_cache(std::unique_ptr<state> s) noexcept;
  std::unique_ptr<state> state_;
};

}  // namespace cubridge
