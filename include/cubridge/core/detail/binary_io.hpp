#pragma once
// Bounded binary reading and writing, written once: a reader over a span that never reads past
// its end, a writer that appends to a vector. Integers are little-endian whatever the host's
// order; byte strings carry a u64 length before them, and a reader refuses a length above the
// cap the caller gives. A refused read is a binary_read_error naming the input, the field and
// the offset; each user turns it into its own error at its boundary (the sandbox protocol: a
// protocol_violation).

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace cubridge::detail {

/// A field that does not fit in what is left of the input, a length above its cap, or bytes
/// left over after the last field. what(): "call message: buffer count at offset 12 (4 bytes) runs
/// past the end of the 14 bytes".
class binary_read_error : public std::runtime_error {
 public:
  binary_read_error(std::string input, std::string field, std::size_t offset,
                    const std::string& problem)
      : std::runtime_error(input + ": " + field + " at offset " + std::to_string(offset) + " " +
                           problem),
        input_(std::move(input)),
        field_(std::move(field)),
        offset_(offset) {}

  /// What was being read: "call message", "frame header".
  [[nodiscard]] const std::string& input() const noexcept { return input_; }
  /// The field that could not be read: "buffer count".
  [[nodiscard]] const std::string& field() const noexcept { return field_; }
  /// Where in the input the field starts.
  [[nodiscard]] std::size_t offset() const noexcept { return offset_; }

 private:
  std::string input_;
  std::string field_;
  std::size_t offset_;
};

/// Reads fields of `data` in order. Each read names its field for the error; none reads past the
/// end, and a refused read takes nothing. The span must outlive the reader and the spans it
/// returns.
class binary_reader {
 public:
  static constexpr std::uint64_t no_cap = std::numeric_limits<std::uint64_t>::max();

  /// `input` names the whole in errors ("call message").
  explicit binary_reader(std::span<const std::byte> data, std::string_view input) noexcept
      : data_(data), input_(input) {}

  std::uint8_t u8(std::string_view field) { return integer<std::uint8_t>(field); }
  std::uint16_t u16(std::string_view field) { return integer<std::uint16_t>(field); }
  std::uint32_t u32(std::string_view field) { return integer<std::uint32_t>(field); }
  std::uint64_t u64(std::string_view field) { return integer<std::uint64_t>(field); }
  std::int32_t i32(std::string_view field) { return integer<std::int32_t>(field); }
  std::int64_t i64(std::string_view field) { return integer<std::int64_t>(field); }

  /// The next `n` bytes. @throws binary_read_error when fewer are left.
  std::span<const std::byte> fixed_bytes(std::size_t n, std::string_view field) {
    require(n, field, at_);
    const auto out = data_.subspan(at_, n);
    at_ += n;
    return out;
  }

  /// A u64 length, then that many bytes. @throws binary_read_error when the length is above
  /// `max_bytes` or runs past the end.
  std::span<const std::byte> length_prefixed(std::string_view field,
                                             std::uint64_t max_bytes = no_cap) {
    const std::size_t start = at_;
    const std::uint64_t n = u64(field);
    const std::size_t left = remaining();
    if (n > max_bytes || n > left) {
      at_ = start;  // a refused read takes nothing
      fail(field, start,
           n > max_bytes ? "announces " + std::to_string(n) + " bytes, over the cap of " +
                               std::to_string(max_bytes)
                         : "announces " + std::to_string(n) + " bytes, past the end of the " +
                               std::to_string(data_.size()) + " bytes (" + std::to_string(left) +
                               " left after the length)");
    }
    const auto out = data_.subspan(at_, static_cast<std::size_t>(n));
    at_ += static_cast<std::size_t>(n);
    return out;
  }

  /// length_prefixed() as text.
  std::string text(std::string_view field, std::uint64_t max_bytes = no_cap) {
    const auto b = length_prefixed(field, max_bytes);
    return {reinterpret_cast<const char*>(b.data()), b.size()};
  }

  /// @throws binary_read_error if bytes are left after the last field.
  void expect_end() const {
    if (at_ != data_.size())
      fail("trailing bytes", at_,
           "(" + std::to_string(remaining()) + " of the " + std::to_string(data_.size()) +
               ") follow the last field");
  }

  /// Bytes read so far: the offset of the next field.
  [[nodiscard]] std::size_t offset() const noexcept { return at_; }
  [[nodiscard]] std::size_t remaining() const noexcept { return data_.size() - at_; }
  [[nodiscard]] bool at_end() const noexcept { return at_ == data_.size(); }

 private:
  template <class T>
  T integer(std::string_view field) {
    static_assert(std::is_integral_v<T>);
    require(sizeof(T), field, at_);
    std::make_unsigned_t<T> v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i)
      v |= static_cast<std::make_unsigned_t<T>>(std::to_integer<std::uint8_t>(data_[at_ + i]))
           << (8 * i);
    at_ += sizeof(T);
    return static_cast<T>(v);
  }

  void require(std::size_t n, std::string_view field, std::size_t at) const {
    if (n > remaining())
      fail(field, at,
           "(" + std::to_string(n) + " bytes) runs past the end of the " +
               std::to_string(data_.size()) + " bytes");
  }

  [[noreturn]] void fail(std::string_view field, std::size_t at, const std::string& problem) const {
    throw binary_read_error(std::string(input_), std::string(field), at, problem);
  }

  std::span<const std::byte> data_;
  std::string_view input_;
  std::size_t at_ = 0;
};

/// Appends fields to a byte vector, in the format binary_reader reads.
class binary_writer {
 public:
  binary_writer& u8(std::uint8_t v) { return integer(v); }
  binary_writer& u16(std::uint16_t v) { return integer(v); }
  binary_writer& u32(std::uint32_t v) { return integer(v); }
  binary_writer& u64(std::uint64_t v) { return integer(v); }
  binary_writer& i32(std::int32_t v) { return integer(v); }
  binary_writer& i64(std::int64_t v) { return integer(v); }

  /// The bytes as they are, no length.
  binary_writer& fixed_bytes(std::span<const std::byte> v) {
    data_.insert(data_.end(), v.begin(), v.end());
    return *this;
  }
  /// A u64 length, then the bytes.
  binary_writer& length_prefixed(std::span<const std::byte> v) {
    u64(v.size());
    return fixed_bytes(v);
  }
  /// length_prefixed() of the characters.
  binary_writer& text(std::string_view v) {
    return length_prefixed(std::as_bytes(std::span<const char>(v.data(), v.size())));
  }

  [[nodiscard]] const std::vector<std::byte>& data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return data_.size(); }
  /// The bytes written; the writer is left empty.
  [[nodiscard]] std::vector<std::byte> take() noexcept { return std::move(data_); }

 private:
  template <class T>
  binary_writer& integer(T v) {
    const auto u = static_cast<std::make_unsigned_t<T>>(v);
    for (std::size_t i = 0; i < sizeof(T); ++i)
      data_.push_back(static_cast<std::byte>((u >> (8 * i)) & 0xff));
    return *this;
  }

  std::vector<std::byte> data_;
};

}  // namespace cubridge::detail
