// GPU image inspection without a GPU: cubin (CUDA ELF), fatbin and PTX parsing on the CPU.
//
// Format facts, checked against what the CUDA 13.0 tools write (see tests/test_image.cpp):
//
// cubin: ELF64 little-endian, e_machine EM_CUDA (190). EI_OSABI is 0x41 (CUDA 13) or 0x33
//   (older). The SM number's place in e_flags depends on EI_ABIVERSION:
//     ABI version <= 7 (CUDA <= 12.x): SM in bits 0..7, bit 0x400 64-bit addressing, bit 0x800
//       arch-specific ("a"), virtual SM in bits 16..23;
//     ABI version >= 8 (CUDA 12.8+/13, all architectures, e.g. 0x06005004 for sm_80,
//       0x06006402 for sm_100): SM in bits 8..15; LLVM names bit 0x8 "accelerators", but
//       ptxas 13.0 leaves it clear for sm_90a/sm_100a. It marks "a" cubins in the .nv.compat
//       section instead (record attribute 0x09 with value 1), and records the -arch option,
//       including an "f" suffix, only in the .note.nv.tkinfo note ("-arch sm_100f -m 64").
//   Kernels are STT_FUNC symbols with STO_CUDA_ENTRY (0x10) in st_other; with -rdc, device
//   functions are global STT_FUNC too, and even get a .nv.info.<name> section, but lack the
//   flag. .nv.info.<kernel> holds EIATTR records: format byte (1 none, 2 byte, 3 half, 4 sized
//   with a 16-bit length), attribute byte, then a 16-bit value or length. KPARAM_INFO (0x17,
//   12 bytes): u32 index, u16 ordinal, u16 offset, u32 whose bits 18..31 are the size.
//   CBANK_PARAM_SIZE (0x19, half) is the total; PARAM_CBANK (0x0a, 8 bytes) holds the symbol
//   index, a u16 offset and a u16 size of the parameter bank. When the parameters total more
//   than 4 KiB ptxas writes no KPARAM_INFO at all (14 size bits cannot hold them).
//
// fatbin: header u32 magic 0xBA55ED50, u16 version 1, u16 header size 16, u64 size of the
//   entries that follow. Entry header (64 bytes; 80 for PTX; 112+ when it carries the
//   .nv.compat bytes or options): u16 kind (1 PTX, 2 ELF, 8 LTO IR), u16 version 0x0101,
//   u32 header size, u64 payload size (padded to 8), u32 compressed size @16, u32 offset of an
//   (offset, size) pair of extra header data @20, u16 minor @24, u16 major @26 (PTX: ISA
//   version; ELF: CUDA ELF ABI 1.7 or 1.8), u32 architecture @28, u32 name offset/size
//   @32/@36, u64 flags @40, u64 decompressed size @56. Flags: 0x1 64-bit, 0x2 debug, 0x10 Linux,
//   0x2000 LZ4 (standard LZ4 block format; fatbinary --compress-mode=speed), 0x8000 zstd
//   (CUDA 13's default: PTX is compressed unless --no-compress, cubins too with
//   -Xfatbin -compress-all), 0x100000 arch-specific "a", 0x200000 family-specific "f".
//
// PTX: text, ".version M.N" first (after comments), then ".target sm_XY[a|f][, ...]" and
//   ".address_size 32|64"; kernels are ".entry name (.param ...) { ... }".

#include "cubridge/image.hpp"
#include "cubridge/detail/file_io.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace cubridge {
namespace {

using byte_span = std::span<const std::byte>;

// Sanity caps. Every count is also bounded by the input size; these give clear errors early.
constexpr std::uint64_t max_sections = std::uint64_t{1} << 20;
constexpr std::uint64_t max_fatbin_entries = std::uint64_t{1} << 16;
constexpr std::uint64_t max_decompressed_total = std::uint64_t{1} << 30;  // over all entries
constexpr std::uint64_t max_lz4_ratio = 255;  // the most one input byte of LZ4 can produce
constexpr std::uintmax_t max_file_size = std::uintmax_t{2} << 30;

constexpr std::uint32_t fatbin_magic = 0xBA55ED50u;
constexpr std::uint16_t em_cuda = 190;
constexpr std::uint64_t fatbin_flag_64bit = 0x1;
constexpr std::uint64_t fatbin_flag_lz4 = 0x2000;
constexpr std::uint64_t fatbin_flag_zstd = 0x8000;
constexpr std::uint64_t fatbin_flag_arch_specific = 0x100000;
constexpr std::uint64_t fatbin_flag_family_specific = 0x200000;

std::string hex(std::uint64_t v) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s;
  do {
    s.insert(s.begin(), digits[v & 0xf]);
    v >>= 4;
  } while (v != 0);
  return "0x" + s;
}

std::string first_bytes(byte_span d) {
  std::string s;
  static constexpr char digits[] = "0123456789abcdef";
  for (std::size_t i = 0; i < d.size() && i < 8; ++i) {
    auto b = std::to_integer<unsigned>(d[i]);
    if (i != 0) s += ' ';
    s += digits[b >> 4];
    s += digits[b & 0xf];
  }
  if (d.size() > 8) s += " ...";
  return s;
}

// Where a piece of input came from, for error messages.
struct source {
  byte_span data;
  std::uint64_t base = 0;  // offset of data[0] in the inspected bytes (when not decompressed)
  std::string ctx;         // e.g. "fatbin entry 2 (sm_90)"; empty at top level

  [[noreturn]] void fail(const std::string& what) const {
    detail::throw_errc(errc::bad_image, "inspect_image", ctx.empty() ? what : ctx + ": " + what);
  }
  // "offset N" of a position in data, as an offset into the inspected bytes where possible.
  [[nodiscard]] std::string at(std::uint64_t off) const {
    return "offset " + std::to_string(base + off);
  }
};

// True if [off, off + len) lies within a buffer of `size` bytes; overflow-safe.
constexpr bool fits(std::uint64_t size, std::uint64_t off, std::uint64_t len) noexcept {
  return off <= size && len <= size - off;
}

std::uint64_t sat_add(std::uint64_t a, std::uint64_t b) noexcept {
  return a > std::numeric_limits<std::uint64_t>::max() - b ? std::numeric_limits<std::uint64_t>::max()
                                                          : a + b;
}
std::uint64_t sat_mul(std::uint64_t a, std::uint64_t b) noexcept {
  return b != 0 && a > std::numeric_limits<std::uint64_t>::max() / b
             ? std::numeric_limits<std::uint64_t>::max()
             : a * b;
}

