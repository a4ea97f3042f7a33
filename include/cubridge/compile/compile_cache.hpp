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
//     --pre-include / -include, the toolkit's include directories when searched
//     (compile_options::search_toolkit_headers);
//   - the target architecture, the NVRTC version and the nvJitLink version, and the cache's
//     own format version.
// What the scan cannot see (limits): `#include MACRO` (a computed name), headers reached only
// through `__has_include`, or files NVRTC reads by other means; NVRTC's built-in headers and the
// toolkit's own (toolkit_include_paths(): not read; they change with the NVRTC version, which is
// in the key, as their directories are); environment variables. The scan does not evaluate
// `#if`, so it may hash files the compile does not read (a wasted miss at worst, never a wrong
// hit). Sources with computed includes should give their headers in memory.
// Each included file found is read only if it is a regular file of at most 256 MiB, opened
// without blocking: a bigger one, or one that turned into a FIFO or a device after the scan
// saw it, is an errc::io error naming the path ("read included file"), never a hang.
//
// Trust model (docs/compile-cache.md): the cache is private to one user. The directory must be
// owned by the effective user and not writable by group or others, and every directory above it
// owned by root or that user and not writable by others unless sticky (as /tmp is); open()
// checks this on descriptors it opens component by component without following links, creates
// what is missing with mode 0700, and refuses anything else. Every entry carries a BLAKE2b-256
// tag keyed with a 32-byte secret kept in the directory ("cubridge-mac.key", mode 0600, made on
// first use), so only a holder of the secret (the user, or root) can make an entry the cache
// accepts. Entries are read relative to the directory's descriptor, only if they are regular
// files of the user's that only they may write, with O_NOFOLLOW | O_NONBLOCK (a link is not
// followed, a FIFO never blocks); anything else is skipped (stats().refused) and compiled again.
//
// Entries are immutable files named by their key, "<64 hex digits>.entry", each a header
// (magic, format version 2, payload length, the key, the keyed tag over all of these and the
// payload) and the payload (cubin, lowered names, log). Writes go to a temporary file of the
// cache's own naming (".tmp-cubridge-<key>-<pid>-<counter>-<random>", O_EXCL | O_NOFOLLOW,
// mode 0600), which is fsync'ed and then renamed over the final name, so a crash never leaves a
// partial entry under a final name; reads check everything and drop an entry that is
// truncated, corrupt, not for its key or not tagged with this cache's secret (then compile
// again). Several processes of the user may share a directory: they only ever rename complete
// files into place, and a reader keeps the file it opened. Each hit sets the entry's
// modification time to now; after each store (and on open) entries are evicted least recently
// used first until the directory is under its size limit, and temporary files of the cache's
// naming left by crashed writers are removed once they are an hour old. Cleanup and eviction
// touch nothing else: only regular files of the user's with those two kinds of names.
//
// Thread safety: one compile_cache may be used from many threads at once; threads asking for a
// key that another thread of the same cache is compiling wait for that compile.

#include <cubridge/compile/compile.hpp>

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
  /// Entries of ours found truncated, corrupt, for another key, of another format or tagged
  /// with another secret, and deleted.
  std::uint64_t corrupt_dropped = 0;
  /// Entry names that were not a regular file of the user's writable only by them (a link, a
  /// FIFO, another user's file, a file others may write): not read, compiled again. Such a
  /// file is deleted only if it is a regular file of the user's.
  std::uint64_t refused = 0;
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

  /// Opens (creating it and its parents if needed, mode 0700) the cache in `directory`, which
  /// holds at most `max_bytes` of entries, checks who may write it (see above), reads or makes
  /// its secret key, and evicts down to that limit.
  /// Throws cubridge::error (errc::io) naming the directory when it cannot be created or is
  /// not a directory, and "refusing '<path>': found <owner, mode>; required: <what>" when the
  /// directory, a directory above it or the key file fails the checks; errc::precondition if
  /// max_bytes is 0; compile_error if NVRTC or nvJitLink cannot report its version (part of
  /// every key).
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
  /// file exists but cannot be read while building the key (see the scan's limits above).
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
  /// Where the secret key the entries are tagged with lives (directory() / "cubridge-mac.key").
  [[nodiscard]] std::filesystem::path key_path() const;
  /// The cache's directory, as given to open(); the cache itself uses the directory it
  /// checked on open, through a descriptor, even if this path is renamed or replaced later.
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
