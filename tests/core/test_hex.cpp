// The one hex spelling (detail/hex.hpp) and the handle names built on it (detail/describe.hpp),
// checked against the hand-written encoders they replaced so every message stays byte-identical.
#include <cubridge/core/detail/describe.hpp>
#include <cubridge/core/detail/hex.hpp>

#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

namespace {

using cubridge::detail::append_hex;
using cubridge::detail::hex_number;
using cubridge::detail::is_lower_hex;
using cubridge::detail::parse_hex;
using cubridge::detail::parse_lower_hex;
using cubridge::detail::to_hex;

// What describe.cpp printed before detail/hex.hpp existed.
std::string old_describe_hex(std::uintptr_t value) {
  char buffer[2 + 16 + 1];
  std::snprintf(buffer, sizeof buffer, "0x%llx", static_cast<unsigned long long>(value));
  return buffer;
}

// What bundle.cpp, compile_cache.cpp and image.cpp each wrote out by hand.
std::string old_bytes_hex(const std::vector<unsigned char>& bytes) {
  std::string out;
  for (unsigned char b : bytes) {
    char two[3];
    std::snprintf(two, sizeof two, "%02x", b);
    out += two;
  }
  return out;
}

TEST(hex, bytes_are_two_lower_case_digits_each_in_either_byte_type) {
  std::vector<unsigned char> all(256);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<unsigned char>(i);
  std::vector<std::byte> as_bytes(all.size());
  for (std::size_t i = 0; i < all.size(); ++i) as_bytes[i] = static_cast<std::byte>(all[i]);

  EXPECT_EQ(to_hex(all), old_bytes_hex(all));
  EXPECT_EQ(to_hex(as_bytes), old_bytes_hex(all));
  EXPECT_EQ(to_hex(std::array<std::byte, 3>{std::byte{0x00}, std::byte{0xAB}, std::byte{0x7f}}),
            "00ab7f");
  EXPECT_EQ(to_hex(std::span<const std::byte>{}), "");

  std::string s = "x";
  append_hex(s, 0x0F);
  append_hex(s, 0xF0);
  EXPECT_EQ(s, "x0ff0");
}

TEST(hex, numbers_are_0x_without_leading_zeros_as_describe_printed_them) {
  const std::uint64_t values[] = {0,
                                  1,
                                  0xf,
                                  0x10,
                                  0x1f,
                                  0xBA55ED50u,
                                  0x7f12ab34cd56ef00ull,
                                  std::numeric_limits<std::uint64_t>::max()};
  for (const auto v : values) {
    EXPECT_EQ(hex_number(v), old_describe_hex(v)) << v;
    EXPECT_EQ(cubridge::detail::hex(static_cast<std::uintptr_t>(v)), old_describe_hex(v)) << v;
  }
  EXPECT_EQ(hex_number(0), "0x0");
  EXPECT_EQ(hex_number(0x1f), "0x1f");
  EXPECT_EQ(cubridge::detail::hex(reinterpret_cast<int*>(0xdead0)), "0xdead0");
  EXPECT_EQ(cubridge::detail::hex(static_cast<int*>(nullptr)), "0x0");
}

TEST(hex, parse_hex_reads_either_case_of_exactly_the_right_length) {
  std::array<std::byte, 2> out{};
  ASSERT_TRUE(parse_hex("0aFf", out));
  EXPECT_EQ(out[0], std::byte{0x0a});
  EXPECT_EQ(out[1], std::byte{0xff});
  EXPECT_FALSE(parse_hex("0aF", out));
  EXPECT_FALSE(parse_hex("0aFf0", out));
  EXPECT_FALSE(parse_hex("0aFg", out));
  EXPECT_FALSE(parse_hex(" aFf", out));
  EXPECT_TRUE(parse_hex("", std::span<std::byte>{}));
}

TEST(hex, parse_lower_hex_accepts_only_the_spelling_to_hex_writes) {
  std::array<std::byte, 4> out{};
  ASSERT_TRUE(parse_lower_hex("deadbeef", out));
  EXPECT_EQ(to_hex(out), "deadbeef");
  EXPECT_FALSE(parse_lower_hex("DEADBEEF", out));
  EXPECT_FALSE(parse_lower_hex("deadBeef", out));
  EXPECT_FALSE(parse_lower_hex("deadbee", out));
  EXPECT_FALSE(parse_lower_hex("deadbeef00", out));
  EXPECT_FALSE(parse_lower_hex(std::string("dead\0eef", 8), out));
  EXPECT_FALSE(parse_lower_hex("0xdeadbe", out));

  EXPECT_TRUE(is_lower_hex("0123456789abcdef", 16));
  EXPECT_FALSE(is_lower_hex("0123456789abcdef", 15));
  EXPECT_FALSE(is_lower_hex("0123456789abcdeF", 16));
  static_assert(is_lower_hex("00ff", 4) && !is_lower_hex("00FF", 4));
}

}  // namespace