// Little-endian reads; the caller has checked the bounds.
std::uint8_t rd8(byte_span d, std::uint64_t off) { return std::to_integer<std::uint8_t>(d[off]); }
std::uint16_t rd16(byte_span d, std::uint64_t off) {
  return static_cast<std::uint16_t>(rd8(d, off) | (rd8(d, off + 1) << 8));
}
std::uint32_t rd32(byte_span d, std::uint64_t off) {
  return static_cast<std::uint32_t>(rd16(d, off)) | (static_cast<std::uint32_t>(rd16(d, off + 2)) << 16);
}
std::uint64_t rd64(byte_span d, std::uint64_t off) {
  return static_cast<std::uint64_t>(rd32(d, off)) | (static_cast<std::uint64_t>(rd32(d, off + 4)) << 32);
}

std::string_view as_text(byte_span d) {
  return {reinterpret_cast<const char*>(d.data()), d.size()};
}

// Bounds the work spent on names and records to a multiple of the bytes inspected, so that
// crafted inputs (e.g. many symbols naming overlapping suffixes of one long string) cannot
// make the parse quadratic.
class work_budget {
 public:
  explicit work_budget(std::uint64_t input_size)
      : left_(sat_add(std::uint64_t{16} << 20, sat_mul(input_size, 4))) {}
  void spend(std::uint64_t n, const source& s) {
    if (n > left_)
      s.fail("the image needs more work to parse than its size justifies (overlapping names or "
             "records?)");
    left_ -= n;
  }
  void grant(std::uint64_t bytes) { left_ = sat_add(left_, sat_mul(bytes, 4)); }

 private:
  std::uint64_t left_;
};

std::string variant_suffix(arch_variant v) {
  switch (v) {
    case arch_variant::arch_specific: return "a";
    case arch_variant::family_specific: return "f";
    case arch_variant::generic: break;
  }
  return "";
}

arch_variant stronger(arch_variant a, arch_variant b) {
  return static_cast<int>(a) >= static_cast<int>(b) ? a : b;
}

std::string arch_name_of(image_kind kind, int sm, arch_variant v) {
  std::string prefix = kind == image_kind::ptx ? "compute_" : kind == image_kind::lto_ir ? "lto_" : "sm_";
  return prefix + std::to_string(sm) + variant_suffix(v);
}

std::string sizes_text(const std::vector<std::size_t>& sizes) {
  std::string s = "[";
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (i != 0) s += ", ";
    s += std::to_string(sizes[i]);
  }
  return s + "]";
}

// Kernels deduplicated by name, in order of first appearance.
class kernel_set {
 public:
  void add(image_kernel k, const source& s) {
    auto [it, inserted] = index_.try_emplace(k.name, kernels_.size());
    if (inserted) {
      kernels_.push_back(std::move(k));
      return;
    }
    auto& known = kernels_[it->second];
    if (!k.parameter_sizes) return;
    if (!known.parameter_sizes) {
      known.parameter_sizes = std::move(k.parameter_sizes);
    } else if (*known.parameter_sizes != *k.parameter_sizes) {
      s.fail("kernel '" + k.name + "' has parameter sizes " + sizes_text(*k.parameter_sizes) +
             " here but " + sizes_text(*known.parameter_sizes) + " in an earlier entry");
    }
  }
  std::vector<image_kernel> take() { return std::move(kernels_); }

 private:
  std::unordered_map<std::string, std::size_t> index_;
  std::vector<image_kernel> kernels_;
};

struct parsed_code {
  image_target target;
  std::vector<image_kernel> kernels;
};

// ---------------------------------------------------------------------------------------------
// cubin

constexpr std::uint32_t sht_null = 0;
constexpr std::uint32_t sht_symtab = 2;
constexpr std::uint32_t sht_strtab = 3;
constexpr std::uint32_t sht_nobits = 8;
constexpr std::uint8_t stt_func = 2;
constexpr std::uint8_t sto_cuda_entry = 0x10;

constexpr std::uint8_t eifmt_sval = 4;
constexpr std::uint8_t eiattr_param_cbank = 0x0a;
constexpr std::uint8_t eiattr_kparam_info = 0x17;
constexpr std::uint8_t eiattr_cbank_param_size = 0x19;
constexpr std::uint8_t compat_attr_arch_specific = 0x09;

struct elf_section {
  std::uint32_t name = 0;
  std::uint32_t type = 0;
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
  std::uint32_t link = 0;
  std::uint32_t info = 0;
  std::uint64_t entsize = 0;
  std::string_view name_text;
};

class cubin_parser {
 public:
  cubin_parser(const source& s, work_budget& budget) : s_(s), d_(s.data), budget_(budget) {}

  parsed_code parse() {
    read_header();
    read_sections();
    read_program_headers();
    parsed_code out;
    out.target.kind = image_kind::cubin;
    out.target.sm = sm_;
    out.target.variant = variant_from_sections();
    out.target.arch_name = arch_name_of(image_kind::cubin, sm_, out.target.variant);
    out.target.address_bits = 64;
    out.kernels = read_kernels();
    return out;
  }

 private:
  void read_header() {
    if (d_.size() < 64)
      s_.fail("truncated ELF header: " + std::to_string(d_.size()) + " bytes, need 64");
    const auto cls = rd8(d_, 4);
    if (cls == 1) s_.fail("32-bit (ELFCLASS32) cubins are not supported");
    if (cls != 2) s_.fail("bad ELF class " + std::to_string(cls) + " at " + s_.at(4));
    if (rd8(d_, 5) != 1) s_.fail("not a little-endian ELF (EI_DATA " + std::to_string(rd8(d_, 5)) + ")");
    if (rd8(d_, 6) != 1) s_.fail("bad ELF version " + std::to_string(rd8(d_, 6)) + " at " + s_.at(6));
    const auto machine = rd16(d_, 18);
    if (machine != em_cuda)
      s_.fail("ELF file for machine " + std::to_string(machine) +
              ", not a CUDA cubin (e_machine EM_CUDA = 190); host objects with an embedded "
              "fatbin are not supported");
    abi_version_ = rd8(d_, 8);
    flags_ = rd32(d_, 48);
    if (abi_version_ >= 8) {
      sm_ = static_cast<int>((flags_ >> 8) & 0xff);
      if (flags_ & 0x8) header_variant_ = arch_variant::arch_specific;
    } else {
      sm_ = static_cast<int>(flags_ & 0xff);
      if (flags_ & 0x800) header_variant_ = arch_variant::arch_specific;
    }
    if (sm_ < 10)
      s_.fail("e_flags " + hex(flags_) + " (ELF ABI version " + std::to_string(abi_version_) +
              ") name no SM architecture");
  }

