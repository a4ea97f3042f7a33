#pragma once
// The compile cache's on-disk store (compile_cache_store.cpp): the names the cache owns, whole
// reads and writes, verified reads of entries, atomic stores, and cleanup with eviction down to
// the size limit. Everything is relative to the descriptor of the checked directory
// (docs/compile-cache.md, "On read", "On write", "On cleanup and eviction"). Internal to
// cubridge_compile; not installed.

#include <cubridge/compile/compile.hpp>

#include "compile_cache_key.hpp"

#include <sys/stat.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace cubridge::compile_cache_internal {

/// "<key_hex>.entry": the name of the entry of a key (64 hex digits).
std::string entry_name(std::string_view key_hex);

/// A fresh temporary name of the cache's own pattern,
/// ".tmp-cubridge-<64 hex>-<pid>-<counter>-<16 hex>"; `tag_hex` is the key of the entry it will
/// become (64 hex digits).
std::string make_temp_name(std::string_view tag_hex);

/// Writes all `size` bytes (retrying on EINTR); false on an error.
bool write_all(int fd, const unsigned char* data, std::size_t size);
/// Reads exactly `size` bytes; false on a short read or an error.
bool read_all(int fd, unsigned char* data, std::size_t size);

/// hit: served. absent: no entry. corrupt: a file of ours that is not a valid entry for the key
/// (truncated, damaged, another key, another format or another secret). refused: not a file the
/// cache trusts itself to read (a link, a FIFO, another user's, writable by others).
enum class read_outcome { hit, absent, corrupt, refused };

/// Reads entry `name` in `directory_fd` into `out`, and on a hit sets its modification time to
/// now (eviction goes by it). Only a regular file of the user's that only they may write is
/// opened at all; nothing can block. `found` gets what was looked at, for the caller's decision
/// to remove it.
read_outcome read_entry(int directory_fd, const std::string& name, const mac_key& secret,
                        const hash_value& key, compiled_image& out, struct stat& found);

/// Writes `bytes`, the entry of `key_hex`, to a temporary file (O_EXCL, O_NOFOLLOW, mode 0600),
/// flushes it to disk and renames it into place, so the final name only ever holds a complete
/// entry. Whatever had the final name (a damaged entry, a link) is replaced, never written
/// through. False when any step fails.
bool store_entry(int directory_fd, const std::string& key_hex,
                 const std::vector<unsigned char>& bytes);

/// Removes `name` only while it is still the file `seen` (same device and inode): another
/// process of the user's may have renamed a good entry there since.
bool remove_if_same(int directory_fd, const std::string& name, const struct stat& seen);

/// Removes stale temporary files of the cache's naming, then evicts entries least recently used
/// first until they total at most `max_bytes`, counting each removed in `evicted`. Touches only
/// regular files of the user's with the cache's own names. Throws cubridge::error (errc::io)
/// naming `directory` when the directory cannot be listed.
void trim_directory(int directory_fd, const std::filesystem::path& directory,
                    std::uint64_t max_bytes, std::atomic<std::uint64_t>& evicted);

}  // namespace cubridge::compile_cache_internal
