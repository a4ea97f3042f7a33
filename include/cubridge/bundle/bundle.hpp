#pragma once
// Signed module bundles: a manifest (module name, version, target GPU, payload hash) and a
// payload (cubin, fatbin or CUDA C++ source), signed with Ed25519. The format is specified in
// docs/bundle-format.md. This header only writes and verifies bundles; it neither loads nor
// swaps anything, and keeps no state (the "version must grow" replay check belongs to whoever
// holds the current version).
//
// verify_bundle is safe on untrusted input: it checks the total size before reading anything,
// bounds-checks every length, and raises cubridge::bundle_error with a bundle_error::reason
// naming the first check that failed.

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <cubridge/bundle/error.hpp>
#include <cubridge/core/compute_capability.hpp>
#include <cubridge/core/image.hpp>

namespace cubridge {

/// Why a bundle, a manifest or a key was refused. Listed in the order verify_bundle checks.
enum class bundle_reason {
  too_large,              ///< larger than verify_limits allow (checked before parsing anything)
  bad_magic,              ///< does not start with "CUBRIDGEB"
  unsupported_version,    ///< a format version this library does not read
  malformed,              ///< lengths inconsistent: truncated, trailing bytes, length overflow
  malformed_manifest,     ///< manifest is not one JSON object (syntax, UTF-8, duplicate keys)
  invalid_manifest,       ///< manifest breaks the schema: missing, extra or ill-typed field,
                          ///< bad name, version 0, bad target, kind, hash, time or key id
  unknown_key,            ///< the manifest's key id is not among the trusted keys
  unsigned_bundle,        ///< the signature is all zero bytes
  bad_signature,          ///< the signature does not verify with the trusted key
  expired,                ///< past its signed `expires`, `created` older than the receiver's
                          ///< max_age, or no `expires` where the receiver requires one
  payload_mismatch,       ///< payload size or SHA-256 differ from the manifest
  payload_kind_mismatch,  ///< payload is not what the manifest's kind says (per inspect_image)
  target_mismatch,        ///< the image has no code that runs on the manifest's target
  wrong_device,           ///< it does not run on the receiver's device (verify_limits::device)
  bad_key,                ///< a key in text form could not be parsed
};

/// "too_large", "bad_magic", ... (the enumerator's name).
[[nodiscard]] std::string_view to_string(bundle_reason reason) noexcept;

/// Raised for every refused bundle, manifest or key. code() is update_errc::bad_bundle; reason()
/// says precisely which check failed.
class bundle_error : public error {
 public:
  bundle_error(bundle_reason reason, std::string call, std::string involved,
               std::source_location where = std::source_location::current());
  [[nodiscard]] bundle_reason reason() const noexcept { return reason_; }

 private:
  bundle_reason reason_;
};

/// What a bundle's payload is.
enum class payload_kind {
  cubin,        ///< an ELF of SASS for one architecture
  fatbin,       ///< a fat binary (as written by nvcc -fatbin)
  cuda_source,  ///< CUDA C++ source text, compiled by the receiver
};

/// "cubin", "fatbin" or "cuda_source".
[[nodiscard]] std::string_view to_string(payload_kind kind) noexcept;

/// Checks a module name against the manifest's rule (1 to 128 bytes, no '/', '\\', "..",
/// control characters, not "."). Returns what is wrong, or an empty string for a valid name.
[[nodiscard]] std::string check_module_name(std::string_view name);

/// The first 8 bytes of BLAKE2b-256 of a public key; names the key in a manifest.
using key_id = std::array<std::byte, 8>;

/// Lower-case hex of a key id (16 characters).
[[nodiscard]] std::string to_hex(const key_id& id);

/// An Ed25519 public key (32 bytes).
struct public_key {
  std::array<std::byte, 32> bytes{};
  /// The key's id (see key_id).
  [[nodiscard]] cubridge::key_id id() const;
  friend bool operator==(const public_key&, const public_key&) = default;
};

/// An Ed25519 secret key, held as its 32-byte seed; wiped on destruction. Move-only.
class secret_key {
 public:
  /// Adopts a 32-byte seed (as from a key file).
  explicit secret_key(std::span<const std::byte, 32> seed) noexcept;
  secret_key(secret_key&& other) noexcept;
  secret_key& operator=(secret_key&& other) noexcept;
  secret_key(const secret_key&) = delete;
  secret_key& operator=(const secret_key&) = delete;
  ~secret_key();