  elf_section section_at(std::uint64_t off) const {
    elf_section sec;
    sec.name = rd32(d_, off);
    sec.type = rd32(d_, off + 4);
    sec.offset = rd64(d_, off + 24);
    sec.size = rd64(d_, off + 32);
    sec.link = rd32(d_, off + 40);
    sec.info = rd32(d_, off + 44);
    sec.entsize = rd64(d_, off + 56);
    return sec;
  }

  void read_sections() {
    const auto shoff = rd64(d_, 40);
    const auto shentsize = rd16(d_, 58);
    std::uint64_t shnum = rd16(d_, 60);
    std::uint64_t shstrndx = rd16(d_, 62);
    if (shoff == 0) s_.fail("no section header table (e_shoff is 0)");
    if (shentsize != 64) s_.fail("e_shentsize is " + std::to_string(shentsize) + ", expected 64");
    if (!fits(d_.size(), shoff, 64))
      s_.fail("section header table at offset " + std::to_string(shoff) +
              " lies past the end of the image (" + std::to_string(d_.size()) + " bytes)");
    sec0_ = section_at(shoff);
    if (shnum == 0) shnum = sec0_.size;  // extended numbering
    if (shstrndx == 0xffff) shstrndx = sec0_.link;
    if (shnum == 0) s_.fail("the image has no sections");
    if (shnum > max_sections)
      s_.fail(std::to_string(shnum) + " sections, more than the " + std::to_string(max_sections) +
              " supported");
    if (shnum > (d_.size() - shoff) / 64)
      s_.fail("section header table (" + std::to_string(shnum) + " entries at offset " +
              std::to_string(shoff) + ") runs past the end of the image (" +
              std::to_string(d_.size()) + " bytes)");
    sections_.reserve(shnum);
    for (std::uint64_t i = 0; i < shnum; ++i) {
      auto sec = section_at(shoff + i * 64);
      if (has_contents(sec) && !fits(d_.size(), sec.offset, sec.size))
        s_.fail("section " + std::to_string(i) + " (offset " + std::to_string(sec.offset) +
                ", size " + std::to_string(sec.size) + ") runs past the end of the image (" +
                std::to_string(d_.size()) + " bytes)");
      sections_.push_back(sec);
    }
    if (shstrndx == 0 || shstrndx >= shnum)
      s_.fail("no section name table (e_shstrndx " + std::to_string(shstrndx) + ")");
    const auto& names = sections_[shstrndx];
    if (names.type != sht_strtab)
      s_.fail("section name table (section " + std::to_string(shstrndx) + ") has type " +
              std::to_string(names.type) + ", not SHT_STRTAB");
    for (std::size_t i = 0; i < sections_.size(); ++i) {
      auto& sec = sections_[i];
      sec.name_text = string_at(names, sec.name, "section " + std::to_string(i) + "'s name");
      if (sec.name_text.starts_with(".nv.info."))
        info_sections_.try_emplace(sec.name_text.substr(9), i);
    }
  }

  void read_program_headers() {
    const auto phoff = rd64(d_, 32);
    const auto phentsize = rd16(d_, 54);
    std::uint64_t phnum = rd16(d_, 56);
    if (phnum == 0xffff) phnum = sec0_.info;  // extended numbering
    if (phnum == 0) return;
    if (phentsize != 56) s_.fail("e_phentsize is " + std::to_string(phentsize) + ", expected 56");
    if (phoff > d_.size() || phnum > (d_.size() - phoff) / 56)
      s_.fail("program header table (" + std::to_string(phnum) + " entries at offset " +
              std::to_string(phoff) + ") runs past the end of the image (" +
              std::to_string(d_.size()) + " bytes)");
    for (std::uint64_t i = 0; i < phnum; ++i) {
      const auto off = phoff + i * 56;
      const auto p_offset = rd64(d_, off + 8);
      const auto p_filesz = rd64(d_, off + 32);
      if (!fits(d_.size(), p_offset, p_filesz))
        s_.fail("segment " + std::to_string(i) + " (offset " + std::to_string(p_offset) + ", size " +
                std::to_string(p_filesz) + ") runs past the end of the image (" +
                std::to_string(d_.size()) + " bytes)");
    }
  }

  // SHT_NULL (whose size may hold the section count) and SHT_NOBITS occupy no file bytes.
  static bool has_contents(const elf_section& sec) { return sec.type != sht_null && sec.type != sht_nobits; }

  byte_span contents(const elf_section& sec) const {
    if (!has_contents(sec)) return {};
    return d_.subspan(sec.offset, sec.size);  // bounds checked in read_sections
  }

  std::string_view section_label(const elf_section& sec) const {
    return sec.name_text.empty() ? std::string_view("(unnamed)") : sec.name_text;
  }

  // The NUL-terminated string at `off` of string table `table`.
  std::string_view string_at(const elf_section& table, std::uint64_t off, const std::string& what) {
    const auto t = as_text(contents(table));
    if (off >= t.size())
      s_.fail(what + ": string offset " + std::to_string(off) + " is outside its string table (" +
              std::to_string(t.size()) + " bytes)");
    const auto end = t.find('\0', off);
    budget_.spend((end == std::string_view::npos ? t.size() : end) - off + 1, s_);
    if (end == std::string_view::npos)
      s_.fail(what + ": string at table offset " + std::to_string(off) + " is not NUL-terminated");
    return t.substr(off, end - off);
  }

  // Calls f(attribute, format, value bytes, offset in the image) for each EIATTR record.
  template <typename F>
  void for_each_record(const elf_section& sec, F&& f) {
    const auto b = contents(sec);
    budget_.spend(b.size(), s_);
    std::uint64_t p = 0;
    while (p < b.size()) {
      if (b.size() - p < 4)
        s_.fail("section " + std::string(section_label(sec)) + ": record at " +
                s_.at(sec.offset + p) + " is truncated");
      const auto fmt = rd8(b, p);
      const auto attr = rd8(b, p + 1);
      const auto v16 = rd16(b, p + 2);
      byte_span value;
      std::uint64_t len = 4;
      if (fmt == eifmt_sval) {
        if (b.size() - p - 4 < v16)
          s_.fail("section " + std::string(section_label(sec)) + ": record at " +
                  s_.at(sec.offset + p) + " claims " + std::to_string(v16) +
                  " bytes of value, past the end of the section");
        value = b.subspan(p + 4, v16);
        len += v16;
      } else if (fmt >= 1 && fmt <= 3) {
        value = b.subspan(p + 2, 2);
      } else {
        s_.fail("section " + std::string(section_label(sec)) + ": record at " +
                s_.at(sec.offset + p) + " has unknown format " + hex(fmt));
      }
      f(attr, fmt, value, sec.offset + p);
      p += len;
    }
  }

