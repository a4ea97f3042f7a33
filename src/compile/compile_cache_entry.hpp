#pragma once
// The compile cache's entry format (compile_cache_entry.cpp): a header (magic, format version 2,
// a reserved word, payload length, the key, the keyed tag over all of these and the payload),
// then the payload (cubin, lowered names, log), all little-endian. Internal to
// cubridge_compile; not installed.

#include <cubridge/compile/compile.hpp>

#include "compile_cache_key.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cubridge::compile_cache_internal {

// magic, version, reserved, payload length, key, tag
constexpr std::size_t entry_header_bytes = 8 + 4 + 4 + 8 + hash_bytes + hash_bytes;
// An entry larger than this is not read (a corrupt length, or not ours).
constexpr std::uint64_t max_entry_bytes = std::uint64_t{1} << 31;

/// The whole entry file of `image` under `key`, tagged with `secret`.
std::vector<unsigned char> encode_entry(const mac_key& secret, const hash_value& key,
                                        const compiled_image& image);

/// Decodes a whole entry file into `out`; false if anything is off (a short or damaged file,
/// another format, key or secret). The tag is checked before any of the payload is decoded.
bool decode_entry(const std::vector<unsigned char>& bytes, const mac_key& secret,
                  const hash_value& key, compiled_image& out);

}  // namespace cubridge::compile_cache_internal
