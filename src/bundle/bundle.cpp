// Signed module bundles (docs/bundle-format.md): the container, signing and verifying. The
// manifest's schema and JSON are bundle_manifest.cpp; keys and signatures bundle_keys.cpp.
#include <cubridge/bundle/bundle.hpp>
#include <cubridge/bundle/detail/signing.hpp>
#include <cubridge/core/detail/enum_names.hpp>
#include <cubridge/core/detail/hex.hpp>
#include <cubridge/core/detail/printable.hpp>
#include <cubridge/core/image.hpp>

#include "bundle_internal.hpp"
#include "detail/ensure_sodium.hpp"

#include <openssl/sha.h>
#include <sodium.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

namespace cubridge {
namespace bundle_internal {

[[noreturn]] void refuse(bundle_reason reason, std::string call, std::string involved,
                         std::source_location where) {
  throw bundle_error(reason, std::move(call), std::move(involved), where);
}

// OpenSSL's SHA-256, not libsodium's: it uses the CPU's SHA extensions (1.8 GB/s against 0.23 on
// the development machine's EPYC), and every node of a fleet hashes each bundle it fetches.
std::string sha256_hex(std::span<const std::byte> payload) {
  std::array<std::byte, SHA256_DIGEST_LENGTH> digest{};
  SHA256(as_uchar(payload.data()), payload.size(), as_uchar(digest.data()));
  return detail::to_hex(digest);
}

}  // namespace bundle_internal

std::string detail::sha256_hex(std::span<const std::byte> bytes) {
  return bundle_internal::sha256_hex(bytes);
}

namespace {

using namespace bundle_internal;
using detail::ensure_sodium;

constexpr std::string_view magic = bundle_magic;
constexpr std::uint8_t format_version = 1;
constexpr std::string_view signature_domain = "cubridge bundle v1";
constexpr std::size_t header_bytes = 9 + 1;  // magic, format version

static_assert(crypto_sign_BYTES == signature_bytes);

constexpr std::array<detail::enum_name<bundle_reason>, 15> bundle_reason_names{{
    {bundle_reason::too_large, "too_large"},
    {bundle_reason::bad_magic, "bad_magic"},
    {bundle_reason::unsupported_version, "unsupported_version"},
    {bundle_reason::malformed, "malformed"},
    {bundle_reason::malformed_manifest, "malformed_manifest"},
    {bundle_reason::invalid_manifest, "invalid_manifest"},
    {bundle_reason::unknown_key, "unknown_key"},
    {bundle_reason::unsigned_bundle, "unsigned_bundle"},
    {bundle_reason::bad_signature, "bad_signature"},
    {bundle_reason::expired, "expired"},
    {bundle_reason::payload_mismatch, "payload_mismatch"},
    {bundle_reason::payload_kind_mismatch, "payload_kind_mismatch"},
    {bundle_reason::target_mismatch, "target_mismatch"},
    {bundle_reason::wrong_device, "wrong_device"},
    {bundle_reason::bad_key, "bad_key"},
}};
static_assert(detail::lists_values_in_order(bundle_reason_names));

std::uint64_t read_le(std::span<const std::byte> bytes) {
  std::uint64_t v = 0;
  for (std::size_t i = bytes.size(); i-- > 0;)
    v = (v << 8) | std::to_integer<std::uint64_t>(bytes[i]);
  return v;
}

void append_le(std::vector<std::byte>& out, std::uint64_t v, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xFF));
}

}  // namespace

std::string_view to_string(bundle_reason reason) noexcept {
  return detail::name_of(bundle_reason_names, reason, "unknown");
}

bundle_error::bundle_error(bundle_reason reason, std::string call, std::string involved,
                           std::source_location where)
    : error(update_error_domain, static_cast<int>(update_errc::bad_bundle),
            "bundle refused, " + std::string(to_string(reason)), std::move(call),
            std::move(involved), where),
      reason_(reason) {}

namespace detail {

std::vector<std::byte> sign_bundle_unchecked(std::string_view manifest,
                                             std::span<const std::byte> payload,
                                             const secret_key& key) {
  ensure_sodium();
  CUBRIDGE_EXPECTS(manifest.size() <= std::numeric_limits<std::uint32_t>::max(),
                   "manifest over 4 GiB");
  std::vector<std::byte> out;
  out.reserve(header_bytes + 4 + manifest.size() + 8 + payload.size() + signature_bytes);
  for (char c : magic) out.push_back(static_cast<std::byte>(c));
  out.push_back(static_cast<std::byte>(format_version));
  append_le(out, manifest.size(), 4);
  for (char c : manifest) out.push_back(static_cast<std::byte>(c));
  append_le(out, payload.size(), 8);
  out.insert(out.end(), payload.begin(), payload.end());

  const auto signature = sign_detached(signature_domain, manifest, key);
  out.insert(out.end(), signature.begin(), signature.end());
  return out;
}

}  // namespace detail