  arch_variant variant_from_sections() {
    arch_variant v = header_variant_;
    for (const auto& sec : sections_) {
      if (sec.name_text == ".nv.compat") {
        for_each_record(sec, [&](std::uint8_t attr, std::uint8_t fmt, byte_span value, std::uint64_t) {
          if (attr == compat_attr_arch_specific && fmt != eifmt_sval && rd8(value, 0) == 1)
            v = arch_variant::arch_specific;
        });
      } else if (sec.name_text == ".note.nv.tkinfo") {
        // The ptxas options, e.g. "-arch sm_100f -m 64"; the only place an "f" is recorded.
        const auto t = as_text(contents(sec));
        budget_.spend(t.size(), s_);
        const auto pos = t.find("-arch sm_");
        if (pos == std::string_view::npos) continue;
        std::size_t i = pos + 9;
        int n = 0;
        std::size_t digits = 0;
        while (i < t.size() && t[i] >= '0' && t[i] <= '9' && digits < 4) {
          n = n * 10 + (t[i] - '0');
          ++i;
          ++digits;
        }
        if (digits == 0 || n != sm_ || i >= t.size()) continue;
        if (t[i] == 'a') v = arch_variant::arch_specific;
        if (t[i] == 'f') v = stronger(v, arch_variant::family_specific);
      }
    }
    return v;
  }

  std::optional<std::vector<std::size_t>> parameter_sizes(std::string_view kernel) {
    auto it = info_sections_.find(kernel);
    if (it == info_sections_.end()) return std::nullopt;
    const auto& sec = sections_[it->second];
    struct kparam {
      std::uint32_t ordinal;
      std::uint32_t offset;
      std::uint32_t size;
      std::uint64_t at;
    };
    std::vector<kparam> params;
    std::optional<std::uint32_t> total;
    for_each_record(sec, [&](std::uint8_t attr, std::uint8_t fmt, byte_span value, std::uint64_t at) {
      if (attr == eiattr_kparam_info) {
        if (fmt != eifmt_sval || value.size() < 12)
          s_.fail("section " + std::string(sec.name_text) + ": KPARAM_INFO record at " + s_.at(at) +
                  " is malformed (" + std::to_string(value.size()) + " bytes)");
        params.push_back({rd16(value, 4), rd16(value, 6), rd32(value, 8) >> 18, at});
      } else if (attr == eiattr_cbank_param_size && fmt != eifmt_sval) {
        total = rd16(value, 0);
      } else if (attr == eiattr_param_cbank && fmt == eifmt_sval && value.size() >= 8 && !total) {
        total = rd16(value, 6);
      }
    });
    if (params.empty()) {
      if (total && *total > 0) return std::nullopt;  // ptxas omits KPARAM_INFO above 4 KiB
      return std::vector<std::size_t>{};
    }
    std::sort(params.begin(), params.end(),
              [](const kparam& a, const kparam& b) { return a.ordinal < b.ordinal; });
    std::vector<std::size_t> sizes;
    sizes.reserve(params.size());
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto& p = params[i];
      if (p.ordinal != i)
        s_.fail("section " + std::string(sec.name_text) + ": KPARAM_INFO record at " + s_.at(p.at) +
                " has ordinal " + std::to_string(p.ordinal) + " where " + std::to_string(i) +
                " was expected (duplicate or missing parameter)");
      if (total && std::uint64_t{p.offset} + p.size > *total)
        s_.fail("section " + std::string(sec.name_text) + ": parameter " + std::to_string(i) +
                " (offset " + std::to_string(p.offset) + ", size " + std::to_string(p.size) +
                ") lies outside the " + std::to_string(*total) + "-byte parameter bank");
      sizes.push_back(p.size);
    }
    return sizes;
  }

  std::vector<image_kernel> read_kernels() {
    std::vector<image_kernel> kernels;
    const elf_section* symtab = nullptr;
    std::size_t symtab_index = 0;
    for (std::size_t i = 0; i < sections_.size(); ++i) {
      if (sections_[i].type == sht_symtab) {
        symtab = &sections_[i];
        symtab_index = i;
        break;
      }
    }
    if (symtab == nullptr) return kernels;
    const std::string where = "symbol table (section " + std::to_string(symtab_index) + ")";
    if (symtab->entsize != 24)
      s_.fail(where + ": entry size " + std::to_string(symtab->entsize) + ", expected 24");
    if (symtab->size % 24 != 0)
      s_.fail(where + ": size " + std::to_string(symtab->size) + " is not a multiple of 24");
    if (symtab->link == 0 || symtab->link >= sections_.size() ||
        sections_[symtab->link].type != sht_strtab)
      s_.fail(where + ": its string table (section " + std::to_string(symtab->link) +
              ") is missing or not SHT_STRTAB");
    const auto& strtab = sections_[symtab->link];
    const auto syms = contents(*symtab);
    std::unordered_set<std::string_view> seen;
    for (std::uint64_t off = 24; off < syms.size(); off += 24) {  // symbol 0 is the null symbol
      const auto st_info = rd8(syms, off + 4);
      const auto st_other = rd8(syms, off + 5);
      if ((st_info & 0xf) != stt_func || (st_other & sto_cuda_entry) == 0) continue;
      const auto index = std::to_string(off / 24);
      const auto name = string_at(strtab, rd32(syms, off), where + ", symbol " + index);
      if (name.empty()) s_.fail(where + ": kernel symbol " + index + " has no name");
      if (!seen.insert(name).second) continue;
      kernels.push_back({std::string(name), parameter_sizes(name)});
    }
    return kernels;
  }

  const source& s_;
  byte_span d_;
  work_budget& budget_;
  std::uint8_t abi_version_ = 0;
  std::uint32_t flags_ = 0;
  int sm_ = 0;
  arch_variant header_variant_ = arch_variant::generic;
  elf_section sec0_;
  std::vector<elf_section> sections_;
  std::unordered_map<std::string_view, std::size_t> info_sections_;  // kernel name -> section
};

// ---------------------------------------------------------------------------------------------
// PTX

bool is_word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '$' || c == '%' || c == '.';
}
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// Index of the first character after leading whitespace and comments, or npos if a comment
// is unterminated.
std::size_t skip_space_and_comments(std::string_view t, std::size_t pos) {
  while (pos < t.size()) {
    if (is_space(t[pos])) {
      ++pos;
    } else if (t[pos] == '/' && pos + 1 < t.size() && t[pos + 1] == '/') {
      pos = t.find('\n', pos + 2);
      if (pos == std::string_view::npos) return t.size();
    } else if (t[pos] == '/' && pos + 1 < t.size() && t[pos + 1] == '*') {
      pos = t.find("*/", pos + 2);
      if (pos == std::string_view::npos) return std::string_view::npos;
      pos += 2;
    } else {
      break;
    }
  }
  return pos;
}

