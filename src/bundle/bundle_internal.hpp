#pragma once
// What the sources of cubridge_bundle share: bundle.cpp (the container, signing and verifying),
// bundle_manifest.cpp (the manifest's schema, its strict reader and its JSON) and bundle_keys.cpp
// (keys, key files and detached signatures). Internal to the library; not installed.

#include <cubridge/bundle/bundle.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <source_location>
#include <span>
#include <string>
#include <string_view>

namespace cubridge::bundle_internal {

/// Throws bundle_error(reason, call, involved) from `where`.
[[noreturn]] void refuse(bundle_reason reason, std::string call, std::string involved,
                         std::source_location where = std::source_location::current());

inline const unsigned char* as_uchar(const std::byte* p) {
  return reinterpret_cast<const unsigned char*>(p);
}
inline unsigned char* as_uchar(std::byte* p) {
  return reinterpret_cast<unsigned char*>(p);
}

/// Lower-case hex SHA-256 of `payload` (the manifest's payload_sha256).
[[nodiscard]] std::string sha256_hex(std::span<const std::byte> payload);

/// The container's constants (docs/bundle-format.md, "Layout").
inline constexpr std::string_view bundle_magic = "CUBRIDGEB";
inline constexpr std::size_t signature_bytes = 64;

/// A bundle's parts, found by its lengths; spans into the bytes split_bundle was given.
struct bundle_parts {
  std::span<const std::byte> manifest;
  std::span<const std::byte> payload;
  std::span<const std::byte, signature_bytes> signature;
};

/// Steps 1 to 3 of verify_bundle: total size, magic and format version, lengths (each checked
/// against what remains, so no sum overflows). Throws bundle_error (too_large, bad_magic,
/// unsupported_version, malformed) with `call`.
[[nodiscard]] bundle_parts split_bundle(std::span<const std::byte> bytes,
                                        const verify_limits& limits, const char* call);

/// The manifest of a bundle, read strictly (one flat JSON object, the schema of
/// docs/bundle-format.md). Throws bundle_error (malformed_manifest, invalid_manifest).
[[nodiscard]] bundle_manifest read_manifest(std::string_view bytes);

}  // namespace cubridge::bundle_internal
