// Reading a bundle without verifying it (unverified_bundle.hpp): verify_bundle's first four
// steps, shared with it (bundle_internal.hpp), so both read the same bytes the same way.
#include <cubridge/bundle/unverified_bundle.hpp>

#include "bundle_internal.hpp"

#include <cstring>
#include <string_view>

namespace cubridge {

bool has_bundle_magic(std::span<const std::byte> bytes) noexcept {
  using bundle_internal::bundle_magic;
  return bytes.size() >= bundle_magic.size() &&
         std::memcmp(bytes.data(), bundle_magic.data(), bundle_magic.size()) == 0;
}

unverified_bundle read_bundle_unverified(std::span<const std::byte> bytes,
                                         const verify_limits& limits) {
  const auto parts = bundle_internal::split_bundle(bytes, limits, "read_bundle_unverified");
  const std::string_view manifest_text(reinterpret_cast<const char*>(parts.manifest.data()),
                                       parts.manifest.size());
  return unverified_bundle{bundle_internal::read_manifest(manifest_text),
                           std::vector<std::byte>(parts.payload.begin(), parts.payload.end())};
}

}  // namespace cubridge