bool looks_like_ptx(byte_span d) {
  auto t = as_text(d);
  t = t.substr(0, t.find('\0'));
  const auto pos = skip_space_and_comments(t, 0);
  if (pos == std::string_view::npos || !t.substr(pos).starts_with(".version")) return false;
  return pos + 8 == t.size() || !is_word_char(t[pos + 8]);
}

struct ptx_token {
  enum kind_t { end, word, punct, string } kind = end;
  std::string_view text;
  std::size_t offset = 0;
  [[nodiscard]] bool is(char c) const { return kind == punct && text.size() == 1 && text[0] == c; }
  [[nodiscard]] bool is(std::string_view w) const { return kind == word && text == w; }
};

class ptx_parser {
 public:
  ptx_parser(const source& s, std::string_view text) : s_(s), t_(text) {}

  parsed_code parse() {
    parsed_code out;
    auto tok = next();
    if (!tok.is(".version")) s_.fail("must begin with .version, found '" + show(tok) + "'");
    out.target.ptx_version = parse_version(next());
    int depth = 0;
    std::size_t outer_open = 0;
    std::optional<image_kernel> pending;  // an .entry whose body has not been seen yet
    std::size_t pending_at = 0;
    bool pending_extern = false;
    bool extern_seen = false;
    bool have_target = false;
    int address_bits = 32;  // the PTX default without .address_size
    for (tok = next(); tok.kind != ptx_token::end; tok = next()) {
      if (depth > 0) {
        if (tok.is('{')) ++depth;
        if (tok.is('}')) --depth;
        continue;
      }
      if (tok.is('{')) {
        if (pending && !pending_extern) kernels_.push_back(std::move(*pending));
        pending.reset();
        extern_seen = false;
        depth = 1;
        outer_open = tok.offset;
      } else if (tok.is('}')) {
        s_.fail("unbalanced '}' at " + s_.at(tok.offset));
      } else if (tok.is(';')) {
        pending.reset();  // a declaration, not a definition
        extern_seen = false;
      } else if (tok.is(".target")) {
        if (have_target) s_.fail("second .target directive at " + s_.at(tok.offset));
        parse_target(out.target);
        have_target = true;
      } else if (tok.is(".address_size")) {
        const auto v = next();
        if (v.is("64")) {
          address_bits = 64;
        } else if (v.is("32")) {
          address_bits = 32;
        } else {
          s_.fail(".address_size must be 32 or 64, found '" + show(v) + "' at " + s_.at(v.offset));
        }
      } else if (tok.is(".pragma")) {
        // ".pragma "...";" may stand between an .entry's parameters and its body.
        for (tok = next(); tok.kind != ptx_token::end && !tok.is(';'); tok = next()) {
        }
      } else if (tok.is(".extern")) {
        extern_seen = true;
      } else if (tok.is(".entry")) {
        if (pending) s_.fail(".entry at " + s_.at(tok.offset) + " follows an .entry without a body");
        pending_at = tok.offset;
        pending = parse_entry();
        pending_extern = extern_seen;
        extern_seen = false;
      }
    }
    if (depth > 0) s_.fail("'{' at " + s_.at(outer_open) + " is never closed (truncated PTX?)");
    if (pending)
      s_.fail(".entry '" + pending->name + "' at " + s_.at(pending_at) + " has no body (truncated PTX?)");
    if (!have_target) s_.fail("no .target directive");
    out.target.kind = image_kind::ptx;
    out.target.address_bits = address_bits;
    out.target.arch_name = arch_name_of(image_kind::ptx, out.target.sm, out.target.variant);
    out.kernels = std::move(kernels_);
    return out;
  }

 private:
  static std::string show(const ptx_token& tok) {
    if (tok.kind == ptx_token::end) return "end of text";
    return std::string(tok.text.substr(0, 40));
  }

  ptx_token next() {
    if (peeked_) {
      peeked_ = false;
      return peek_;
    }
    return lex();
  }
  const ptx_token& peek() {
    if (!peeked_) {
      peek_ = lex();
      peeked_ = true;
    }
    return peek_;
  }

  ptx_token lex() {
    const auto start = pos_;
    pos_ = skip_space_and_comments(t_, pos_);
    if (pos_ == std::string_view::npos)
      s_.fail("unterminated /* comment after " + s_.at(start) + " (truncated PTX?)");
    ptx_token tok;
    tok.offset = pos_;
    if (pos_ >= t_.size()) return tok;
    const char c = t_[pos_];
    if (is_word_char(c)) {
      auto e = pos_;
      while (e < t_.size() && is_word_char(t_[e])) ++e;
      tok.kind = ptx_token::word;
      tok.text = t_.substr(pos_, e - pos_);
      pos_ = e;
    } else if (c == '"') {
      auto e = pos_ + 1;
      while (e < t_.size() && t_[e] != '"') e += t_[e] == '\\' ? 2 : 1;
      if (e >= t_.size()) s_.fail("unterminated string starting at " + s_.at(pos_));
      tok.kind = ptx_token::string;
      tok.text = t_.substr(pos_, e + 1 - pos_);
      pos_ = e + 1;
    } else if (c > ' ' && c < 0x7f) {
      tok.kind = ptx_token::punct;
      tok.text = t_.substr(pos_, 1);
      ++pos_;
    } else {
      s_.fail("byte " + hex(static_cast<unsigned char>(c)) + " at " + s_.at(pos_) +
              " cannot appear in PTX text");
    }
    return tok;
  }

  ptx_isa_version parse_version(const ptx_token& tok) {
    const auto t = tok.kind == ptx_token::word ? tok.text : std::string_view{};
    const auto dot = t.find('.');
    auto number = [](std::string_view n, int& out) {
      if (n.empty() || n.size() > 4) return false;
      out = 0;
      for (char c : n) {
        if (c < '0' || c > '9') return false;
        out = out * 10 + (c - '0');
      }
      return true;
    };
    ptx_isa_version v;
    if (dot == std::string_view::npos || !number(t.substr(0, dot), v.major) ||
        !number(t.substr(dot + 1), v.minor))
      s_.fail("bad .version '" + show(tok) + "' at " + s_.at(tok.offset));
    return v;
  }

