#pragma once
// What `sign` and `push` share: turning a file into a signed bundle.
#include <cubridge/bundle.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace cubridge::tool {

/// What to sign a file as. An empty name means the file's stem; an empty target means the
/// cubin's own architecture (required for a fatbin or CUDA source).
struct signing_request {
  std::filesystem::path file;
  std::filesystem::path key;
  std::string name;
  std::uint64_t version = 0;
  std::string target;
};

/// Signs `request.file`: a .cu file as cuda_source, a cubin or fatbin (per inspect_image) as is.
/// Throws cubridge::error naming the file for anything else (PTX, unreadable, bad key).
[[nodiscard]] std::vector<std::byte> sign_file(const signing_request& request,
                                               bundle_manifest* manifest_out = nullptr);

/// The bytes of a file (cubridge::error, errc::io, naming it, when unreadable).
[[nodiscard]] std::vector<std::byte> read_bytes(const std::filesystem::path& file);

/// The manifest of a bundle, read without verifying it (the endpoint verifies).
/// Throws cubridge::bundle_error when the bytes are not a bundle.
[[nodiscard]] bundle_manifest peek_manifest(std::span<const std::byte> bundle);

}  // namespace cubridge::tool
