#pragma once
// Signed rollback requests: the body of `POST /v1/modules/{name}/rollback` (update_endpoint.hpp).
// A rollback changes what a service runs, so it is signed with the same Ed25519 keys as bundles.
// The format is specified in docs/update-endpoint.md:
//
//   {"action":"rollback","created":"2026-11-29T12:00:00Z","from_version":7,"key_id":"...",
//    "module":"filters","nonce":"<32 hex digits>"}\n          <- one line, signed as is
//   <128 hex digits of the Ed25519 signature>\n
//
// The request names the version it rolls back from (a captured request is useless once another
// version serves), carries a fresh random nonce and its creation time (the endpoint remembers
// nonces for as long as it accepts the time, so a request is honoured once).

#include <cubridge/bundle/bundle.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace cubridge {

/// A rollback request that passed verify_rollback_request.
struct rollback_request {
  std::string module{};
  /// The bundle version serving when the request was signed; the endpoint refuses the request
  /// when another version serves.
  std::uint64_t from_version = 0;
  /// 32 lower-case hex digits (16 random bytes).
  std::string nonce{};
  std::chrono::sys_seconds created{};
  cubridge::key_id key_id{};
};

/// Largest request body verify_rollback_request reads, in bytes.
inline constexpr std::size_t max_rollback_request_bytes = 4096;

/// Writes the signed body of a request to roll `module` back from `from_version`, with a fresh
/// nonce from the operating system's random source and `created` (default: now).
/// Throws cubridge::bundle_error (invalid_manifest) for a bad module name or from_version 0.
[[nodiscard]] std::string sign_rollback_request(
    std::string_view module, std::uint64_t from_version, const secret_key& key,
    std::optional<std::chrono::system_clock::time_point> created = std::nullopt);

/// Parses and verifies a request body. Throws cubridge::bundle_error naming the first check that
/// failed, with the reasons a bundle uses: too_large (over max_rollback_request_bytes),
/// malformed (not two lines, signature not 128 hex digits), malformed_manifest (line 1 not one
/// JSON object, duplicate keys), invalid_manifest (schema: fields, action, name, version,
/// nonce, time, key id), unknown_key, unsigned_bundle (all-zero signature), bad_signature.
/// Freshness, nonce reuse and from_version are the endpoint's checks.
[[nodiscard]] rollback_request verify_rollback_request(std::string_view body,
                                                       const trusted_keys& keys);

namespace detail {
/// Signs `request_line` as is (no validation): for tests that need requests a correct signer
/// would refuse to write. Returns the whole body.
[[nodiscard]] std::string sign_rollback_line_unchecked(std::string_view request_line,
                                                       const secret_key& key);
}  // namespace detail

}  // namespace cubridge