  /// The seed, for serialisation only.
  [[nodiscard]] std::span<const std::byte, 32> seed() const noexcept { return seed_; }
  /// The public key that belongs to this secret key.
  [[nodiscard]] cubridge::public_key public_key() const;

 private:
  std::array<std::byte, 32> seed_{};
};

/// A fresh key pair.
struct keypair {
  cubridge::public_key public_key;
  cubridge::secret_key secret_key;
};

/// Generates a key pair from the operating system's random source (libsodium).
/// Throws cubridge::error (errc::precondition) if libsodium cannot initialise.
[[nodiscard]] keypair generate_keypair();

/// Key text forms (one line each, see docs/bundle-format.md):
///   "cubridge-ed25519-public <64 hex digits of the key>\n"
///   "cubridge-ed25519-secret <64 hex digits of the seed>\n"
[[nodiscard]] std::string to_text(const public_key& key);
[[nodiscard]] std::string to_text(const secret_key& key);
/// Parse the text forms above (one trailing newline allowed; hex digits in either case).
/// Throw cubridge::bundle_error (bundle_reason::bad_key) for anything else.
[[nodiscard]] public_key public_key_from_text(std::string_view text);
[[nodiscard]] secret_key secret_key_from_text(std::string_view text);

/// Write a key's text form to `path`; the secret key file is created with mode 0600.
/// Throw cubridge::error (errc::io) when the file cannot be written.
void write_key_file(const std::filesystem::path& path, const public_key& key);
void write_key_file(const std::filesystem::path& path, const secret_key& key);
/// Read a key file written by write_key_file. Throw cubridge::error (errc::io) when it cannot
/// be read (or is over 4 KiB), cubridge::bundle_error (bad_key) when it does not parse.
[[nodiscard]] public_key read_public_key_file(const std::filesystem::path& path);
[[nodiscard]] secret_key read_secret_key_file(const std::filesystem::path& path);

/// The public keys a verifier trusts.
class trusted_keys {
 public:
  trusted_keys() = default;
  trusted_keys(std::initializer_list<public_key> keys);
  /// Adds a key (a key already present is not added twice).
  void add(const public_key& key);
  /// The trusted key with this id, or nullptr.
  [[nodiscard]] const public_key* find(const key_id& id) const noexcept;
  [[nodiscard]] std::size_t size() const noexcept { return keys_.size(); }

