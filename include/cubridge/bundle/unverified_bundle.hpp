#pragma once
// A bundle read for looking at, not for loading: its container and manifest parsed as
// verify_bundle parses them, its signature, expiry and payload hash NOT checked. For tools that
// show what a file says it is (`cubridge inspect`) and for clients that need the name and version
// before a receiver verifies (`cubridge push`). Nothing read here may decide what runs: only
// verify_bundle's result may.

#include <cubridge/bundle/bundle.hpp>

#include <cstddef>
#include <span>
#include <vector>

namespace cubridge {

/// What a bundle says of itself; nothing of it is vouched for.
struct unverified_bundle {
  /// The manifest as read strictly (schema of docs/bundle-format.md), not its signature: its
  /// key_id names the key that claims to have signed it.
  bundle_manifest manifest{};
  /// The payload bytes as stored; not compared with the manifest's size or SHA-256.
  std::vector<std::byte> payload{};
};

/// True when `bytes` start with the bundle magic "CUBRIDGEB": how a bundle is told from an image
/// whatever its file is called. Says nothing of the rest.
[[nodiscard]] bool has_bundle_magic(std::span<const std::byte> bytes) noexcept;

/// Reads a bundle without verifying it: steps 1 to 4 of verify_bundle (total size and manifest
/// size within `limits`, magic, format version, lengths, manifest JSON and schema), none after.
/// Throws cubridge::bundle_error (too_large, bad_magic, unsupported_version, malformed,
/// malformed_manifest, invalid_manifest) as verify_bundle would for the same bytes (the
/// container's refusals with call "read_bundle_unverified"); nothing else for any input.
[[nodiscard]] unverified_bundle read_bundle_unverified(std::span<const std::byte> bytes,
                                                       const verify_limits& limits = {});

}  // namespace cubridge
