#pragma once
// Ed25519 detached signatures with a domain-separation string: one implementation for bundles
// (bundle.cpp, which defines these over libsodium) and signed rollback requests
// (rollback_request.cpp). The lower-case hex the signed formats spell bytes in is detail/hex.hpp.

#include <cubridge/bundle/bundle.hpp>
#include <cubridge/core/detail/hex.hpp>  // to_hex and parse_lower_hex, which the signed formats use

#include <array>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace cubridge::detail {

/// What is wrong with `text` as the bytes of a signed JSON document, or an empty string: a NUL
/// byte anywhere (nlohmann's lexer ends the input at a NUL, so bytes after one would be signed
/// but never parsed) or invalid UTF-8 (overlong forms, surrogates, beyond U+10FFFF, truncated
/// sequences), each named with its byte offset. Run before the JSON parser sees `text`.
[[nodiscard]] std::string check_signed_text(std::string_view text);

/// Lower-case hex SHA-256 of `bytes` (64 characters): what names a bundle in the fleet's
/// desired state.
[[nodiscard]] std::string sha256_hex(std::span<const std::byte> bytes);

/// Fills `out` with cryptographically random bytes.
void random_bytes(std::span<std::byte> out);

/// The Ed25519 signature by `key` of `domain` followed by `message`.
[[nodiscard]] std::array<std::byte, 64> sign_detached(std::string_view domain,
                                                      std::string_view message,
                                                      const secret_key& key);

/// Whether `signature` is `key`'s signature of `domain` followed by `message`.
[[nodiscard]] bool verify_detached(std::string_view domain, std::string_view message,
                                   std::span<const std::byte, 64> signature, const public_key& key);

}  // namespace cubridge::detail