  void parse_target(image_target& target) {
    bool have_sm = false;
    for (;;) {
      const auto tok = next();
      if (tok.kind != ptx_token::word)
        s_.fail("bad .target list: '" + show(tok) + "' at " + s_.at(tok.offset));
      if (tok.text.starts_with("sm_")) {
        if (have_sm) s_.fail("second architecture in .target at " + s_.at(tok.offset));
        have_sm = true;
        auto rest = tok.text.substr(3);
        int n = 0;
        std::size_t digits = 0;
        while (digits < rest.size() && rest[digits] >= '0' && rest[digits] <= '9' && digits < 3)
          n = n * 10 + (rest[digits++] - '0');
        rest = rest.substr(digits);
        if (digits < 2 || !(rest.empty() || rest == "a" || rest == "f"))
          s_.fail("bad architecture '" + show(tok) + "' in .target at " + s_.at(tok.offset));
        target.sm = n;
        target.variant = rest == "a"   ? arch_variant::arch_specific
                         : rest == "f" ? arch_variant::family_specific
                                       : arch_variant::generic;
      }
      if (!peek().is(',')) break;
      next();
    }
    if (!have_sm) s_.fail(".target names no sm_ architecture");
  }

  static std::size_t type_size(std::string_view t) {
    static constexpr std::array<std::pair<std::string_view, std::size_t>, 20> types{{
        {".b8", 1},   {".s8", 1},    {".u8", 1},     {".b16", 2},    {".s16", 2},
        {".u16", 2},  {".f16", 2},   {".bf16", 2},   {".b32", 4},    {".s32", 4},
        {".u32", 4},  {".f32", 4},   {".f16x2", 4},  {".bf16x2", 4}, {".tf32", 4},
        {".b64", 8},  {".s64", 8},   {".u64", 8},    {".f64", 8},    {".b128", 16},
    }};
    for (const auto& [name, size] : types)
      if (name == t) return size;
    return 0;
  }

  // After ".entry": the name and the optional parameter list.
  image_kernel parse_entry() {
    const auto name = next();
    if (name.kind != ptx_token::word || name.text.starts_with("."))
      s_.fail(".entry without a name at " + s_.at(name.offset));
    image_kernel k{std::string(name.text), std::vector<std::size_t>{}};
    if (!peek().is('(')) return k;
    const auto open = next();
    bool known = true;
    if (peek().is(')')) {
      next();
      return k;
    }
    for (;;) {
      // One parameter: ".param" then type, ".align N", state spaces, name, "[N]"...
      std::size_t element = 0;
      std::uint64_t count = 1;
      std::size_t index = 0;
      ptx_token tok;
      for (tok = next();; tok = next(), ++index) {
        if (tok.kind == ptx_token::end)
          s_.fail("parameter list of .entry '" + k.name + "' opened at " + s_.at(open.offset) +
                  " is never closed (truncated PTX?)");
        if (tok.is(',') || tok.is(')')) break;
        if (tok.is('{') || tok.is('}') || tok.is(';') || tok.is('('))
          s_.fail("unexpected '" + show(tok) + "' in the parameter list of .entry '" + k.name +
                  "' at " + s_.at(tok.offset));
        if (index == 0) {
          if (!tok.is(".param")) known = false;
        } else if (tok.is(".align")) {
          next();  // the alignment value
        } else if (tok.is(".v2") || tok.is(".v4")) {
          count *= tok.text[2] - '0';
        } else if (tok.kind == ptx_token::word && tok.text.starts_with(".")) {
          if (auto size = type_size(tok.text); size != 0) {
            element = size;
          } else if (!(tok.is(".ptr") || tok.is(".global") || tok.is(".const") ||
                       tok.is(".shared") || tok.is(".local"))) {
            known = false;  // .texref, .samplerref, ... : size not known here
          }
        } else if (tok.is('[')) {
          const auto n = next();
          std::uint64_t dim = 0;
          bool ok = n.kind == ptx_token::word && !n.text.empty() && n.text.size() <= 9;
          for (char c : ok ? n.text : std::string_view{}) {
            if (c < '0' || c > '9') ok = false;
            dim = dim * 10 + static_cast<std::uint64_t>(c - '0');
          }
          if (!ok || !next().is(']')) {
            known = false;  // unsized or symbolic dimension
          } else {
            count = sat_mul(count, dim);
          }
        }
      }
      if (element == 0 || count > (std::uint64_t{1} << 32)) known = false;
      if (known) k.parameter_sizes->push_back(element * count);
      if (tok.is(')')) break;
    }
    if (!known) k.parameter_sizes.reset();
    return k;
  }

  const source& s_;
  std::string_view t_;
  std::size_t pos_ = 0;
  bool peeked_ = false;
  ptx_token peek_;
  std::vector<image_kernel> kernels_;
};

parsed_code parse_ptx(const source& s, work_budget& budget) {
  auto text = as_text(s.data);
  text = text.substr(0, text.find('\0'));  // the driver reads PTX up to its NUL
  budget.spend(text.size(), s);
  return ptx_parser(s, text).parse();
}

// ---------------------------------------------------------------------------------------------
// fatbin

std::vector<std::byte> lz4_decompress(byte_span in, std::uint64_t expected, const source& s) {
  std::vector<std::byte> out;
  out.reserve(std::min<std::uint64_t>(expected, sat_add(sat_mul(in.size(), 4), 65536)));
  std::uint64_t ip = 0;
  auto length = [&](std::uint64_t base) {
    if (base != 15) return base;
    for (;;) {
      if (ip >= in.size()) s.fail("LZ4 data ends inside a length at compressed offset " + std::to_string(ip));
      const auto b = rd8(in, ip++);
      base += b;
      if (base > expected) s.fail("LZ4 data expands past the declared " + std::to_string(expected) + " bytes");
      if (b != 255) return base;
    }
  };
  while (ip < in.size()) {
    const auto token = rd8(in, ip++);
    const auto literals = length(token >> 4);
    if (literals > in.size() - ip)
      s.fail("LZ4 literals at compressed offset " + std::to_string(ip) + " run past the data");
    if (literals > expected - out.size())
      s.fail("LZ4 data expands past the declared " + std::to_string(expected) + " bytes");
    out.insert(out.end(), in.begin() + static_cast<std::ptrdiff_t>(ip),
               in.begin() + static_cast<std::ptrdiff_t>(ip + literals));
    ip += literals;
    if (ip == in.size()) break;  // the last sequence has literals only
    if (in.size() - ip < 2) s.fail("LZ4 data ends inside a match offset");
    const auto offset = rd16(in, ip);
    ip += 2;
    if (offset == 0 || offset > out.size())
      s.fail("LZ4 match at compressed offset " + std::to_string(ip - 2) + " refers to " +
             std::to_string(offset) + " bytes back, before the start of the output");
    const auto match = length(token & 0xf) + 4;
    if (match > expected - out.size())
      s.fail("LZ4 data expands past the declared " + std::to_string(expected) + " bytes");
    auto from = out.size() - offset;
    for (std::uint64_t i = 0; i < match; ++i) out.push_back(out[from + i]);
  }
  if (out.size() != expected)
    s.fail("LZ4 data expands to " + std::to_string(out.size()) + " bytes, not the declared " +
           std::to_string(expected));
  return out;
}

