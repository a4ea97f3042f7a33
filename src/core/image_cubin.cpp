// The cubin (CUDA ELF) reader of inspect_image.
//
// Format facts, checked against what the CUDA 13.0 tools write (see tests/test_image.cpp):
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

#include "image_internal.hpp"

#include <algorithm>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace cubridge::image_internal {
namespace {

// Sanity cap. Every count is also bounded by the input size; this gives a clear error early.
constexpr std::uint64_t max_sections = std::uint64_t{1} << 20;
constexpr std::uint16_t em_cuda = 190;

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
    out.target.arch_name = arch_name_of(image_kind::cubin, out.target.capability());
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
    if (rd8(d_, 5) != 1)
      s_.fail("not a little-endian ELF (EI_DATA " + std::to_string(rd8(d_, 5)) + ")");
    if (rd8(d_, 6) != 1)
      s_.fail("bad ELF version " + std::to_string(rd8(d_, 6)) + " at " + s_.at(6));
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
        s_.fail("segment " + std::to_string(i) + " (offset " + std::to_string(p_offset) +
                ", size " + std::to_string(p_filesz) + ") runs past the end of the image (" +
                std::to_string(d_.size()) + " bytes)");
    }
  }

  // SHT_NULL (whose size may hold the section count) and SHT_NOBITS occupy no file bytes.
  static bool has_contents(const elf_section& sec) {
    return sec.type != sht_null && sec.type != sht_nobits;
  }

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
        for_each_record(
            sec, [&](std::uint8_t attr, std::uint8_t fmt, byte_span value, std::uint64_t) {
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
    for_each_record(sec, [&](std::uint8_t attr, std::uint8_t fmt, byte_span value,
                             std::uint64_t at) {
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
      const auto name =
          string_at(strtab, rd32(syms, off), std::string(where).append(", symbol ").append(index));
      if (name.empty())
        s_.fail(std::string(where).append(": kernel symbol ").append(index).append(" has no name"));
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

}  // namespace

parsed_code parse_cubin(const source& s, work_budget& budget) {
  return cubin_parser(s, budget).parse();
}

}  // namespace cubridge::image_internal
