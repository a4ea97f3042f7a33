// Bounded binary reading and writing (core/detail/binary_io.hpp): the byte layout, round trips,
// and every way a read is refused, with the input, the field and the offset named.
#include <cubridge/core/detail/binary_io.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace {

using cubridge::detail::binary_read_error;
using cubridge::detail::binary_reader;
using cubridge::detail::binary_writer;

std::vector<std::byte> bytes_of(std::initializer_list<unsigned> values) {
  std::vector<std::byte> out;
  for (unsigned v : values) out.push_back(static_cast<std::byte>(v));
  return out;
}

std::span<const std::byte> as_bytes(std::string_view s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

/// The error `read` throws; fails the test if it throws none.
template <class Read>
binary_read_error error_of(Read&& read) {
  try {
    read();
  } catch (const binary_read_error& e) {
    return e;
  }
  ADD_FAILURE() << "the read was not refused";
  return binary_read_error("", "", 0, "");
}

TEST(BinaryIo, IntegersAreLittleEndianWhateverTheHost) {
  const auto bytes = binary_writer()
                         .u8(0xab)
                         .u16(0x0102)
                         .u32(0x03040506)
                         .u64(0x0708090a0b0c0d0eull)
                         .i32(-2)
                         .take();
  EXPECT_EQ(bytes, bytes_of({0xab, 0x02, 0x01, 0x06, 0x05, 0x04, 0x03, 0x0e, 0x0d, 0x0c, 0x0b, 0x0a,
                             0x09, 0x08, 0x07, 0xfe, 0xff, 0xff, 0xff}));
}

TEST(BinaryIo, WhatIsWrittenReadsBack) {
  binary_writer w;
  w.u8(255)
      .u16(65535)
      .u32(0xdeadbeef)
      .u64(std::numeric_limits<std::uint64_t>::max())
      .i32(std::numeric_limits<std::int32_t>::min())
      .i64(-1234567890123ll)
      .text("entry")
      .length_prefixed(bytes_of({1, 2, 3}))
      .fixed_bytes(bytes_of({9, 8}));
  EXPECT_EQ(w.size(), 1u + 2 + 4 + 8 + 4 + 8 + (8 + 5) + (8 + 3) + 2);
  const auto bytes = w.take();
  EXPECT_EQ(w.size(), 0u);
  binary_reader r(bytes, "test record");
  EXPECT_EQ(r.u8("a"), 255);
  EXPECT_EQ(r.u16("b"), 65535);
  EXPECT_EQ(r.u32("c"), 0xdeadbeefu);
  EXPECT_EQ(r.u64("d"), std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(r.i32("e"), std::numeric_limits<std::int32_t>::min());
  EXPECT_EQ(r.i64("f"), -1234567890123ll);
  EXPECT_EQ(r.text("g"), "entry");
  const auto b = r.length_prefixed("h");
  EXPECT_EQ(std::vector<std::byte>(b.begin(), b.end()), bytes_of({1, 2, 3}));
  const auto fixed = r.fixed_bytes(2, "i");
  EXPECT_EQ(std::vector<std::byte>(fixed.begin(), fixed.end()), bytes_of({9, 8}));
  EXPECT_TRUE(r.at_end());
  EXPECT_EQ(r.offset(), bytes.size());
  EXPECT_NO_THROW(r.expect_end());
}

TEST(BinaryIo, AFieldPastTheEndNamesTheInputTheFieldAndTheOffset) {
  const auto bytes = bytes_of({1, 2, 3, 4, 5, 6});
  binary_reader r(bytes, "frame header");
  EXPECT_EQ(r.u32("magic"), 0x04030201u);
  const auto e = error_of([&] { (void)r.u32("version"); });
  EXPECT_EQ(e.input(), "frame header");
  EXPECT_EQ(e.field(), "version");
  EXPECT_EQ(e.offset(), 4u);
  EXPECT_STREQ(e.what(),
               "frame header: version at offset 4 (4 bytes) runs past the end of the 6 bytes");
  // Nothing was consumed by the refused read.
  EXPECT_EQ(r.offset(), 4u);
  EXPECT_EQ(r.u16("version"), 0x0605);
}

TEST(BinaryIo, EveryTruncationOfARecordIsRefused) {
  const auto bytes = binary_writer().u16(7).text("name").u64(1).take();
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    binary_reader r(std::span<const std::byte>(bytes).first(n), "record");
    EXPECT_THROW(
        {
          (void)r.u16("kind");
          (void)r.text("name");
          (void)r.u64("value");
        },
        binary_read_error)
        << n;
  }
}

TEST(BinaryIo, ALengthPastTheEndOrOverItsCapIsRefusedBeforeAnythingIsTaken) {
  // A length of 2^64 - 1: no overflow into a small read.
  const auto huge = binary_writer().u64(std::numeric_limits<std::uint64_t>::max()).take();
  binary_reader r(huge, "message");
  const auto past = error_of([&] { (void)r.length_prefixed("payload"); });
  EXPECT_EQ(past.field(), "payload");
  EXPECT_EQ(past.offset(), 0u);
  EXPECT_NE(std::string(past.what()).find("past the end"), std::string::npos) << past.what();
  EXPECT_EQ(r.offset(), 0u);  // the length too is left unread

  const auto ten = binary_writer().text("0123456789").take();
  binary_reader capped(ten, "message");
  const auto over = error_of([&] { (void)capped.text("name", 9); });
  EXPECT_STREQ(over.what(), "message: name at offset 0 announces 10 bytes, over the cap of 9");
  binary_reader exact(ten, "message");
  EXPECT_EQ(exact.text("name", 10), "0123456789");
}

TEST(BinaryIo, FixedBytesAreBounded) {
  const auto bytes = bytes_of({1, 2, 3});
  binary_reader r(bytes, "key");
  EXPECT_THROW((void)r.fixed_bytes(4, "tag"), binary_read_error);
  EXPECT_EQ(r.fixed_bytes(3, "tag").size(), 3u);
  EXPECT_THROW((void)r.u8("more"), binary_read_error);
}

TEST(BinaryIo, BytesLeftOverAreRefusedByExpectEnd) {
  const auto bytes = binary_writer().u32(1).u8(0).take();
  binary_reader r(bytes, "unshare message");
  (void)r.u32("id");
  EXPECT_FALSE(r.at_end());
  EXPECT_EQ(r.remaining(), 1u);
  const auto e = error_of([&] { r.expect_end(); });
  EXPECT_EQ(e.offset(), 4u);
  EXPECT_STREQ(e.what(),
               "unshare message: trailing bytes at offset 4 (1 of the 5) follow the last field");
}

TEST(BinaryIo, TextIsBytesWithALength) {
  const auto a = binary_writer().text("hi").take();
  const auto b = binary_writer().length_prefixed(as_bytes("hi")).take();
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, bytes_of({2, 0, 0, 0, 0, 0, 0, 0, 'h', 'i'}));
}

}  // namespace
