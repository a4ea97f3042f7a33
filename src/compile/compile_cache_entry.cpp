// The compile cache's entry format: encoding, the keyed tag, and the bounds-checked decoding
// that trusts nothing before the tag matches.
#include "compile_cache_entry.hpp"

#include "detail/ensure_sodium.hpp"

#include <sodium.h>

#include <array>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

namespace cubridge::compile_cache_internal {

namespace {

constexpr std::array<unsigned char, 8> entry_magic = {'C', 'U', 'B', 'R', 'C', 'C', 'H', 'E'};
constexpr std::uint32_t entry_format_version = 2;
// The part of the header the tag covers: all of it but the tag.
constexpr std::size_t entry_tagged_header_bytes = entry_header_bytes - hash_bytes;

/// The entry's tag: BLAKE2b-256 keyed with the cache's secret over the header (all but the
/// tag: magic, version, length and the key it is stored under) and the payload. Without the
/// secret nobody can make an entry this cache accepts, whatever else they can write.
hash_value entry_tag(const mac_key& secret, const unsigned char* header,
                     const unsigned char* payload, std::size_t payload_size) {
  detail::ensure_sodium();
  crypto_generichash_state state{};
  crypto_generichash_init(&state, secret.data(), secret.size(), hash_bytes);
  crypto_generichash_update(&state, header, entry_tagged_header_bytes);
  crypto_generichash_update(&state, payload, payload_size);
  hash_value out{};
  crypto_generichash_final(&state, out.data(), out.size());
  return out;
}

void put_u32(std::vector<unsigned char>& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<unsigned char>(v >> (8 * i)));
}
void put_u64(std::vector<unsigned char>& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<unsigned char>(v >> (8 * i)));
}
void put_bytes(std::vector<unsigned char>& out, const void* data, std::size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  out.insert(out.end(), p, p + size);
}
void put_string(std::vector<unsigned char>& out, std::string_view s) {
  put_u64(out, s.size());
  put_bytes(out, s.data(), s.size());
}

/// Bounds-checked little-endian reading; any overrun clears ok.
struct byte_reader {
  const unsigned char* data = nullptr;
  std::size_t left = 0;
  bool ok = true;

  bool take(void* out, std::size_t n) {
    if (!ok || n > left) return ok = false;
    if (n) std::memcpy(out, data, n);
    data += n;
    left -= n;
    return true;
  }
  std::uint64_t u64() {
    unsigned char b[8] = {};
    if (!take(b, 8)) return 0;
    std::uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | b[i];
    return v;
  }
  std::uint32_t u32() {
    unsigned char b[4] = {};
    if (!take(b, 4)) return 0;
    std::uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | b[i];
    return v;
  }
  std::string string() {
    const std::uint64_t n = u64();
    if (!ok || n > left) {
      ok = false;
      return {};
    }
    std::string s(reinterpret_cast<const char*>(data), static_cast<std::size_t>(n));
    data += n;
    left -= n;
    return s;
  }
};

/// The header of `bytes` is of this format, for `key`, of the right length and tagged with
/// `secret` (compared in constant time).
bool header_and_tag_valid(const std::vector<unsigned char>& bytes, const mac_key& secret,
                          const hash_value& key) {
  if (bytes.size() < entry_header_bytes) return false;
  byte_reader header{bytes.data(), entry_header_bytes};
  std::array<unsigned char, 8> magic{};
  header.take(magic.data(), magic.size());
  const std::uint32_t version = header.u32();
  header.u32();  // reserved
  const std::uint64_t payload_size = header.u64();
  hash_value stored_key{};
  hash_value stored_tag{};
  header.take(stored_key.data(), stored_key.size());
  header.take(stored_tag.data(), stored_tag.size());
  if (!header.ok || magic != entry_magic || version != entry_format_version || stored_key != key ||
      payload_size != bytes.size() - entry_header_bytes)
    return false;
  const unsigned char* payload = bytes.data() + entry_header_bytes;
  const hash_value tag = entry_tag(secret, bytes.data(), payload, payload_size);
  return sodium_memcmp(tag.data(), stored_tag.data(), tag.size()) == 0;
}

/// Decodes the payload (cubin, lowered names, log) into `out`; false unless it is exactly that.
bool decode_payload(const unsigned char* payload, std::size_t payload_size, compiled_image& out) {
  byte_reader reader{payload, payload_size};
  const std::uint64_t cubin_size = reader.u64();
  if (!reader.ok || cubin_size > reader.left) return false;
  out.cubin.resize(static_cast<std::size_t>(cubin_size));
  reader.take(out.cubin.data(), out.cubin.size());
  const std::uint64_t names = reader.u64();
  // Each name takes at least 16 bytes of lengths: a corrupt count cannot make us loop long.
  if (!reader.ok || names > reader.left / 16) return false;
  out.lowered_names.clear();
  for (std::uint64_t i = 0; i < names && reader.ok; ++i) {
    std::string expression = reader.string();
    std::string lowered = reader.string();
    out.lowered_names.emplace(std::move(expression), std::move(lowered));
  }
  out.log = reader.string();
  return reader.ok && reader.left == 0;
}

}  // namespace

std::vector<unsigned char> encode_entry(const mac_key& secret, const hash_value& key,
                                        const compiled_image& image) {
  std::vector<unsigned char> payload;
  put_u64(payload, image.cubin.size());
  put_bytes(payload, image.cubin.data(), image.cubin.size());
  put_u64(payload, image.lowered_names.size());
  for (const auto& [expression, lowered] : image.lowered_names) {
    put_string(payload, expression);
    put_string(payload, lowered);
  }
  put_string(payload, image.log);

  // The magic by the constructor: inserting it into an empty vector trips a false
  // -Wstringop-overflow of GCC 12 at -O3.
  std::vector<unsigned char> entry(entry_magic.begin(), entry_magic.end());
  entry.reserve(entry_header_bytes + payload.size());
  put_u32(entry, entry_format_version);
  put_u32(entry, 0);
  put_u64(entry, payload.size());
  put_bytes(entry, key.data(), key.size());
  const hash_value tag = entry_tag(secret, entry.data(), payload.data(), payload.size());
  put_bytes(entry, tag.data(), tag.size());
  put_bytes(entry, payload.data(), payload.size());
  return entry;
}

bool decode_entry(const std::vector<unsigned char>& bytes, const mac_key& secret,
                  const hash_value& key, compiled_image& out) {
  if (!header_and_tag_valid(bytes, secret, key)) return false;
  return decode_payload(bytes.data() + entry_header_bytes, bytes.size() - entry_header_bytes, out);
}

}  // namespace cubridge::compile_cache_internal