image_info parse_fatbin(byte_span d, work_budget& budget) {
  source top{d, 0, "fatbin"};
  if (d.size() < 16)
    top.fail("truncated header: " + std::to_string(d.size()) + " bytes, need 16");
  const auto version = rd16(d, 4);
  const auto header_size = rd16(d, 6);
  const auto fat_size = rd64(d, 8);
  if (version != 1) top.fail("version " + std::to_string(version) + " is not supported (expected 1)");
  if (header_size < 16 || header_size > d.size())
    top.fail("header size " + std::to_string(header_size) + " is invalid for a " +
             std::to_string(d.size()) + "-byte image");
  if (fat_size > d.size() - header_size)
    top.fail("the header announces " + std::to_string(fat_size) + " bytes of entries after offset " +
             std::to_string(header_size) + " but the image has " + std::to_string(d.size()) +
             " bytes (truncated?)");
  image_info info;
  info.kind = image_kind::fatbin;
  kernel_set kernels;
  std::uint64_t decompressed_total = 0;
  const std::uint64_t end = header_size + fat_size;
  std::uint64_t off = header_size;
  for (std::uint64_t index = 0; off < end; ++index) {
    source entry{d, 0, "fatbin entry " + std::to_string(index) + " (offset " + std::to_string(off) + ")"};
    if (index >= max_fatbin_entries)
      entry.fail("more than " + std::to_string(max_fatbin_entries) + " entries");
    if (end - off < 64)
      entry.fail("entry header truncated: " + std::to_string(end - off) + " bytes left, need 64");
    const auto kind = rd16(d, off);
    const auto entry_header = rd32(d, off + 4);
    const auto payload_size = rd64(d, off + 8);
    if (entry_header < 64 || entry_header > end - off)
      entry.fail("entry header size " + std::to_string(entry_header) + " is invalid");
    if (payload_size > end - off - entry_header)
      entry.fail("payload of " + std::to_string(payload_size) + " bytes runs past the end of the "
                 "fatbin (" + std::to_string(end - off - entry_header) + " bytes left)");
    const auto compressed_size = rd32(d, off + 16);
    const auto minor = rd16(d, off + 24);
    const auto major = rd16(d, off + 26);
    const auto arch = rd32(d, off + 28);
    const auto flags = rd64(d, off + 40);
    const auto decompressed_size = rd64(d, off + 56);
    const auto payload_at = off + entry_header;
    const auto payload = d.subspan(payload_at, payload_size);
    off = payload_at + payload_size;

    image_target target;
    if (kind == 1) {
      target.kind = image_kind::ptx;
    } else if (kind == 2) {
      target.kind = image_kind::cubin;
    } else if (kind == 8) {
      target.kind = image_kind::lto_ir;
    } else {
      continue;  // an entry kind this parser does not know; the driver skips those too
    }
    if (arch < 10 || arch > 999)
      entry.fail("architecture " + std::to_string(arch) + " is not a valid SM number");
    target.sm = static_cast<int>(arch);
    target.variant = (flags & fatbin_flag_arch_specific)     ? arch_variant::arch_specific
                     : (flags & fatbin_flag_family_specific) ? arch_variant::family_specific
                                                             : arch_variant::generic;
    target.compressed = (flags & (fatbin_flag_lz4 | fatbin_flag_zstd)) != 0;
    target.address_bits = (flags & fatbin_flag_64bit) ? 64 : 32;
    if (kind == 1) target.ptx_version = ptx_isa_version{major, minor};
    entry.ctx = "fatbin entry " + std::to_string(index) + " (" +
                arch_name_of(target.kind, target.sm, target.variant) + ", offset " +
                std::to_string(payload_at - entry_header) + ")";

    if (kind != 8) {
      std::vector<std::byte> inflated;
      source content{payload, payload_at, entry.ctx};
      bool readable = true;
      if ((flags & fatbin_flag_lz4) && (flags & fatbin_flag_zstd)) {
        entry.fail("flags " + hex(flags) + " claim both LZ4 and zstd compression");
      } else if (flags & fatbin_flag_zstd) {
        readable = false;  // zstd is not decoded here: report the target only
      } else if (flags & fatbin_flag_lz4) {
        if (compressed_size == 0 || compressed_size > payload_size)
          entry.fail("compressed size " + std::to_string(compressed_size) +
                     " does not fit its payload of " + std::to_string(payload_size) + " bytes");
        if (decompressed_size == 0 || decompressed_size > sat_mul(compressed_size, max_lz4_ratio) + 64)
          entry.fail("decompressed size " + std::to_string(decompressed_size) +
                     " is impossible for " + std::to_string(compressed_size) + " bytes of LZ4");
        decompressed_total = sat_add(decompressed_total, decompressed_size);
        if (decompressed_total > max_decompressed_total)
          entry.fail("entries decompress to more than " + std::to_string(max_decompressed_total) +
                     " bytes in total");
        inflated = lz4_decompress(payload.first(compressed_size), decompressed_size, entry);
        budget.grant(inflated.size());
        content = source{inflated, 0, entry.ctx + ", LZ4-decompressed"};
      }
      if (readable) {
        parsed_code code;
        if (kind == 2) {
          code = cubin_parser(content, budget).parse();
          if (code.target.sm != target.sm)
            entry.fail("the entry header says sm_" + std::to_string(target.sm) + " but its cubin is sm_" +
                       std::to_string(code.target.sm));
        } else {
          code = parse_ptx(content, budget);
          if (code.target.sm != target.sm)
            entry.fail("the entry header says compute_" + std::to_string(target.sm) +
                       " but its PTX targets sm_" + std::to_string(code.target.sm));
          target.ptx_version = code.target.ptx_version;
        }
        target.variant = stronger(target.variant, code.target.variant);
        for (auto& k : code.kernels) kernels.add(std::move(k), entry);
      } else {
        info.kernels_complete = false;
      }
    }
    target.arch_name = arch_name_of(target.kind, target.sm, target.variant);
    info.targets.push_back(std::move(target));
  }
  if (info.targets.empty()) top.fail("no cubin, PTX or LTO IR entries");
  info.kernels = kernels.take();
  return info;
}

