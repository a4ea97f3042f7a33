#pragma once
// What the compile cache's keys (compile_cache_key.cpp) offer the rest of it: the BLAKE2b-256
// key of a compile and of a link, and the per-cache secret the entries' tags are keyed with.
// Internal to cubridge_compile; not installed.

#include <cubridge/compile/compile.hpp>

#include <array>
#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

namespace cubridge::compile_cache_internal {

constexpr std::size_t hash_bytes = 32;  // BLAKE2b-256
// The secret the entries' tags are keyed with, 32 random bytes, mode 0600.
constexpr std::string_view mac_key_name = "cubridge-mac.key";
// crypto_generichash_KEYBYTES (checked in compile_cache_key.cpp, so <sodium.h> stays out here).
constexpr std::size_t mac_key_bytes = 32;

using hash_value = std::array<unsigned char, hash_bytes>;
using mac_key = std::array<unsigned char, mac_key_bytes>;

/// The library versions every key covers, as "major.minor".
struct toolkit_versions {
  std::string nvrtc;
  std::string nvjitlink;
};

/// nvrtc_version() and nvjitlink_version(), in that order. Throws compile_error as they do.
toolkit_versions current_toolkit_versions();

/// The key of nvrtc_compile(source, options): covers what compile_cache.hpp lists, the files
/// the include scan finds too. Throws cubridge::error (errc::io) when one cannot be read.
hash_value compile_key(const toolkit_versions& versions, const cuda_source& source,
                       const compile_options& options);

/// The key of ptx_to_cubin(ptx, options).
hash_value link_key(const toolkit_versions& versions, std::string_view ptx,
                    const ptx_link_options& options);

/// The secret in `directory_fd` (the checked cache `directory`), made on first use: written to
/// a temporary file (O_EXCL, mode 0600) and linked to its name, which fails if it exists, so two
/// processes starting together agree on one key and nobody reads a half-written one. A key that
/// is not a regular 32-byte file of the user's that only they can read or write is refused, not
/// replaced. Throws cubridge::error (errc::io) naming the key file.
mac_key load_or_create_mac_key(int directory_fd, const std::filesystem::path& directory);

}  // namespace cubridge::compile_cache_internal
