#pragma once
// What `sign` and `push` share: reading keys and payloads, and turning a payload into a signed
// bundle.
#include <cubridge/bundle/bundle.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <sys/types.h>

namespace cubridge::tool {

/// The largest payload or bundle file read: the default verify_limits::max_bundle_bytes, the most
/// an endpoint accepts unless configured otherwise.
inline constexpr std::uint64_t max_input_bytes = std::uint64_t{64} << 20;

/// What to sign a payload as. An empty name means the file's stem; an empty target means the
/// cubin's own architecture (required for a fatbin or CUDA source).
struct signing_request {
  std::filesystem::path file;  ///< where the payload came from: its stem, and the name in errors
  std::filesystem::path key;
  std::string name;
  std::uint64_t version = 0;
  std::string target;
  std::optional<std::chrono::system_clock::time_point> expires;
  /// Sign with a key file that group or others may read (else refused).
  bool allow_readable_key = false;
};

/// Which file a name reached (st_dev and st_ino of the open descriptor), to tell that two names,
/// through symlinks or hard links, are one file.
struct file_identity {
  dev_t device = 0;
  ino_t inode = 0;
  friend bool operator==(const file_identity&, const file_identity&) = default;
};

/// A regular file read whole, at most `max_bytes`, and which file it was. Throws cubridge::error
/// (errc::io) naming the path when it is missing, not a regular file (a FIFO, a device...) or
/// too large: nothing blocks and nothing huge is read.
struct input_file {
  std::vector<std::byte> bytes;
  file_identity identity;
};
[[nodiscard]] input_file read_input(const std::filesystem::path& path, std::uint64_t max_bytes,
                                    std::string_view what);

/// The secret key in a key file, which must be a regular file of at most 4 KiB. A key file that
/// group or others may read or write (mode & 077) is refused with cubridge::error
/// (errc::precondition) naming its mode, unless `allow_readable`: then a warning goes to stderr.
/// Throws cubridge::bundle_error (bad_key) when it does not parse.
struct signing_key {
  secret_key key;
  file_identity identity;
};
[[nodiscard]] signing_key read_signing_key(const std::filesystem::path& path, bool allow_readable);

/// Signs `payload` (the contents of request.file, or code compiled from it) with `key`: as
/// cuda_source when `cuda_source`, else as the cubin or fatbin inspect_image says it is.
/// Throws cubridge::error naming request.file for anything else (PTX, no target).
/// `manifest_out` gets the manifest as a receiver trusting `key` reads it.
[[nodiscard]] std::vector<std::byte> sign_payload(const signing_request& request,
                                                  std::span<const std::byte> payload,
                                                  bool cuda_source, const secret_key& key,
                                                  bundle_manifest* manifest_out = nullptr);

}  // namespace cubridge::tool