[[noreturn]] void precondition_failed(int sm_major, int sm_minor) {
  detail::throw_errc(errc::precondition, "can_run_on",
                     "device compute capability " + std::to_string(sm_major) + "." +
                         std::to_string(sm_minor) + " (needs major >= 1 and minor 0..9)");
}

void check_capability(int sm_major, int sm_minor) {
  if (sm_major < 1 || sm_major > 99 || sm_minor < 0 || sm_minor > 9)
    precondition_failed(sm_major, sm_minor);
}

}  // namespace

std::string_view to_string(image_kind kind) noexcept {
  switch (kind) {
    case image_kind::cubin: return "cubin";
    case image_kind::fatbin: return "fatbin";
    case image_kind::ptx: return "ptx";
    case image_kind::lto_ir: return "lto_ir";
  }
  return "unknown";
}

const image_kernel* image_info::find_kernel(std::string_view name) const noexcept {
  for (const auto& k : kernels)
    if (k.name == name) return &k;
  return nullptr;
}

image_info inspect_image(std::span<const std::byte> bytes) {
  if (bytes.empty())
    detail::throw_errc(errc::bad_image, "inspect_image", "empty input (0 bytes): not a cubin, fatbin or PTX image");
  work_budget budget(bytes.size());
  if (bytes.size() >= 4 && rd32(bytes, 0) == 0x464c457fu) {  // "\x7fELF"
    source s{bytes, 0, "cubin"};
    auto code = cubin_parser(s, budget).parse();
    image_info info;
    info.kind = image_kind::cubin;
    info.targets.push_back(std::move(code.target));
    info.kernels = std::move(code.kernels);
    return info;
  }
  if (bytes.size() >= 4 && rd32(bytes, 0) == fatbin_magic) return parse_fatbin(bytes, budget);
  if (looks_like_ptx(bytes)) {
    source s{bytes, 0, "PTX"};
    auto code = parse_ptx(s, budget);
    kernel_set kernels;
    for (auto& k : code.kernels) kernels.add(std::move(k), s);
    image_info info;
    info.kind = image_kind::ptx;
    info.targets.push_back(std::move(code.target));
    info.kernels = kernels.take();
    return info;
  }
  detail::throw_errc(errc::bad_image, "inspect_image",
                     "not a cubin, fatbin or PTX image (" + std::to_string(bytes.size()) +
                         " bytes; first bytes: " + first_bytes(bytes) + ")");
}

image_info inspect_image_file(const std::filesystem::path& path) {
  // A regular file only (a FIFO or device would block or never end), sized before reading, and
  // read whole only when its first bytes can begin an image: a 2 GiB file of anything else is
  // refused after one chunk.
  detail::regular_file file(path, std::numeric_limits<std::uint64_t>::max(), "image");
  const auto size = static_cast<std::uint64_t>(file.status().st_size);
  if (size > max_file_size)
    detail::throw_errc(errc::bad_image, "inspect_image_file",
                       "'" + path.string() + "' is larger than the 2 GiB an image may have (" +
                           std::to_string(size) + " bytes)");
  std::vector<std::byte> data;
  constexpr std::size_t chunk = std::size_t{1} << 20;
  file.read_some(data, chunk);
  const bool may_be_image = (data.size() >= 4 && (rd32(data, 0) == 0x464c457fu ||  // "\x7fELF"
                                                  rd32(data, 0) == fatbin_magic)) ||
                            looks_like_ptx(data);
  if (data.size() == chunk && !may_be_image) {
    // Not an image unless PTX text begins after more than a chunk of comments and spaces: a NUL
    // or anything else seen whole ends the question here.
    const std::string_view text(reinterpret_cast<const char*>(data.data()), data.size());
    const auto pos = skip_space_and_comments(text, 0);
    if (text.find('\0') != std::string_view::npos ||
        (pos != std::string_view::npos && pos + 9 <= text.size()))
      detail::throw_errc(errc::bad_image, "inspect_image_file",
                         "'" + path.string() + "': not a cubin, fatbin or PTX image (" +
                             std::to_string(size) + " bytes; first bytes: " + first_bytes(data) +
                             ")");
  }
  data.reserve(static_cast<std::size_t>(size) + chunk);  // room for the read that sees the end
  while (file.read_some(data, chunk) != 0)  // to its end, even if it grew since fstat
    if (data.size() > max_file_size)
      detail::throw_errc(errc::bad_image, "inspect_image_file",
                         "'" + path.string() + "' is larger than the 2 GiB an image may have");
  try {
    return inspect_image(data);
  } catch (const image_error& e) {
    // Name the file: rethrow with the path in front of what was wrong.
    detail::throw_errc(errc::bad_image, "inspect_image_file", "'" + path.string() + "': " + e.involved());
  }
}

bool can_run_on(const image_target& target, int sm_major, int sm_minor) {
  check_capability(sm_major, sm_minor);
  const int major = target.sm_major();
  const int minor = target.sm_minor();
  switch (target.kind) {
    case image_kind::cubin:
      if (target.variant == arch_variant::arch_specific) return sm_major == major && sm_minor == minor;
      return sm_major == major && sm_minor >= minor;
    case image_kind::ptx:
      if (target.variant == arch_variant::arch_specific) return sm_major == major && sm_minor == minor;
      if (target.variant == arch_variant::family_specific) return sm_major == major && sm_minor >= minor;
      return sm_major > major || (sm_major == major && sm_minor >= minor);
    case image_kind::fatbin:
    case image_kind::lto_ir:
      break;
  }
  return false;
}

bool can_run_on(const image_info& image, int sm_major, int sm_minor) {
  check_capability(sm_major, sm_minor);
  return std::any_of(image.targets.begin(), image.targets.end(),
                     [&](const image_target& t) { return can_run_on(t, sm_major, sm_minor); });
}

void require_runs_on(const image_info& image, int sm_major, int sm_minor, std::string_view what) {
  if (can_run_on(image, sm_major, sm_minor)) return;
  std::string targets;
  for (const auto& t : image.targets) {
    if (!targets.empty()) targets += ", ";
    targets += t.arch_name;
    if (t.kind == image_kind::lto_ir) targets += " (LTO IR, not loadable)";
  }
  std::string msg;
  if (!what.empty()) msg.append(what).append(": ");
  msg += std::string(to_string(image.kind)) + " has code for " + (targets.empty() ? "nothing" : targets) +
         ", none of which runs on a device of sm_" + std::to_string(sm_major * 10 + sm_minor) +
         " (compute capability " + std::to_string(sm_major) + "." + std::to_string(sm_minor) + ")";
  detail::throw_errc(errc::incompatible_image, "require_runs_on", std::move(msg));
}

}  // namespace cubridge
