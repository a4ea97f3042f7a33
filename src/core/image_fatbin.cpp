// The fatbin reader of inspect_image: the container, and decompression of its entries through
// liblz4 and libzstd.
//
// fatbin: header u32 magic 0xBA55ED50, u16 version 1, u16 header size 16, u64 size of the
//   entries that follow. Entry header (64 bytes; 80 for PTX; 112+ when it carries the
//   .nv.compat bytes or options): u16 kind (1 PTX, 2 ELF, 8 LTO IR), u16 version 0x0101,
//   u32 header size, u64 payload size (padded to 8), u32 compressed size @16, u32 offset of an
//   (offset, size) pair of extra header data @20, u16 minor @24, u16 major @26 (PTX: ISA
//   version; ELF: CUDA ELF ABI 1.7 or 1.8), u32 architecture @28, u32 name offset/size
//   @32/@36, u64 flags @40, u64 decompressed size @56. Flags: 0x1 64-bit, 0x2 debug, 0x10 Linux,
//   0x2000 LZ4, 0x8000 zstd, 0x100000 arch-specific "a", 0x200000 family-specific "f".
//
// Compression, as CUDA 13.0's nvcc -fatbin writes it (headers of the four fixtures
// image_kernels.mode_*.fatbin read with tests/test_image.cpp, from the entries' flags; not
// cross-checked with cuobjdump):
//   --compress-mode=default (or none given): the PTX entry zstd (0x8000), the cubin not;
//   --compress-mode=speed: the PTX entry LZ4 (0x2000), the cubin not;
//   --compress-mode=size: both the PTX and the cubin entry zstd;
//   --compress-mode=none: nothing.
//   -Xfatbin -compress-all compresses the cubin too, in the mode chosen.
// An LZ4 payload is one LZ4 block (no frame) of exactly `compressed size` bytes; a zstd payload
// is one zstd frame of exactly `compressed size` bytes that declares its content size. Either
// must expand to exactly the entry's `decompressed size`.

#include "image_internal.hpp"