 private:
  std::vector<public_key> keys_;
};

/// What the signer states about a payload; sign_bundle adds the hash, size and key id.
struct bundle_manifest_input {
  /// Module name: 1 to 128 bytes of UTF-8, no '/', '\\', "..", control characters, not ".".
  std::string name{};
  /// Module version, > 0; a receiver accepts only versions above its current one.
  std::uint64_t version = 0;
  /// Target GPU architecture: "sm_" and 2 or 3 digits, optionally "a" or "f" ("sm_90"), as
  /// parse_compute_capability reads it (to_string of a compute_capability writes it).
  std::string target{};
  payload_kind kind = payload_kind::cubin;
  /// Creation time; the current time when not given. Whole seconds (sub-seconds are cut).
  std::optional<std::chrono::system_clock::time_point> created{};
  /// Optional expiry: verify_bundle refuses the bundle from this time on. Whole seconds
  /// (sub-seconds are cut); must be after `created`. None: the bundle never expires.
  std::optional<std::chrono::system_clock::time_point> expires{};
};

/// A manifest as read from a verified bundle.
struct bundle_manifest {
  std::string name{};
  std::uint64_t version = 0;
  /// The target as signed ("sm_90a"): the wire form, kept as it was.
  std::string target{};
  /// The target as parse_compute_capability reads it ({9, 0, arch_specific} for "sm_90a").
  compute_capability target_capability{};
  payload_kind kind = payload_kind::cubin;
  /// Lower-case hex SHA-256 of the payload (64 characters).
  std::string payload_sha256{};
  std::uint64_t payload_size = 0;
  /// RFC 3339 UTC, "YYYY-MM-DDTHH:MM:SSZ".
  std::string created{};
  std::chrono::sys_seconds created_time{};
  /// The signed expiry, same form as `created`; empty (and expires_time nullopt) when none.
  std::string expires{};
  std::optional<std::chrono::sys_seconds> expires_time{};
  cubridge::key_id key_id{};
};

/// Limits that verify_bundle enforces before it trusts anything.
struct verify_limits {
  /// Largest whole bundle accepted, in bytes.
  std::size_t max_bundle_bytes = std::size_t{64} << 20;
  /// Largest manifest accepted, in bytes.
  std::size_t max_manifest_bytes = std::size_t{16} << 10;
  /// The time expiry is checked against; nullopt: the system clock (an override is for tests
  /// and for receivers with a clock of their own).
  std::optional<std::chrono::system_clock::time_point> now{};
  /// Refuse (bundle_reason::expired) bundles without an `expires` field.
  bool require_expiry = false;
  /// Refuse (bundle_reason::expired) bundles whose `created` is more than this before `now`.
  std::optional<std::chrono::seconds> max_age{};
  /// The compute capability of the device that will load the payload ({9, 0} for an H200), so
  /// that "does this image run here?" is answered once, here: a cubin or fatbin must have code
  /// that runs on it (can_run_on), CUDA source (compiled by the receiver for exactly this
  /// device) must target its numbers; else bundle_reason::wrong_device. The image_info
  /// returned records it (image_info::checked_for), so loading it does not decide it again.
  /// nullopt: only the signed target is checked.
  std::optional<compute_capability> device{};
};

/// A bundle that passed every check of verify_bundle.
struct verified_bundle {
  bundle_manifest manifest{};
  std::vector<std::byte> payload{};
  /// What inspect_image found in the payload while verifying it (kind, targets, kernels and
  /// their parameters), for the receiver to use rather than parse the payload again; nullopt
  /// for cuda_source (text, compiled by the receiver).
  std::optional<image_info> image{};
  /// The module version (for the receiver's replay check: accept only versions above current).
  [[nodiscard]] std::uint64_t version() const noexcept { return manifest.version; }
};

/// Builds and signs a bundle of `payload` described by `input` with `key`; computes the payload's
/// SHA-256, size and the key id itself. Does not inspect the payload (verify_bundle does).
/// Throws cubridge::bundle_error (invalid_manifest) when `input` breaks the schema (including an
/// `expires` not after `created`).
[[nodiscard]] std::vector<std::byte> sign_bundle(const bundle_manifest_input& input,
                                                 std::span<const std::byte> payload,
                                                 const secret_key& key);

/// Verifies a bundle and returns its manifest, payload and (cubin, fatbin) the payload's
/// image_info. Checks, in this order, each failure
/// with its own bundle_reason: total size, magic, format version, lengths, manifest JSON and
/// schema (a NUL byte or invalid UTF-8 anywhere in the manifest: malformed_manifest), key id
/// trusted, signature (all-zero: unsigned_bundle), expiry against `limits.now` (expired: now at
/// or past `expires`, older than `max_age`, none where required), payload size and SHA-256,
/// payload kind (inspect_image for cubin and fatbin; no NUL bytes for cuda_source), target
/// (the image must run on the manifest's target, see can_run_on) and, with `limits.device`,
/// the receiver's device (wrong_device; the returned image's checked_for is that device).
/// Throws cubridge::bundle_error; nothing else for any input.
[[nodiscard]] verified_bundle verify_bundle(std::span<const std::byte> bytes,
                                            const trusted_keys& keys,
                                            const verify_limits& limits = {});

namespace detail {
/// Assembles and signs a bundle around `manifest_json` as is, without validating it. For tests
/// and fuzz seeds that need bundles a correct signer would refuse to write.
[[nodiscard]] std::vector<std::byte> sign_bundle_unchecked(std::string_view manifest_json,
                                                           std::span<const std::byte> payload,
                                                           const secret_key& key);
/// The manifest JSON that sign_bundle would write (same validation and errors).
[[nodiscard]] std::string manifest_json(const bundle_manifest_input& input,
                                        std::span<const std::byte> payload,
                                        const public_key& signer);
/// The manifest's time form, "YYYY-MM-DDTHH:MM:SSZ" (RFC 3339 UTC, whole seconds), and its
/// strict parser (nullopt for anything else). Shared with signed rollback requests.
[[nodiscard]] std::string format_time(std::chrono::sys_seconds time);
[[nodiscard]] std::optional<std::chrono::sys_seconds> parse_time(std::string_view text);
}  // namespace detail

}  // namespace cubridge
