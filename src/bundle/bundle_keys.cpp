// Keys (docs/bundle-format.md, "Keys"): Ed25519 key pairs, their text form and key files, the
// trusted set, and the detached signatures with a domain string that bundles and rollback
// requests are signed with (detail/signing.hpp).
#include <cubridge/bundle/bundle.hpp>
#include <cubridge/bundle/detail/signing.hpp>
#include <cubridge/core/detail/file_io.hpp>
#include <cubridge/core/detail/hex.hpp>

#include "bundle_internal.hpp"
#include "detail/ensure_sodium.hpp"

#include <sodium.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <vector>

#include <sys/stat.h>

namespace cubridge {
namespace {

using bundle_internal::as_uchar;
using bundle_internal::refuse;
using detail::ensure_sodium;

constexpr std::string_view public_key_prefix = "cubridge-ed25519-public ";
constexpr std::string_view secret_key_prefix = "cubridge-ed25519-secret ";

static_assert(crypto_sign_BYTES == 64);
static_assert(crypto_sign_PUBLICKEYBYTES == 32 && crypto_sign_SEEDBYTES == 32);

// What a signature covers: the domain-separation string, then the message bytes.
std::vector<unsigned char> signed_message(std::string_view domain, std::string_view message) {
  // Sized once and filled with memcpy: g++ 12 -O3 warns falsely (-Warray-bounds) on insert().
  std::vector<unsigned char> out(domain.size() + message.size());
  std::memcpy(out.data(), domain.data(), domain.size());
  if (!message.empty()) std::memcpy(out.data() + domain.size(), message.data(), message.size());
  return out;
}

}  // namespace

std::string to_hex(const key_id& id) {
  return detail::to_hex(id);
}

key_id public_key::id() const {
  ensure_sodium();
  std::array<unsigned char, crypto_generichash_BYTES> digest{};  // BLAKE2b-256, unkeyed
  crypto_generichash(digest.data(), digest.size(), as_uchar(bytes.data()), bytes.size(), nullptr,
                     0);
  key_id out{};
  std::memcpy(out.data(), digest.data(), out.size());
  return out;
}

secret_key::secret_key(std::span<const std::byte, 32> seed) noexcept {
  std::copy(seed.begin(), seed.end(), seed_.begin());
}
secret_key::secret_key(secret_key&& other) noexcept : seed_(other.seed_) {
  sodium_memzero(other.seed_.data(), other.seed_.size());
}
secret_key& secret_key::operator=(secret_key&& other) noexcept {
  if (this != &other) {
    seed_ = other.seed_;
    sodium_memzero(other.seed_.data(), other.seed_.size());
  }
  return *this;
}
secret_key::~secret_key() {
  sodium_memzero(seed_.data(), seed_.size());
}

cubridge::public_key secret_key::public_key() const {
  ensure_sodium();
  cubridge::public_key pk;
  std::array<unsigned char, crypto_sign_SECRETKEYBYTES> sk{};
  crypto_sign_seed_keypair(as_uchar(pk.bytes.data()), sk.data(), as_uchar(seed_.data()));
  sodium_memzero(sk.data(), sk.size());
  return pk;
}

keypair generate_keypair() {
  ensure_sodium();
  std::array<std::byte, 32> seed{};
  randombytes_buf(seed.data(), seed.size());
  secret_key sk{std::span<const std::byte, 32>(seed)};
  sodium_memzero(seed.data(), seed.size());
  auto pk = sk.public_key();
  return keypair{pk, std::move(sk)};
}

std::string to_text(const public_key& key) {
  return std::string(public_key_prefix) + detail::to_hex(key.bytes) + "\n";
}
std::string to_text(const secret_key& key) {
  return std::string(secret_key_prefix) + detail::to_hex(key.seed()) + "\n";
}

namespace {
std::array<std::byte, 32> key_bytes_from_text(std::string_view text, std::string_view prefix,
                                              const char* call) {
  if (text.ends_with('\n')) text.remove_suffix(1);
  std::array<std::byte, 32> bytes{};
  if (!text.starts_with(prefix) || !detail::parse_hex(text.substr(prefix.size()), bytes))
    refuse(bundle_reason::bad_key, call, "expected \"" + std::string(prefix) + "<64 hex digits>\"");
  return bytes;
}

// A regular file only (a FIFO would block the reader), sized before it is read.
std::string read_small_file(const std::filesystem::path& path) {
  auto bytes = detail::read_regular_file(path, 4096, "key file");
  std::string text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  sodium_memzero(bytes.data(), bytes.size());
  return text;
}

// Through a fresh file renamed into place: a symlink at `path` is replaced, never written
// through, and a reader never sees half a key.
void write_text_file(const std::filesystem::path& path, const std::string& text, mode_t mode) {
  detail::write_file_atomically(path, std::as_bytes(std::span(text)), mode, true, "key file");
}
}  // namespace

public_key public_key_from_text(std::string_view text) {
  return public_key{key_bytes_from_text(text, public_key_prefix, "public_key_from_text")};
}

secret_key secret_key_from_text(std::string_view text) {
  auto seed = key_bytes_from_text(text, secret_key_prefix, "secret_key_from_text");
  secret_key key{std::span<const std::byte, 32>(seed)};
  sodium_memzero(seed.data(), seed.size());
  return key;
}

void write_key_file(const std::filesystem::path& path, const public_key& key) {
  write_text_file(path, to_text(key), 0644);
}
void write_key_file(const std::filesystem::path& path, const secret_key& key) {
  auto text = to_text(key);
  write_text_file(path, text, 0600);
  sodium_memzero(text.data(), text.size());
}
public_key read_public_key_file(const std::filesystem::path& path) {
  return public_key_from_text(read_small_file(path));
}
secret_key read_secret_key_file(const std::filesystem::path& path) {
  auto text = read_small_file(path);
  auto key = secret_key_from_text(text);
  sodium_memzero(text.data(), text.size());
  return key;
}

trusted_keys::trusted_keys(std::initializer_list<public_key> keys) {
  for (const auto& k : keys) add(k);
}
void trusted_keys::add(const public_key& key) {
  if (std::find(keys_.begin(), keys_.end(), key) == keys_.end()) keys_.push_back(key);
}
const public_key* trusted_keys::find(const key_id& id) const noexcept {
  for (const auto& k : keys_) {
    try {
      if (k.id() == id) return &k;
    } catch (...) {  // only if libsodium cannot initialise; then no key is usable
      return nullptr;
    }
  }
  return nullptr;
}

namespace detail {

void random_bytes(std::span<std::byte> out) {
  ensure_sodium();
  randombytes_buf(out.data(), out.size());
}

std::array<std::byte, 64> sign_detached(std::string_view domain, std::string_view message,
                                        const secret_key& key) {
  ensure_sodium();
  std::array<unsigned char, crypto_sign_PUBLICKEYBYTES> pk{};
  std::array<unsigned char, crypto_sign_SECRETKEYBYTES> sk{};
  crypto_sign_seed_keypair(pk.data(), sk.data(), as_uchar(key.seed().data()));
  const auto signed_bytes = signed_message(domain, message);
  std::array<std::byte, 64> signature{};
  crypto_sign_detached(as_uchar(signature.data()), nullptr, signed_bytes.data(),
                       signed_bytes.size(), sk.data());
  sodium_memzero(sk.data(), sk.size());
  return signature;
}

bool verify_detached(std::string_view domain, std::string_view message,
                     std::span<const std::byte, 64> signature, const public_key& key) {
  ensure_sodium();
  const auto signed_bytes = signed_message(domain, message);
  return crypto_sign_verify_detached(as_uchar(signature.data()), signed_bytes.data(),
                                     signed_bytes.size(), as_uchar(key.bytes.data())) == 0;
}

}  // namespace detail
}  // namespace cubridge