std::vector<std::byte> sign_bundle(const bundle_manifest_input& input,
                                   std::span<const std::byte> payload, const secret_key& key) {
  return detail::sign_bundle_unchecked(detail::manifest_json(input, payload, key.public_key()),
                                       payload, key);
}

// --- verifying --------------------------------------------------------------------------------

namespace {

constexpr const char* verify_call = "verify_bundle";

}  // namespace

// Steps 1 to 3: size, magic and format version, lengths. Also read_bundle_unverified's.
bundle_internal::bundle_parts bundle_internal::split_bundle(std::span<const std::byte> bytes,
                                                            const verify_limits& limits,
                                                            const char* call) {
  // 1. Size, before reading a single byte.
  if (bytes.size() > limits.max_bundle_bytes)
    refuse(
        bundle_reason::too_large, call,
        std::to_string(bytes.size()) + " bytes, limit " + std::to_string(limits.max_bundle_bytes));
  // 2. Magic and format version.
  if (bytes.size() < magic.size() || std::memcmp(bytes.data(), magic.data(), magic.size()) != 0)
    refuse(bundle_reason::bad_magic, call, "does not start with \"CUBRIDGEB\"");
  if (bytes.size() < header_bytes)
    refuse(bundle_reason::malformed, call, "truncated before the format version");
  if (std::to_integer<std::uint8_t>(bytes[magic.size()]) != format_version)
    refuse(bundle_reason::unsupported_version, call,
           "format version " + std::to_string(std::to_integer<unsigned>(bytes[magic.size()])) +
               ", expected 1");
  // 3. Lengths: each compared with what remains, so no sum can overflow.
  auto rest = bytes.subspan(header_bytes);
  if (rest.size() < 4) refuse(bundle_reason::malformed, call, "truncated in the manifest length");
  const std::uint64_t manifest_size = read_le(rest.first(4));
  rest = rest.subspan(4);
  if (manifest_size > limits.max_manifest_bytes)
    refuse(bundle_reason::too_large, call,
           "manifest of " + std::to_string(manifest_size) + " bytes, limit " +
               std::to_string(limits.max_manifest_bytes));
  if (manifest_size > rest.size())
    refuse(bundle_reason::malformed, call, "truncated in the manifest");
  const auto manifest_bytes = rest.first(static_cast<std::size_t>(manifest_size));
  rest = rest.subspan(manifest_bytes.size());
  if (rest.size() < 8) refuse(bundle_reason::malformed, call, "truncated in the payload length");
  const std::uint64_t payload_size = read_le(rest.first(8));
  rest = rest.subspan(8);
  if (payload_size > rest.size())
    refuse(bundle_reason::malformed, call, "truncated in the payload");
  const auto payload = rest.first(static_cast<std::size_t>(payload_size));
  rest = rest.subspan(payload.size());
  if (rest.size() < signature_bytes)
    refuse(bundle_reason::malformed, call, "truncated in the signature");
  if (rest.size() > signature_bytes)
    refuse(bundle_reason::malformed, call,
           std::to_string(rest.size() - signature_bytes) + " bytes after the signature");
  return {manifest_bytes, payload, rest.first<signature_bytes>()};
}

