#pragma once
// Hex spelled one way everywhere: bytes as lower-case digits (cache keys, key ids, digests,
// signatures, nonces), numbers as "0x1f" (handles and image fields in messages), and the strict
// parser of the signed formats. Header-only, no dependencies.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace cubridge::detail {

inline constexpr char lower_hex_digits[] = "0123456789abcdef";

/// Appends `byte` to `out` as two lower-case hex digits.
inline void append_hex(std::string& out, unsigned char byte) {
  out += lower_hex_digits[byte >> 4];
  out += lower_hex_digits[byte & 0xF];
}

/// `bytes` as lower-case hex, two digits a byte.
[[nodiscard]] inline std::string to_hex(std::span<const unsigned char> bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const unsigned char b : bytes) append_hex(out, b);
  return out;
}
[[nodiscard]] inline std::string to_hex(std::span<const std::byte> bytes) {
  return to_hex(std::span<const unsigned char>(reinterpret_cast<const unsigned char*>(bytes.data()),
                                               bytes.size()));
}

/// `value` as "0x" and lower-case hex digits without leading zeros: "0x0", "0x7f12ab34".
[[nodiscard]] inline std::string hex_number(std::uint64_t value) {
  char digits[16];
  std::size_t n = 0;
  do {
    digits[n++] = lower_hex_digits[value & 0xF];
    value >>= 4;
  } while (value != 0);
  std::string out = "0x";
  while (n != 0) out += digits[--n];
  return out;
}

/// The value of one hex digit of either case, or -1.
[[nodiscard]] constexpr int hex_digit_value(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/// Parses exactly out.size() * 2 hex digits of either case into `out`; false on anything else
/// (`out` may then be partly written).
[[nodiscard]] inline bool parse_hex(std::string_view text, std::span<std::byte> out) {
  if (text.size() != out.size() * 2) return false;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const int hi = hex_digit_value(text[2 * i]);
    const int lo = hex_digit_value(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<std::byte>(hi * 16 + lo);
  }
  return true;
}

/// Whether `text` is exactly `length` lower-case hex digits.
[[nodiscard]] constexpr bool is_lower_hex(std::string_view text, std::size_t length) noexcept {
  if (text.size() != length) return false;
  for (const char c : text)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

/// Parses exactly out.size() * 2 lower-case hex digits into `out`; false on anything else, the
/// only spelling the signed formats accept (one text per value, so a signature covers it).
[[nodiscard]] inline bool parse_lower_hex(std::string_view text, std::span<std::byte> out) {
  return is_lower_hex(text, out.size() * 2) && parse_hex(text, out);
}

}  // namespace cubridge::detail