#include <lz4.h>
#include <zstd.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace cubridge::image_internal {
namespace {

// Sanity caps. Every count is also bounded by the input size; these give clear errors early.
constexpr std::uint64_t max_fatbin_entries = std::uint64_t{1} << 16;
constexpr std::uint64_t max_decompressed_total = std::uint64_t{1} << 30;  // over all entries
constexpr std::uint64_t max_lz4_ratio = 255;  // the most one input byte of LZ4 can produce
// The most one byte of a zstd frame can produce: an RLE block of 4 bytes (3 of header, 1 byte
// to repeat) yields at most ZSTD_BLOCKSIZE_MAX (128 KiB) bytes.
constexpr std::uint64_t max_zstd_ratio = 32768;

constexpr std::uint64_t fatbin_flag_64bit = 0x1;
constexpr std::uint64_t fatbin_flag_lz4 = 0x2000;
constexpr std::uint64_t fatbin_flag_zstd = 0x8000;
constexpr std::uint64_t fatbin_flag_arch_specific = 0x100000;
constexpr std::uint64_t fatbin_flag_family_specific = 0x200000;

constexpr std::uint16_t entry_kind_ptx = 1;
constexpr std::uint16_t entry_kind_elf = 2;
constexpr std::uint16_t entry_kind_lto_ir = 8;

/// One entry's header fields, bounds-checked against the container.
struct entry_header {
  std::uint16_t kind = 0;
  std::uint32_t header_size = 0;
  std::uint64_t payload_size = 0;
  std::uint32_t compressed_size = 0;
  std::uint16_t minor = 0;
  std::uint16_t major = 0;
  std::uint32_t arch = 0;
  std::uint64_t flags = 0;
  std::uint64_t decompressed_size = 0;
  std::uint64_t payload_at = 0;  ///< offset of the payload in the inspected bytes
};

entry_header read_entry_header(byte_span d, std::uint64_t off, std::uint64_t end,
                               const source& entry) {
  if (end - off < 64)
    entry.fail("entry header truncated: " + std::to_string(end - off) + " bytes left, need 64");
  entry_header h;
  h.kind = rd16(d, off);
  h.header_size = rd32(d, off + 4);
  h.payload_size = rd64(d, off + 8);
  if (h.header_size < 64 || h.header_size > end - off)
    entry.fail("entry header size " + std::to_string(h.header_size) + " is invalid");
  if (h.payload_size > end - off - h.header_size)
    entry.fail("payload of " + std::to_string(h.payload_size) +
               " bytes runs past the end of the "
               "fatbin (" +
               std::to_string(end - off - h.header_size) + " bytes left)");
  h.compressed_size = rd32(d, off + 16);
  h.minor = rd16(d, off + 24);
  h.major = rd16(d, off + 26);
  h.arch = rd32(d, off + 28);
  h.flags = rd64(d, off + 40);
  h.decompressed_size = rd64(d, off + 56);
  h.payload_at = off + h.header_size;
  return h;
}

/// The LZ4 block `in`, which must expand to exactly `expected` bytes.
std::vector<std::byte> lz4_decompress(byte_span in, std::uint64_t expected, const source& s) {
  // Both fit an int: in.size() is a u32 below the payload size, expected at most
  // max_decompressed_total.
  std::vector<std::byte> out(expected);
  const int n = LZ4_decompress_safe(reinterpret_cast<const char*>(in.data()),
                                    reinterpret_cast<char*>(out.data()),
                                    static_cast<int>(in.size()), static_cast<int>(expected));
  if (n < 0)
    s.fail("LZ4 data is malformed or expands past the declared " + std::to_string(expected) +
           " bytes (LZ4_decompress_safe: error at compressed offset " + std::to_string(-n - 1) +
           ")");
  if (static_cast<std::uint64_t>(n) != expected)
    s.fail("LZ4 data expands to " + std::to_string(n) + " bytes, not the declared " +
           std::to_string(expected));
  return out;
}

/// The zstd frame `in`, which must declare and expand to exactly `expected` bytes.
std::vector<std::byte> zstd_decompress(byte_span in, std::uint64_t expected, const source& s) {
  const unsigned long long content = ZSTD_getFrameContentSize(in.data(), in.size());
  if (content == ZSTD_CONTENTSIZE_ERROR)
    s.fail("zstd data is not a zstd frame (bad magic number or frame header)");
  if (content == ZSTD_CONTENTSIZE_UNKNOWN)
    s.fail("zstd frame does not declare its content size (the entry declares " +
           std::to_string(expected) + " bytes)");
  if (content != expected)
    s.fail("zstd frame declares " + std::to_string(content) +
           " bytes of content, not the entry's " + std::to_string(expected));
  const std::size_t frame = ZSTD_findFrameCompressedSize(in.data(), in.size());
  if (ZSTD_isError(frame))
    s.fail(std::string("zstd frame is truncated or malformed: ") + ZSTD_getErrorName(frame));
  if (frame != in.size())
    s.fail("zstd frame ends after " + std::to_string(frame) + " of the " +
           std::to_string(in.size()) + " compressed bytes");
  const std::unique_ptr<ZSTD_DCtx, decltype(&ZSTD_freeDCtx)> context(ZSTD_createDCtx(),
                                                                     &ZSTD_freeDCtx);
  if (!context) s.fail("zstd: cannot create a decompression context (out of memory)");
  std::vector<std::byte> out(expected);
  const std::size_t n =
      ZSTD_decompressDCtx(context.get(), out.data(), out.size(), in.data(), in.size());
  if (ZSTD_isError(n)) s.fail(std::string("zstd data is corrupt: ") + ZSTD_getErrorName(n));
  if (n != expected)
    s.fail("zstd data expands to " + std::to_string(n) + " bytes, not the declared " +
           std::to_string(expected));
  return out;
}

/// Checks a compressed entry's sizes against its payload, the format's ratio and the total cap,
/// then decompresses it.
std::vector<std::byte> decompress_entry(const entry_header& h, byte_span payload,
                                        std::uint64_t& decompressed_total, const source& entry) {
  const bool lz4 = (h.flags & fatbin_flag_lz4) != 0;
  const char* format = lz4 ? "LZ4" : "zstd";
  if (h.compressed_size == 0 || h.compressed_size > h.payload_size)
    entry.fail("compressed size " + std::to_string(h.compressed_size) +
               " does not fit its payload of " + std::to_string(h.payload_size) + " bytes");
  const auto ratio = lz4 ? max_lz4_ratio : max_zstd_ratio;
  if (h.decompressed_size == 0 || h.decompressed_size > sat_mul(h.compressed_size, ratio) + 64)
    entry.fail("decompressed size " + std::to_string(h.decompressed_size) + " is impossible for " +
               std::to_string(h.compressed_size) + " bytes of " + format);
  decompressed_total = sat_add(decompressed_total, h.decompressed_size);
  if (decompressed_total > max_decompressed_total)
    entry.fail("entries decompress to more than " + std::to_string(max_decompressed_total) +
               " bytes in total");
  const auto compressed = payload.first(h.compressed_size);
  return lz4 ? lz4_decompress(compressed, h.decompressed_size, entry)
             : zstd_decompress(compressed, h.decompressed_size, entry);
}

/// What the entry header says about its target; nullopt for an entry kind this reader does not
/// know (the driver skips those too).
std::optional<image_target> target_of(const entry_header& h, const source& entry) {
  image_target target;
  if (h.kind == entry_kind_ptx) {
    target.kind = image_kind::ptx;
    target.ptx_version = ptx_isa_version{h.major, h.minor};
  } else if (h.kind == entry_kind_elf) {
    target.kind = image_kind::cubin;
  } else if (h.kind == entry_kind_lto_ir) {
    target.kind = image_kind::lto_ir;
  } else {
    return std::nullopt;
  }
  if (h.arch < 10 || h.arch > 999)
    entry.fail("architecture " + std::to_string(h.arch) + " is not a valid SM number");
  target.sm = static_cast<int>(h.arch);
  target.variant = (h.flags & fatbin_flag_arch_specific)     ? arch_variant::arch_specific
                   : (h.flags & fatbin_flag_family_specific) ? arch_variant::family_specific
                                                             : arch_variant::generic;
  target.compressed = (h.flags & (fatbin_flag_lz4 | fatbin_flag_zstd)) != 0;
  target.address_bits = (h.flags & fatbin_flag_64bit) ? 64 : 32;
  return target;
}

/// Reads the cubin or PTX `content` of an entry, checks it against the header's `target`, and
/// adds its kernels to `target` and `kernels`.
void read_entry_code(const source& content, const source& entry, image_target& target,
                     kernel_set& kernels, work_budget& budget) {
  parsed_code code;
  if (target.kind == image_kind::cubin) {
    code = parse_cubin(content, budget);
    if (code.target.sm != target.sm)
      entry.fail("the entry header says " + to_string(target.capability().numbers()) +
                 " but its cubin is " + to_string(code.target.capability().numbers()));
  } else {
    code = parse_ptx(content, budget);
    if (code.target.sm != target.sm)
      entry.fail("the entry header says " +
                 arch_name_of(image_kind::ptx, target.capability().numbers()) +
                 " but its PTX targets " + to_string(code.target.capability().numbers()));
    target.ptx_version = code.target.ptx_version;
  }
  target.variant = stronger(target.variant, code.target.variant);
  for (auto& k : code.kernels) {
    target.kernel_names.push_back(k.name);
    kernels.add(std::move(k), entry);
  }
}

/// Reads the entry at `off` (before `end`) into `info` and `kernels`; returns the offset of the
/// next entry.
std::uint64_t read_entry(byte_span d, std::uint64_t off, std::uint64_t end, std::uint64_t index,
                         image_info& info, kernel_set& kernels, std::uint64_t& decompressed_total,
                         work_budget& budget) {
  source entry{d, 0,
               "fatbin entry " + std::to_string(index) + " (offset " + std::to_string(off) + ")"};
  if (index >= max_fatbin_entries)
    entry.fail("more than " + std::to_string(max_fatbin_entries) + " entries");
  const auto h = read_entry_header(d, off, end, entry);
  const auto payload = d.subspan(h.payload_at, h.payload_size);
  const auto next = h.payload_at + h.payload_size;
  auto target = target_of(h, entry);
  if (!target) return next;
  entry.ctx = "fatbin entry " + std::to_string(index) + " (" +
              arch_name_of(target->kind, target->capability()) + ", offset " + std::to_string(off) +
              ")";
  if (target->kind != image_kind::lto_ir) {
    if ((h.flags & fatbin_flag_lz4) && (h.flags & fatbin_flag_zstd))
      entry.fail("flags " + hex(h.flags) + " claim both LZ4 and zstd compression");
    if (target->compressed) {
      const auto inflated = decompress_entry(h, payload, decompressed_total, entry);
      budget.grant(inflated.size());
      const char* how = (h.flags & fatbin_flag_lz4) ? ", LZ4-decompressed" : ", zstd-decompressed";
      read_entry_code(source{inflated, 0, entry.ctx + how}, entry, *target, kernels, budget);
    } else {
      read_entry_code(source{payload, h.payload_at, entry.ctx}, entry, *target, kernels, budget);
    }
  }
  target->arch_name = arch_name_of(target->kind, target->capability());
  info.targets.push_back(std::move(*target));
  return next;
}

}  // namespace