namespace {

// Steps 5 and 6: the key id trusted, the signature.
void check_signature(const bundle_manifest& manifest, std::string_view manifest_text,
                     std::span<const std::byte, signature_bytes> signature,
                     const trusted_keys& keys, const std::string& who) {
  constexpr const char* call = verify_call;
  const public_key* key = keys.find(manifest.key_id);
  if (!key)
    refuse(bundle_reason::unknown_key, call,
           who + ": key " + to_hex(manifest.key_id) + " is not trusted");
  if (std::all_of(signature.begin(), signature.end(),
                  [](std::byte b) { return b == std::byte{0}; }))
    refuse(bundle_reason::unsigned_bundle, call, who + ": signature is all zero");
  if (!detail::verify_detached(signature_domain, manifest_text, signature, *key))
    refuse(bundle_reason::bad_signature, call,
           who + ": signature does not verify with key " + to_hex(manifest.key_id));
}

// Step 7: expiry, against the receiver's clock: only once the signature vouches for the times.
void check_expiry(const bundle_manifest& manifest, const verify_limits& limits,
                  const std::string& who) {
  constexpr const char* call = verify_call;
  const auto now = std::chrono::floor<std::chrono::seconds>(
      limits.now.value_or(std::chrono::system_clock::now()));
  if (manifest.expires_time && now >= *manifest.expires_time)
    refuse(bundle_reason::expired, call,
           who + ": expired at " + manifest.expires + ", it is " + detail::format_time(now));
  if (!manifest.expires_time && limits.require_expiry)
    refuse(bundle_reason::expired, call,
           who + ": has no expires field and this receiver requires one");
  if (limits.max_age && now - manifest.created_time > *limits.max_age)
    refuse(bundle_reason::expired, call,
           who + ": created " + manifest.created + ", more than " +
               std::to_string(limits.max_age->count()) + " s before " + detail::format_time(now));
}

// Steps 8 and 9: payload size and hash, payload kind and target. Returns what inspect_image
// found in a cubin or fatbin; nullopt for CUDA source.
std::optional<image_info> check_payload(const bundle_manifest& manifest,
                                        std::span<const std::byte> payload,
                                        const std::string& who) {
  constexpr const char* call = verify_call;
  if (manifest.payload_size != payload.size())
    refuse(bundle_reason::payload_mismatch, call,
           who + ": payload is " + std::to_string(payload.size()) + " bytes, manifest says " +
               std::to_string(manifest.payload_size));
  if (sha256_hex(payload) != manifest.payload_sha256)
    refuse(bundle_reason::payload_mismatch, call,
           who + ": payload SHA-256 differs from the manifest's");
  if (manifest.kind == payload_kind::cuda_source) {
    if (std::find(payload.begin(), payload.end(), std::byte{0}) != payload.end())
      refuse(bundle_reason::payload_kind_mismatch, call, who + ": CUDA source contains a NUL byte");
    return std::nullopt;
  }
  image_info info;
  try {
    info = inspect_image(payload);
  } catch (const error& e) {
    refuse(bundle_reason::payload_kind_mismatch, call,
           who + ": payload is not a " + std::string(to_string(manifest.kind)) + ": " + e.what());
  }
  const auto expected =
      manifest.kind == payload_kind::cubin ? image_kind::cubin : image_kind::fatbin;
  if (info.kind != expected)
    refuse(bundle_reason::payload_kind_mismatch, call,
           who + ": manifest says " + std::string(to_string(manifest.kind)) + ", payload is " +
               std::string(to_string(info.kind)));
  bool runs = false;
  try {
    runs = can_run_on(info, manifest.target_capability);
  } catch (const error&) {
    runs = false;
  }
  if (!runs)
    refuse(bundle_reason::target_mismatch, call,
           who + ": image has no code that runs on " + manifest.target);
  return info;
}

// Step 10, for a receiver that names its device: the payload runs there. `image` is what
// step 9 found (nullopt for CUDA source, which the receiver compiles for exactly its device);
// it records the device, so that loading it does not decide this again.
void check_device(const bundle_manifest& manifest, std::optional<image_info>& image,
                  const std::optional<compute_capability>& device, const std::string& who) {
  if (!device) return;
  bool runs = false;
  if (!image) {
    runs = manifest.target_capability.numbers() == device->numbers();
  } else {
    try {
      runs = can_run_on(*image, *device);
    } catch (const error&) {  // a device of impossible numbers: nothing runs there
      runs = false;
    }
  }
  if (!runs)
    refuse(bundle_reason::wrong_device, verify_call,
           who + " targets " + manifest.target + ", the device here is " +
               to_string(device->numbers()));
  if (image) image->checked_for = device->numbers();
}

}  // namespace

verified_bundle verify_bundle(std::span<const std::byte> bytes, const trusted_keys& keys,
                              const verify_limits& limits) {
  const auto parts = split_bundle(bytes, limits, verify_call);  // 1 to 3
  // 4. Manifest syntax and schema.
  const std::string_view manifest_text(reinterpret_cast<const char*>(parts.manifest.data()),
                                       parts.manifest.size());
  bundle_manifest manifest = read_manifest(manifest_text);
  const std::string who =
      "module " + detail::printable(manifest.name) + " v" + std::to_string(manifest.version);
  check_signature(manifest, manifest_text, parts.signature, keys, who);  // 5, 6
  check_expiry(manifest, limits, who);                                   // 7
  auto image = check_payload(manifest, parts.payload, who);              // 8, 9
  check_device(manifest, image, limits.device, who);                     // 10
  return verified_bundle{std::move(manifest),
                         std::vector<std::byte>(parts.payload.begin(), parts.payload.end()),
                         std::move(image)};
}

}  // namespace cubridge
