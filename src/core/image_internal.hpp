#pragma once
// What the image readers (image_cubin.cpp, image_fatbin.cpp, image_ptx.cpp) share: bounds-checked
// little-endian reads, the error context of a piece of input, the work budget, kernel sets.
// Internal to the cubridge library; not installed.

#include <cubridge/core/image.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace cubridge::image_internal {

using byte_span = std::span<const std::byte>;

constexpr std::uint32_t fatbin_magic = 0xBA55ED50u;
constexpr std::uint32_t elf_magic = 0x464c457fu;  // "\x7fELF"

/// "0x1f".
std::string hex(std::uint64_t v);
/// The first (up to 8) bytes of `d` in hex, e.g. "7f 45 4c 46 ...".
std::string first_bytes(byte_span d);

/// Where a piece of input came from, for error messages.
struct source {
  byte_span data;
  std::uint64_t base = 0;  ///< offset of data[0] in the inspected bytes (when not decompressed)
  std::string ctx;         ///< e.g. "fatbin entry 2 (sm_90)"; empty at top level

  /// Throws image_error (errc::bad_image) saying `what`, prefixed with ctx.
  [[noreturn]] void fail(const std::string& what) const;
  /// "offset N" of a position in data, as an offset into the inspected bytes where possible.
  [[nodiscard]] std::string at(std::uint64_t off) const {
    return "offset " + std::to_string(base + off);
  }
};

/// True if [off, off + len) lies within a buffer of `size` bytes; overflow-safe.
constexpr bool fits(std::uint64_t size, std::uint64_t off, std::uint64_t len) noexcept {
  return off <= size && len <= size - off;
}

constexpr std::uint64_t sat_add(std::uint64_t a, std::uint64_t b) noexcept {
  return a > std::numeric_limits<std::uint64_t>::max() - b
             ? std::numeric_limits<std::uint64_t>::max()
             : a + b;
}
constexpr std::uint64_t sat_mul(std::uint64_t a, std::uint64_t b) noexcept {
  return b != 0 && a > std::numeric_limits<std::uint64_t>::max() / b
             ? std::numeric_limits<std::uint64_t>::max()
             : a * b;
}

// Little-endian reads; the caller has checked the bounds.
inline std::uint8_t rd8(byte_span d, std::uint64_t off) {
  return std::to_integer<std::uint8_t>(d[off]);
}
inline std::uint16_t rd16(byte_span d, std::uint64_t off) {
  return static_cast<std::uint16_t>(rd8(d, off) | (rd8(d, off + 1) << 8));
}
inline std::uint32_t rd32(byte_span d, std::uint64_t off) {
  return static_cast<std::uint32_t>(rd16(d, off)) |
         (static_cast<std::uint32_t>(rd16(d, off + 2)) << 16);
}
inline std::uint64_t rd64(byte_span d, std::uint64_t off) {
  return static_cast<std::uint64_t>(rd32(d, off)) |
         (static_cast<std::uint64_t>(rd32(d, off + 4)) << 32);
}

inline std::string_view as_text(byte_span d) {
  return {reinterpret_cast<const char*>(d.data()), d.size()};
}

/// Bounds the work spent on names and records to a multiple of the bytes inspected, so that
/// crafted inputs (e.g. many symbols naming overlapping suffixes of one long string) cannot
/// make the parse quadratic.
class work_budget {
 public:
  explicit work_budget(std::uint64_t input_size)
      : left_(sat_add(std::uint64_t{16} << 20, sat_mul(input_size, 4))) {}
  void spend(std::uint64_t n, const source& s) {
    if (n > left_)
      s.fail(
          "the image needs more work to parse than its size justifies (overlapping names or "
          "records?)");
    left_ -= n;
  }
  /// More budget for `bytes` of decompressed input.
  void grant(std::uint64_t bytes) { left_ = sat_add(left_, sat_mul(bytes, 4)); }

 private:
  std::uint64_t left_;
};

/// The stronger of two suffixes (generic < "f" < "a").
arch_variant stronger(arch_variant a, arch_variant b);
/// "sm_90a", "compute_90", "lto_90".
std::string arch_name_of(image_kind kind, compute_capability capability);

/// Kernels deduplicated by name, in order of first appearance; parameter sizes must agree.
class kernel_set {
 public:
  /// Adds `k`; throws image_error (at `s`) if its parameter sizes contradict an earlier entry's.
  void add(image_kernel k, const source& s);
  std::vector<image_kernel> take() { return std::move(kernels_); }

 private:
  std::unordered_map<std::string, std::size_t> index_;
  std::vector<image_kernel> kernels_;
};

/// One cubin or PTX image, read.
struct parsed_code {
  image_target target;
  std::vector<image_kernel> kernels;
};

/// Reads a cubin (CUDA ELF). Throws image_error.
parsed_code parse_cubin(const source& s, work_budget& budget);

/// Index of the first character after leading whitespace and comments, or npos if a comment
/// is unterminated.
std::size_t skip_space_and_comments(std::string_view t, std::size_t pos);
/// True if `d` begins (after whitespace and comments) with a ".version" directive.
bool looks_like_ptx(byte_span d);
/// Reads PTX text (up to its first NUL). Throws image_error.
parsed_code parse_ptx(const source& s, work_budget& budget);

/// Reads a fatbin container and every cubin/PTX entry in it, decompressing LZ4 and zstd entries.
/// Throws image_error.
image_info parse_fatbin(byte_span d, work_budget& budget);

}  // namespace cubridge::image_internal