image_info parse_fatbin(byte_span d, work_budget& budget) {
  const source top{d, 0, "fatbin"};
  if (d.size() < 16) top.fail("truncated header: " + std::to_string(d.size()) + " bytes, need 16");
  const auto version = rd16(d, 4);
  const auto header_size = rd16(d, 6);
  const auto fat_size = rd64(d, 8);
  if (version != 1)
    top.fail("version " + std::to_string(version) + " is not supported (expected 1)");
  if (header_size < 16 || header_size > d.size())
    top.fail("header size " + std::to_string(header_size) + " is invalid for a " +
             std::to_string(d.size()) + "-byte image");
  if (fat_size > d.size() - header_size)
    top.fail("the header announces " + std::to_string(fat_size) +
             " bytes of entries after offset " + std::to_string(header_size) +
             " but the image has " + std::to_string(d.size()) + " bytes (truncated?)");
  image_info info;
  info.kind = image_kind::fatbin;
  kernel_set kernels;
  std::uint64_t decompressed_total = 0;
  const std::uint64_t end = header_size + fat_size;
  for (std::uint64_t off = header_size, index = 0; off < end; ++index)
    off = read_entry(d, off, end, index, info, kernels, decompressed_total, budget);
  if (info.targets.empty()) top.fail("no cubin, PTX or LTO IR entries");
  info.kernels = kernels.take();
  return info;
}

}  // namespace cubridge::image_internal
