// Tests of cubridge/core/image.hpp: GPU image inspection without a GPU.
//
// Fixtures are built by nvcc from tests/data/image_kernels.cu (see tests/image.cmake), whose
// kernels have known parameter lists:
//   mixed_params(float*, int, char, double, blob24)  -> 8, 4, 1, 8, 24
//   no_params()                                      -> (none)
//   aligned_params(short, blob16, uint64*)           -> 2, 16, 8
//   scale<float>(float*, float) = _Z5scaleIfEvPT_S0_ -> 8, 4
//   big_params(blob5000, int*)                       -> 5000, 8 (PTX only: a cubin omits them)
//   calls_helper(int*)                               -> 8 (helper() is a device function)
#include <cubridge/core/detail/loaded_kernels.hpp>
#include <cubridge/core/image.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

namespace {

using bytes = std::vector<std::byte>;
using sizes = std::vector<std::size_t>;
using cubridge::arch_variant;
using cubridge::image_kind;

bytes read_file(const char* path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot open fixture " << path;
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), {});
  bytes out(chars.size());
  std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

bytes from_text(std::string_view text) {
  bytes out(text.size());
  std::memcpy(out.data(), text.data(), text.size());
  return out;
}

cubridge::image_info inspect(const bytes& b) {
  return cubridge::inspect_image(b);
}
cubridge::image_info inspect(std::string_view text) {
  return cubridge::inspect_image(from_text(text));
}

// The message of the image_error that inspecting `b` raises ("" and a test failure if none).
std::string bad_image_message(const bytes& b) {
  try {
    (void)cubridge::inspect_image(b);
  } catch (const cubridge::image_error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::bad_image)) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no image_error for " << b.size() << " bytes";
  return "";
}
std::string bad_image_message(std::string_view text) {
  return bad_image_message(from_text(text));
}

// Inspects `b` and returns whether it parsed; any exception but image_error escapes and fails.
bool parses(std::span<const std::byte> b) {
  try {
    (void)cubridge::inspect_image(b);
    return true;
  } catch (const cubridge::image_error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::bad_image)) << e.what();
    return false;
  }
}

std::map<std::string, std::optional<sizes>> kernel_map(const cubridge::image_info& info) {
  std::map<std::string, std::optional<sizes>> m;
  for (const auto& k : info.kernels) {
    EXPECT_TRUE(m.emplace(k.name, k.parameter_sizes).second) << "duplicate kernel " << k.name;
  }
  return m;
}

// What a cubin of image_kernels.cu holds.
const std::map<std::string, std::optional<sizes>> cubin_kernels{
    {"mixed_params", sizes{8, 4, 1, 8, 24}},
    {"no_params", sizes{}},
    {"aligned_params", sizes{2, 16, 8}},
    {"_Z5scaleIfEvPT_S0_", sizes{8, 4}},
    {"big_params", std::nullopt},
    {"calls_helper", sizes{8}},
};
// What its PTX holds: the same, with big_params' sizes.
std::map<std::string, std::optional<sizes>> ptx_kernels() {
  auto m = cubin_kernels;
  m["big_params"] = sizes{5000, 8};
  return m;
}

void expect_target(const cubridge::image_target& t, image_kind kind, int sm, arch_variant variant,
                   const std::string& name, bool compressed, int address_bits = 64) {
  EXPECT_EQ(t.kind, kind) << name;
  EXPECT_EQ(t.sm, sm) << name;
  EXPECT_EQ(t.variant, variant) << name;
  EXPECT_EQ(t.arch_name, name);
  EXPECT_EQ(t.compressed, compressed) << name;
  EXPECT_EQ(t.address_bits, address_bits) << name;
}

void put16(bytes& b, std::size_t off, std::uint16_t v) {
  for (std::size_t i = 0; i < 2; ++i) b[off + i] = std::byte((v >> (8 * i)) & 0xff);
}
void put32(bytes& b, std::size_t off, std::uint32_t v) {
  for (std::size_t i = 0; i < 4; ++i) b[off + i] = std::byte((v >> (8 * i)) & 0xff);
}
void put64(bytes& b, std::size_t off, std::uint64_t v) {
  for (std::size_t i = 0; i < 8; ++i) b[off + i] = std::byte((v >> (8 * i)) & 0xff);
}
void append(bytes& b, const bytes& more) {
  b.insert(b.end(), more.begin(), more.end());
}

// A fatbin made by hand: entries of (kind, arch, flags, payload), headers as nvcc writes them.
struct fatbin_entry {
  std::uint16_t kind;
  std::uint32_t arch;
  std::uint64_t flags;
  bytes payload;
};
bytes make_fatbin(const std::vector<fatbin_entry>& entries) {
  bytes body;
  for (const auto& e : entries) {
    bytes header(64);
    put16(header, 0, e.kind);
    put16(header, 2, 0x0101);
    put32(header, 4, 64);
    auto payload = e.payload;
    payload.resize((payload.size() + 7) / 8 * 8);
    put64(header, 8, payload.size());
    put16(header, 24, e.kind == 1 ? 0 : 8);  // minor: PTX 9.0 / ELF ABI 1.8
    put16(header, 26, e.kind == 1 ? 9 : 1);
    put32(header, 28, e.arch);
    put64(header, 40, e.flags);
    append(body, header);
    append(body, payload);
  }
  bytes out(16);
  put32(out, 0, 0xBA55ED50u);
  put16(out, 4, 1);
  put16(out, 6, 16);
  put64(out, 8, body.size());
  append(out, body);
  return out;
}

// A cubin made by hand: an ELF64 EM_CUDA header, the given sections (after a null one) and a
// section name table, for inputs nvcc would never write.
struct elf_section {
  std::string name;
  std::uint32_t type;
  bytes data;
  std::uint32_t link = 0;
  std::uint64_t entsize = 0;
};
bytes make_cubin(std::vector<elf_section> sections, std::uint32_t flags = 0x06005a04) {
  bytes names(1);
  std::vector<std::uint32_t> name_offsets;
  sections.push_back({".shstrtab", 3, {}});
  for (auto& s : sections) {
    name_offsets.push_back(static_cast<std::uint32_t>(names.size()));
    append(names, from_text(s.name));
    names.push_back(std::byte{0});
  }
  sections.back().data = names;
  bytes out(64);
  std::vector<std::uint64_t> offsets;
  for (const auto& s : sections) {
    offsets.push_back(out.size());
    append(out, s.data);
    out.resize((out.size() + 7) / 8 * 8);
  }
  const auto shoff = out.size();
  out.resize(shoff + 64 * (sections.size() + 1));
  for (std::size_t i = 0; i < sections.size(); ++i) {
    const auto h = shoff + 64 * (i + 1);
    put32(out, h, name_offsets[i]);
    put32(out, h + 4, sections[i].type);
    put64(out, h + 24, offsets[i]);
    put64(out, h + 32, sections[i].data.size());
    put32(out, h + 40, sections[i].link);
    put64(out, h + 56, sections[i].entsize);
  }
  const std::uint8_t ident[] = {0x7f, 'E', 'L', 'F', 2, 1, 1, 0x41, 8};
  std::memcpy(out.data(), ident, sizeof ident);
  put16(out, 16, 2);    // ET_EXEC
  put16(out, 18, 190);  // EM_CUDA
  put32(out, 20, 1);
  put64(out, 40, shoff);
  put32(out, 48, flags);
  put16(out, 52, 64);
  put16(out, 58, 64);
  put16(out, 60, static_cast<std::uint16_t>(sections.size() + 1));
  put16(out, 62, static_cast<std::uint16_t>(sections.size()));
  return out;
}

// A symbol table entry.
bytes symbol(std::uint32_t name, std::uint8_t info, std::uint8_t other) {
  bytes s(24);
  put32(s, 0, name);
  s[4] = std::byte{info};
  s[5] = std::byte{other};
  return s;
}
constexpr std::uint8_t global_func = 0x12;  // STB_GLOBAL, STT_FUNC
constexpr std::uint8_t cuda_entry = 0x10;   // STO_CUDA_ENTRY

// A cubin with one kernel "k" whose .nv.info.k holds `records`.
bytes cubin_with_info(const bytes& records) {
  bytes strtab = from_text(std::string("\0k\0", 3));
  bytes symtab(24);
  append(symtab, symbol(1, global_func, cuda_entry));
  return make_cubin(
      {{".strtab", 3, strtab}, {".symtab", 2, symtab, 1, 24}, {".nv.info.k", 0x70000000, records}});
}
bytes kparam(std::uint16_t ordinal, std::uint16_t offset, std::uint32_t size) {
  bytes r{std::byte{4}, std::byte{0x17}, std::byte{12}, std::byte{0}};
  bytes v(12);
  put16(v, 4, ordinal);
  put16(v, 6, offset);
  put32(v, 8, (size << 18) | 0x1f000);
  append(r, v);
  return r;
}
bytes param_size_record(std::uint16_t total) {
  bytes r{std::byte{3}, std::byte{0x19}, std::byte{0}, std::byte{0}};
  put16(r, 2, total);
  return r;
}

// --------------------------------------------------------------------------------------------

struct cubin_case {
  const char* path;
  int sm;
  arch_variant variant;
  const char* name;
};

void PrintTo(const cubin_case& c, std::ostream* os) {
  *os << c.name;
}

class ImageCubinFixture : public ::testing::TestWithParam<cubin_case> {};

TEST_P(ImageCubinFixture, ReportsItsArchitectureAndKernels) {
  const auto& c = GetParam();
  const auto info = inspect(read_file(c.path));
  EXPECT_EQ(info.kind, image_kind::cubin);
  ASSERT_EQ(info.targets.size(), 1u);
  expect_target(info.targets[0], image_kind::cubin, c.sm, c.variant, c.name, false);
  EXPECT_FALSE(info.targets[0].ptx_version.has_value());
  EXPECT_TRUE(info.kernels_complete);
  EXPECT_EQ(kernel_map(info), cubin_kernels);
}

INSTANTIATE_TEST_SUITE_P(
    Architectures, ImageCubinFixture,
    ::testing::Values(
        cubin_case{CUBRIDGE_IMAGE_CUBIN_SM_80, 80, arch_variant::generic, "sm_80"},
        cubin_case{CUBRIDGE_IMAGE_CUBIN_SM_90, 90, arch_variant::generic, "sm_90"},
        cubin_case{CUBRIDGE_IMAGE_CUBIN_SM_90A, 90, arch_variant::arch_specific, "sm_90a"},
        cubin_case{CUBRIDGE_IMAGE_CUBIN_SM_100, 100, arch_variant::generic, "sm_100"},
        cubin_case{CUBRIDGE_IMAGE_CUBIN_SM_100A, 100, arch_variant::arch_specific, "sm_100a"},
        cubin_case{CUBRIDGE_IMAGE_CUBIN_SM_100F, 100, arch_variant::family_specific, "sm_100f"},
        cubin_case{CUBRIDGE_IMAGE_CUBIN_SM_120, 120, arch_variant::generic, "sm_120"},
        cubin_case{CUBRIDGE_IMAGE_CUBIN_RDC, 90, arch_variant::generic, "sm_90"}),
    [](const auto& info) {
      std::string n = std::filesystem::path(info.param.path).stem().string();
      std::replace_if(
          n.begin(), n.end(), [](char c) { return !std::isalnum(static_cast<unsigned char>(c)); },
          '_');
      return n;
    });

TEST(ImageCubin, DeviceFunctionsAreNotKernels) {
  // With -rdc, helper() is a global STT_FUNC with its own .nv.info section; only
  // STO_CUDA_ENTRY makes a kernel.
  const auto info = inspect(read_file(CUBRIDGE_IMAGE_CUBIN_RDC));
  EXPECT_EQ(info.find_kernel("_Z6helperi"), nullptr);
  ASSERT_NE(info.find_kernel("calls_helper"), nullptr);
  EXPECT_EQ(info.find_kernel("calls_helper")->parameter_sizes, sizes{8});
}

TEST(ImageCubin, OldElfAbiLayoutKeepsTheSmInTheLowByte) {
  // Before CUDA 12.8/13 (EI_ABIVERSION 7) e_flags held the SM in bits 0..7, 0x400 for 64-bit
  // addresses, 0x800 for "a" and the virtual SM in bits 16..23 (as the sm_70 cubins in cuDNN 9
  // still are). Rewrite a CUDA 13 header that way.
  auto b = read_file(CUBRIDGE_IMAGE_CUBIN_SM_80);
  b[7] = std::byte{0x33};
  b[8] = std::byte{7};
  put32(b, 48, 0x00500550);
  auto info = inspect(b);
  expect_target(info.targets[0], image_kind::cubin, 80, arch_variant::generic, "sm_80", false);
  EXPECT_EQ(kernel_map(info), cubin_kernels);

  put32(b, 48, 0x005a0d5a);  // sm_90 with the old "a" bit
  info = inspect(b);
  expect_target(info.targets[0], image_kind::cubin, 90, arch_variant::arch_specific, "sm_90a",
                false);

  // The CUDA 13 layout reads the SM from bits 8..15 instead.
  b[8] = std::byte{8};
  put32(b, 48, 0x06007802);
  info = inspect(b);
  EXPECT_EQ(info.targets[0].sm, 120);
}

TEST(ImageCubin, KernelParameterRecords) {
  // Records in any order; sizes come out by ordinal.
  bytes records;
  append(records, kparam(1, 8, 4));
  append(records, kparam(0, 0, 8));
  append(records, param_size_record(12));
  auto info = inspect(cubin_with_info(records));
  ASSERT_EQ(info.kernels.size(), 1u);
  EXPECT_EQ(info.kernels[0].name, "k");
  EXPECT_EQ(info.kernels[0].parameter_sizes, (sizes{8, 4}));

  // A parameter bank but no per-parameter records: unknown, not "no parameters".
  info = inspect(cubin_with_info(param_size_record(5008)));
  EXPECT_EQ(info.kernels[0].parameter_sizes, std::nullopt);
  info = inspect(cubin_with_info({}));
  EXPECT_EQ(info.kernels[0].parameter_sizes, sizes{});

  // Duplicate and missing ordinals, a parameter outside the bank.
  records = kparam(0, 0, 8);
  append(records, kparam(0, 8, 4));
  EXPECT_NE(bad_image_message(cubin_with_info(records)).find("ordinal 0 where 1 was expected"),
            std::string::npos);
  records = kparam(1, 0, 8);
  EXPECT_NE(bad_image_message(cubin_with_info(records)).find("ordinal 1 where 0 was expected"),
            std::string::npos);
  records = kparam(0, 8, 8);
  append(records, param_size_record(12));
  EXPECT_NE(bad_image_message(cubin_with_info(records)).find("outside the 12-byte parameter bank"),
            std::string::npos);
}

TEST(ImageCubin, MalformedRecordsAreReported) {
  const auto unknown_format = bad_image_message(
      cubin_with_info({std::byte{9}, std::byte{0x17}, std::byte{0}, std::byte{0}}));
  EXPECT_NE(unknown_format.find(".nv.info.k"), std::string::npos) << unknown_format;
  EXPECT_NE(unknown_format.find("unknown format 0x9"), std::string::npos) << unknown_format;
  const auto overlong = bad_image_message(
      cubin_with_info({std::byte{4}, std::byte{0x17}, std::byte{200}, std::byte{0}}));
  EXPECT_NE(overlong.find("claims 200 bytes"), std::string::npos) << overlong;
  const auto truncated = bad_image_message(cubin_with_info({std::byte{4}, std::byte{0x17}}));
  EXPECT_NE(truncated.find("truncated"), std::string::npos) << truncated;
  const auto short_kparam =
      bad_image_message(cubin_with_info({std::byte{4}, std::byte{0x17}, std::byte{4}, std::byte{0},
                                         std::byte{0}, std::byte{0}, std::byte{0}, std::byte{0}}));
  EXPECT_NE(short_kparam.find("KPARAM_INFO record"), std::string::npos) << short_kparam;
}

TEST(ImageCubin, HeaderErrorsSayWhatIsWrong) {
  auto b = read_file(CUBRIDGE_IMAGE_CUBIN_SM_90);
  auto x86 = b;
  put16(x86, 18, 62);
  EXPECT_NE(bad_image_message(x86).find("not a CUDA cubin"), std::string::npos);
  auto elf32 = b;
  elf32[4] = std::byte{1};
  EXPECT_NE(bad_image_message(elf32).find("32-bit"), std::string::npos);
  auto big_endian = b;
  big_endian[5] = std::byte{2};
  EXPECT_NE(bad_image_message(big_endian).find("little-endian"), std::string::npos);
  auto no_sm = b;
  put32(no_sm, 48, 0x06000004);
  EXPECT_NE(bad_image_message(no_sm).find("no SM architecture"), std::string::npos);
  auto far_sections = b;
  put64(far_sections, 40, b.size() - 10);
  EXPECT_NE(bad_image_message(far_sections).find("section header table"), std::string::npos);
  auto no_sections = b;
  put64(no_sections, 40, 0);
  EXPECT_NE(bad_image_message(no_sections).find("e_shoff is 0"), std::string::npos);
}

TEST(ImageCubin, AHostExecutableIsNotACubin) {
  // The test program itself: an x86-64 (or other host) ELF.
  const auto self = read_file("/proc/self/exe");
  if (self.size() < 64) GTEST_SKIP() << "/proc/self/exe is not readable";
  EXPECT_NE(bad_image_message(self).find("not a CUDA cubin"), std::string::npos);
}

TEST(ImageCubin, OverlappingSymbolNamesCannotMakeTheParseQuadratic) {
  // 200,000 entry symbols naming successive suffixes of one 1 MiB string: naively ~10^11 bytes
  // of name scanning. The work budget turns that into an error.
  std::string long_name(1 << 20, 'k');
  bytes strtab = from_text(std::string(1, '\0') + long_name + std::string(1, '\0'));
  bytes symtab(24);
  for (std::uint32_t i = 0; i < 200000; ++i) append(symtab, symbol(1 + i, global_func, cuda_entry));
  const auto image = make_cubin({{".strtab", 3, strtab}, {".symtab", 2, symtab, 1, 24}});
  const auto start = std::chrono::steady_clock::now();
  const auto message = bad_image_message(image);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_NE(message.find("more work to parse than its size justifies"), std::string::npos)
      << message;
}

// --------------------------------------------------------------------------------------------

TEST(ImagePtx, GeneratedPtx) {
  auto info = inspect(read_file(CUBRIDGE_IMAGE_PTX_COMPUTE_90));
  EXPECT_EQ(info.kind, image_kind::ptx);
  ASSERT_EQ(info.targets.size(), 1u);
  expect_target(info.targets[0], image_kind::ptx, 90, arch_variant::generic, "compute_90", false);
  ASSERT_TRUE(info.targets[0].ptx_version.has_value());
  EXPECT_GE(*info.targets[0].ptx_version, (cubridge::ptx_isa_version{8, 0}));  // CUDA 13.0: 9.0
  EXPECT_EQ(kernel_map(info), ptx_kernels());

  info = inspect(read_file(CUBRIDGE_IMAGE_PTX_COMPUTE_90A));
  expect_target(info.targets[0], image_kind::ptx, 90, arch_variant::arch_specific, "compute_90a",
                false);
}

TEST(ImagePtx, HandWrittenPtx) {
  const std::string text = R"(
// leading comment
/* block
   comment */
.version 8.5
.target sm_100f, debug
// no .address_size: 32 bits

.file 1 "/weird { path }.cu"
.extern .entry declared_elsewhere (.param .u32 x);
.visible .func (.param .b32 r) f(.param .b32 a) { ret; }
.visible .entry plain
{
  { { ret; } }
}
.weak .entry with_params (
    .param .u64 .ptr .global .align 8 p,   // a pointer
    .param .b32 arr[4],
    .param .align 16 .b8 vec[16],
    .param .f16 h, .param .s8 c
)
.maxntid 128, 1, 1
.pragma "nounroll; }";
{
  // } a brace in a comment
  ret;
}
.entry opaque (.param .texref t, .param .u32 n) { ret; }
.entry empty_list () { ret; }
)";
  auto with_nul = from_text(text);
  with_nul.push_back(std::byte{0});
  with_nul.push_back(std::byte{0xff});  // bytes after the NUL are not PTX
  const auto info = inspect(with_nul);
  expect_target(info.targets[0], image_kind::ptx, 100, arch_variant::family_specific,
                "compute_100f", false, 32);
  EXPECT_EQ(info.targets[0].ptx_version, (cubridge::ptx_isa_version{8, 5}));
  const std::map<std::string, std::optional<sizes>> expected{
      {"plain", sizes{}},
      {"with_params", sizes{8, 16, 16, 2, 1}},
      {"opaque", std::nullopt},
      {"empty_list", sizes{}},
  };
  EXPECT_EQ(kernel_map(info), expected);
  ASSERT_EQ(info.kernels.size(), 4u);
  EXPECT_EQ(info.kernels[0].name, "plain");  // file order
}

TEST(ImagePtx, ErrorsSayWhatIsWrongAndWhere) {
  const std::string head = ".version 9.0\n.target sm_90\n.address_size 64\n";
  struct bad_case {
    std::string text;
    std::string expected;
  };
  const std::vector<bad_case> cases{
      {".version 9.0\n.entry k() { ret; }\n", "no .target directive"},
      {".version nine\n.target sm_90\n", "bad .version 'nine'"},
      {".version 9.0\n.target sm_9x\n", "bad architecture 'sm_9x'"},
      {".version 9.0\n.target texmode_independent\n", "names no sm_ architecture"},
      {".version 9.0\n.target sm_90\n.target sm_80\n", "second .target"},
      {head + ".address_size 48\n", ".address_size must be 32 or 64"},
      {head + ".entry k(.param .u32 a) { ret;\n", "is never closed"},
      {head + ".entry k(.param .u32 a\n", "parameter list of .entry 'k'"},
      {head + ".entry k(.param .u32 a) {\n}}\n", "unbalanced '}' at offset 71"},
      {head + ".entry k(.param .u32 a)\n", ".entry 'k' at offset 44 has no body"},
      {head + "/* never closed\n", "unterminated /* comment"},
      {head + ".file 1 \"abc\n", "unterminated string"},
      {head + ".entry k() { ret; }\n\x01", "byte 0x1 at offset 64"},
      {head + ".entry k() { ret; }\n\xc3\xa9", "byte 0xc3"},
      {head + ".entry (.param .u32 a) { ret; }", ".entry without a name"},
  };
  for (const auto& c : cases) {
    const auto message = bad_image_message(c.text);
    EXPECT_NE(message.find(c.expected), std::string::npos) << "for:\n"
                                                           << c.text << "\ngot: " << message;
    EXPECT_NE(message.find("PTX"), std::string::npos) << message;
  }
}

TEST(ImagePtx, MegabytesOfPtxParseInLinearTime) {
  std::string text = ".version 9.0\n.target sm_90\n.address_size 64\n";
  constexpr int count = 40000;
  for (int i = 0; i < count; ++i) {
    text += ".visible .entry kernel_" + std::to_string(i) +
            "(\n\t.param .u64 a,\n\t.param .align 8 .b8 b[24]\n)\n{\n\t.reg .b32 %r<4>;\n"
            "\tld.param.u64 %rd1, [a];\n\tadd.s32 %r1, %r2, %r3; // comment\n\tret;\n}\n";
  }
  ASSERT_GT(text.size(), 5u << 20);
  const auto start = std::chrono::steady_clock::now();
  const auto info = inspect(text);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  ASSERT_EQ(info.kernels.size(), static_cast<std::size_t>(count));
  EXPECT_EQ(info.kernels.back().name, "kernel_39999");
  EXPECT_EQ(info.kernels.back().parameter_sizes, (sizes{8, 24}));
}

// --------------------------------------------------------------------------------------------

TEST(ImageFatbin, MultiArchitecture) {
  const auto info = inspect(read_file(CUBRIDGE_IMAGE_FATBIN_MULTI));
  EXPECT_EQ(info.kind, image_kind::fatbin);
  ASSERT_EQ(info.targets.size(), 4u);
  expect_target(info.targets[0], image_kind::cubin, 80, arch_variant::generic, "sm_80", false);
  expect_target(info.targets[1], image_kind::cubin, 90, arch_variant::arch_specific, "sm_90a",
                false);
  expect_target(info.targets[2], image_kind::cubin, 100, arch_variant::family_specific, "sm_100f",
                false);
  expect_target(info.targets[3], image_kind::ptx, 90, arch_variant::generic, "compute_90", false);
  EXPECT_TRUE(info.targets[3].ptx_version.has_value());
  EXPECT_TRUE(info.kernels_complete);
  // The union over entries: big_params' sizes come from the PTX entry.
  EXPECT_EQ(kernel_map(info), ptx_kernels());
}

TEST(ImageFatbin, ZstdEntriesAreDecompressed) {
  // CUDA 13 nvcc compresses PTX with zstd by default; the cubin stays uncompressed.
  const auto info = inspect(read_file(CUBRIDGE_IMAGE_FATBIN_ZSTD));
  ASSERT_EQ(info.targets.size(), 2u);
  expect_target(info.targets[0], image_kind::cubin, 80, arch_variant::generic, "sm_80", false);
  expect_target(info.targets[1], image_kind::ptx, 80, arch_variant::generic, "compute_80", true);
  EXPECT_TRUE(info.kernels_complete);
  // big_params' sizes come from the (zstd) PTX entry.
  EXPECT_EQ(kernel_map(info), ptx_kernels());
}

// Every --compress-mode gives the same targets, kernels and parameter sizes; `size` stores the
// cubin zstd-compressed too (issue 12: its kernels were not seen at all).
TEST(ImageFatbin, EveryCompressModeListsTheSameKernels) {
  struct mode {
    const char* name;
    const char* path;
    bool cubin_compressed;
    bool ptx_compressed;
  };
  const mode modes[] = {{"size", CUBRIDGE_IMAGE_FATBIN_MODE_SIZE, true, true},
                        {"speed", CUBRIDGE_IMAGE_FATBIN_MODE_SPEED, false, true},
                        {"default", CUBRIDGE_IMAGE_FATBIN_MODE_DEFAULT, false, true},
                        {"none", CUBRIDGE_IMAGE_FATBIN_MODE_NONE, false, false}};
  for (const auto& m : modes) {
    SCOPED_TRACE(std::string("--compress-mode=") + m.name);
    const auto info = inspect(read_file(m.path));
    EXPECT_EQ(info.kind, image_kind::fatbin);
    ASSERT_EQ(info.targets.size(), 2u);
    expect_target(info.targets[0], image_kind::cubin, 90, arch_variant::generic, "sm_90",
                  m.cubin_compressed);
    expect_target(info.targets[1], image_kind::ptx, 90, arch_variant::generic, "compute_90",
                  m.ptx_compressed);
    EXPECT_TRUE(info.kernels_complete);
    EXPECT_EQ(kernel_map(info), ptx_kernels());
    // Each entry names its own kernels: all six, in both.
    for (const auto& t : info.targets) {
      const std::set<std::string> names(t.kernel_names.begin(), t.kernel_names.end());
      EXPECT_EQ(names.size(), 6u) << t.arch_name;
      for (const auto& [name, unused] : ptx_kernels()) EXPECT_TRUE(names.contains(name)) << name;
    }
  }
}

TEST(ImageFatbin, Lz4EntriesAreDecompressed) {
  const auto info = inspect(read_file(CUBRIDGE_IMAGE_FATBIN_LZ4));
  ASSERT_EQ(info.targets.size(), 2u);
  expect_target(info.targets[0], image_kind::cubin, 86, arch_variant::generic, "sm_86", true);
  expect_target(info.targets[1], image_kind::ptx, 86, arch_variant::generic, "compute_86", true);
  EXPECT_TRUE(info.kernels_complete);
  EXPECT_EQ(kernel_map(info), ptx_kernels());
}

TEST(ImageFatbin, LtoIrEntries) {
  const auto info = inspect(read_file(CUBRIDGE_IMAGE_FATBIN_LTO));
  ASSERT_EQ(info.targets.size(), 2u);
  EXPECT_EQ(info.targets[0].kind, image_kind::lto_ir);
  EXPECT_EQ(info.targets[0].arch_name, "lto_90");
  EXPECT_FALSE(cubridge::can_run_on(info.targets[0], {9, 0}));
  expect_target(info.targets[1], image_kind::cubin, 80, arch_variant::generic, "sm_80", false);
  EXPECT_TRUE(info.kernels_complete);
  EXPECT_FALSE(cubridge::can_run_on(info, {9, 0}));
  EXPECT_TRUE(cubridge::can_run_on(info, {8, 6}));
}

TEST(ImageFatbin, HandMadeEntries) {
  const auto cubin = read_file(CUBRIDGE_IMAGE_CUBIN_SM_80);
  const std::string ptx =
      ".version 9.0\n.target sm_90\n.address_size 64\n"
      ".entry mixed_params(.param .u64 a) { ret; }\n";
  // Consistent entries, plus one of a kind this parser does not know, which is skipped.
  auto info = inspect(make_fatbin({{2, 80, 0x11, cubin}, {0x40, 90, 0x11, from_text("?")}}));
  ASSERT_EQ(info.targets.size(), 1u);
  EXPECT_EQ(info.targets[0].arch_name, "sm_80");
  // Trailing bytes after the container are not part of it.
  auto padded = make_fatbin({{2, 80, 0x11, cubin}});
  padded.resize(padded.size() + 100, std::byte{0xee});
  EXPECT_EQ(kernel_map(inspect(padded)), cubin_kernels);

  // Entries that disagree on a kernel's parameters.
  auto message =
      bad_image_message(make_fatbin({{2, 80, 0x11, cubin}, {1, 90, 0x11, from_text(ptx)}}));
  EXPECT_NE(message.find("fatbin entry 1 (compute_90"), std::string::npos) << message;
  EXPECT_NE(message.find("kernel 'mixed_params' has parameter sizes [8] here but [8, 4, 1, 8, 24]"),
            std::string::npos)
      << message;
  // A header that names another architecture than its payload.
  message = bad_image_message(make_fatbin({{2, 90, 0x11, cubin}}));
  EXPECT_NE(message.find("the entry header says sm_90 but its cubin is sm_80"), std::string::npos)
      << message;
  message = bad_image_message(make_fatbin({{1, 80, 0x11, from_text(ptx)}}));
  EXPECT_NE(message.find("says compute_80 but its PTX targets sm_90"), std::string::npos)
      << message;
  // A broken payload is reported with the entry.
  auto broken = cubin;
  put32(broken, 48, 0x06000002);
  message = bad_image_message(make_fatbin({{1, 90, 0x11, from_text(ptx)}, {2, 80, 0x11, broken}}));
  EXPECT_NE(message.find("fatbin entry 1 (sm_80, offset"), std::string::npos) << message;
  // Nothing inside.
  message = bad_image_message(make_fatbin({}));
  EXPECT_NE(message.find("no cubin, PTX or LTO IR entries"), std::string::npos) << message;
  message = bad_image_message(make_fatbin({{2, 3, 0x11, cubin}}));
  EXPECT_NE(message.find("architecture 3 is not a valid SM number"), std::string::npos) << message;
  message = bad_image_message(make_fatbin({{2, 80, 0xa011, cubin}}));
  EXPECT_NE(message.find("both LZ4 and zstd"), std::string::npos) << message;
}

TEST(ImageFatbin, HeaderErrors) {
  auto b = read_file(CUBRIDGE_IMAGE_FATBIN_MULTI);
  auto v2 = b;
  put16(v2, 4, 2);
  EXPECT_NE(bad_image_message(v2).find("version 2 is not supported"), std::string::npos);
  auto too_long = b;
  put64(too_long, 8, b.size());
  EXPECT_NE(bad_image_message(too_long).find("truncated?"), std::string::npos);
  auto bad_entry = b;
  put64(bad_entry, 16 + 8, std::uint64_t{1} << 62);  // first entry's payload size
  EXPECT_NE(bad_image_message(bad_entry).find("fatbin entry 0 (offset 16): payload of"),
            std::string::npos);
  auto small_header = b;
  put32(small_header, 16 + 4, 8);
  EXPECT_NE(bad_image_message(small_header).find("entry header size 8 is invalid"),
            std::string::npos);
}

std::uint64_t get64(const bytes& b, std::size_t off) {
  std::uint64_t v = 0;
  for (std::size_t i = 8; i-- > 0;) v = v << 8 | std::to_integer<std::uint64_t>(b[off + i]);
  return v;
}

TEST(ImageFatbin, CorruptLz4IsReported) {
  const auto good = read_file(CUBRIDGE_IMAGE_FATBIN_LZ4);
  const std::size_t entry = 16;  // the first entry's header
  const std::uint64_t declared = get64(good, entry + 56);
  auto b = good;
  put64(b, entry + 56, declared + 1);
  auto message = bad_image_message(b);
  EXPECT_NE(message.find("fatbin entry 0 (sm_86, offset 16): LZ4 data expands to " +
                         std::to_string(declared) + " bytes, not the declared " +
                         std::to_string(declared + 1)),
            std::string::npos)
      << message;
  b = good;
  put64(b, entry + 56, declared - 1);
  EXPECT_NE(bad_image_message(b).find("expands past the declared"), std::string::npos);
  b = good;
  put64(b, entry + 56, std::uint64_t{1} << 40);
  EXPECT_NE(bad_image_message(b).find("is impossible for"), std::string::npos);
  b = good;
  put32(b, entry + 16, 0);
  EXPECT_NE(bad_image_message(b).find("compressed size 0 does not fit"), std::string::npos);
  // A match reaching back before the start of the output: the first token with a match.
  b = good;
  b[entry + 64] = std::byte{0x00};  // no literals, then a match offset
  put16(b, entry + 65, 0x4000);
  message = bad_image_message(b);
  EXPECT_NE(message.find("LZ4 data is malformed"), std::string::npos) << message;
}

TEST(ImageFatbin, CorruptZstdIsReported) {
  const auto good = read_file(CUBRIDGE_IMAGE_FATBIN_MODE_SIZE);
  const std::size_t entry = 16;  // the first entry: the zstd-compressed sm_90 cubin
  ASSERT_EQ(get64(good, entry + 40) & 0x8000, 0x8000u);
  const std::uint64_t declared = get64(good, entry + 56);
  const std::uint32_t header = static_cast<std::uint32_t>(get64(good, entry + 4) & 0xffffffffu);
  const std::uint32_t compressed =
      static_cast<std::uint32_t>(get64(good, entry + 16) & 0xffffffffu);
  auto b = good;
  put64(b, entry + 56, declared + 1);
  auto message = bad_image_message(b);
  EXPECT_NE(message.find("fatbin entry 0 (sm_90, offset 16): zstd frame declares " +
                         std::to_string(declared) + " bytes of content, not the entry's " +
                         std::to_string(declared + 1)),
            std::string::npos)
      << message;
  b = good;
  put64(b, entry + 56, std::uint64_t{1} << 40);
  EXPECT_NE(bad_image_message(b).find("is impossible for"), std::string::npos);
  b = good;
  put32(b, entry + 16, compressed - 1);  // the frame's last byte cut off
  message = bad_image_message(b);
  EXPECT_NE(message.find("zstd frame is truncated or malformed"), std::string::npos) << message;
  b = good;
  b[entry + header] = std::byte{0};  // the frame's magic number
  message = bad_image_message(b);
  EXPECT_NE(message.find("is not a zstd frame"), std::string::npos) << message;
  // Every byte of the compressed data damaged in turn: an image_error or a result, nothing else.
  for (std::uint32_t i = 0; i < compressed; ++i) {
    b = good;
    b[entry + header + i] ^= std::byte{0x5a};
    (void)parses(b);
  }

  // A frame that does not declare its content size (header byte 0: no size, a window byte),
  // one raw last block of the cubin's bytes.
  const auto cubin = read_file(CUBRIDGE_IMAGE_CUBIN_SM_80);
  bytes frame{std::byte{0x28}, std::byte{0xb5}, std::byte{0x2f},
              std::byte{0xfd}, std::byte{0x00}, std::byte{0x70}};
  const std::uint32_t block = 1u | static_cast<std::uint32_t>(cubin.size()) << 3;  // last, raw
  for (int i = 0; i < 3; ++i) frame.push_back(std::byte((block >> (8 * i)) & 0xff));
  append(frame, cubin);
  auto unknown = make_fatbin({{2, 80, 0x8011, frame}});
  put32(unknown, entry + 16, static_cast<std::uint32_t>(frame.size()));
  put64(unknown, entry + 56, cubin.size());
  message = bad_image_message(unknown);
  EXPECT_NE(message.find("zstd frame does not declare its content size"), std::string::npos)
      << message;
  // The same frame with its content size declared (header byte 0x80: 4-byte size) is read.
  bytes sized{std::byte{0x28}, std::byte{0xb5}, std::byte{0x2f},
              std::byte{0xfd}, std::byte{0x80}, std::byte{0x70}};
  for (int i = 0; i < 4; ++i) sized.push_back(std::byte((cubin.size() >> (8 * i)) & 0xff));
  sized.insert(sized.end(), frame.begin() + 6, frame.end());
  auto known = make_fatbin({{2, 80, 0x8011, sized}});
  put32(known, entry + 16, static_cast<std::uint32_t>(sized.size()));
  put64(known, entry + 56, cubin.size());
  EXPECT_EQ(kernel_map(inspect(known)), cubin_kernels);
  // Two frames where one is declared: the second is not part of the entry.
  auto twice = sized;
  append(twice, sized);
  auto two = make_fatbin({{2, 80, 0x8011, twice}});
  put32(two, entry + 16, static_cast<std::uint32_t>(twice.size()));
  put64(two, entry + 56, cubin.size());
  message = bad_image_message(two);
  EXPECT_NE(message.find("zstd frame ends after " + std::to_string(sized.size())),
            std::string::npos)
      << message;
}

// The check module::load and library::load make against the driver's kernel list.
TEST(ImageLoadedKernels, EveryRunnableEntryDecidesWhatTheDriverMustHave) {
  using cubridge::detail::kernels_every_entry_defines;
  const auto multi = inspect(read_file(CUBRIDGE_IMAGE_FATBIN_MULTI));
  const std::set<std::string> all{"mixed_params",       "no_params",  "aligned_params",
                                  "_Z5scaleIfEvPT_S0_", "big_params", "calls_helper"};
  auto as_set = [](const std::vector<std::string>& v) {
    return std::set<std::string>(v.begin(), v.end());
  };
  // sm_90a cubin and compute_90:
  EXPECT_EQ(as_set(kernels_every_entry_defines(multi, {9, 0})), all);
  EXPECT_EQ(as_set(kernels_every_entry_defines(multi, {8, 0})), all);  // sm_80 cubin only
  EXPECT_TRUE(kernels_every_entry_defines(multi, {7, 5}).empty());     // nothing runs there
  EXPECT_EQ(as_set(kernels_every_entry_defines(inspect(read_file(CUBRIDGE_IMAGE_FATBIN_MODE_SIZE)),
                                               {9, 0})),
            all);
  // Entries that differ: only what both define is required, whichever the driver picks.
  const std::string ptx =
      ".version 9.0\n.target sm_80\n.address_size 64\n"
      ".entry no_params { ret; }\n.entry only_in_ptx { ret; }\n";
  const auto cubin = read_file(CUBRIDGE_IMAGE_CUBIN_SM_80);
  const auto mixed = inspect(make_fatbin({{2, 80, 0x11, cubin}, {1, 80, 0x11, from_text(ptx)}}));
  EXPECT_EQ(kernels_every_entry_defines(mixed, {8, 0}), std::vector<std::string>{"no_params"});
  // compute_80 PTX alone runs on sm_90: then it decides.
  EXPECT_EQ(as_set(kernels_every_entry_defines(mixed, {9, 0})),
            (std::set<std::string>{"no_params", "only_in_ptx"}));
  EXPECT_THROW((void)kernels_every_entry_defines(mixed, {0, 0}), cubridge::error);
}

TEST(ImageLoadedKernels, AKernelTheDriverLacksIsNamed) {
  using cubridge::detail::require_loaded_kernels;
  const std::vector<std::string> expected{"a", "b", "c"};
  EXPECT_NO_THROW(
      require_loaded_kernels(expected, {"c", "b", "a"}, "cuModuleEnumerateFunctions", "m"));
  // The driver may list more (entries the reader skips).
  EXPECT_NO_THROW(require_loaded_kernels(expected, {"a", "b", "c", "extra"},
                                         "cuModuleEnumerateFunctions", "m"));
  EXPECT_NO_THROW(require_loaded_kernels({}, {}, "cuModuleEnumerateFunctions", "m"));
  try {
    require_loaded_kernels(expected, {"b"}, "cuLibraryEnumerateKernels", "library 'filters'");
    ADD_FAILURE() << "no error";
  } catch (const cubridge::image_error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::bad_image));
    EXPECT_EQ(e.call(), "cuLibraryEnumerateKernels");
    const std::string message = e.what();
    EXPECT_NE(
        message.find("library 'filters': the image defines kernels 'a', 'c' that the driver's "
                     "list of the loaded code lacks (it lists 1 kernels)"),
        std::string::npos)
        << message;
  }
}

// --------------------------------------------------------------------------------------------
// Robustness: nothing but image_error, whatever the bytes.

std::vector<const char*> all_fixtures() {
  return {CUBRIDGE_IMAGE_CUBIN_SM_80,      CUBRIDGE_IMAGE_CUBIN_SM_100F,
          CUBRIDGE_IMAGE_FATBIN_MULTI,     CUBRIDGE_IMAGE_FATBIN_ZSTD,
          CUBRIDGE_IMAGE_FATBIN_LZ4,       CUBRIDGE_IMAGE_FATBIN_LTO,
          CUBRIDGE_IMAGE_FATBIN_MODE_SIZE, CUBRIDGE_IMAGE_PTX_COMPUTE_90};
}

TEST(ImageRobustness, EmptyInput) {
  EXPECT_NE(bad_image_message(bytes{}).find("empty input"), std::string::npos);
}

TEST(ImageRobustness, UnknownBytesNameTheirFirstBytes) {
  const auto message =
      bad_image_message(bytes{std::byte{0xde}, std::byte{0xad}, std::byte{0xbe}, std::byte{0xef}});
  EXPECT_NE(message.find("not a cubin, fatbin or PTX image"), std::string::npos) << message;
  EXPECT_NE(message.find("first bytes: de ad be ef"), std::string::npos) << message;
  EXPECT_NE(bad_image_message("   // just a comment\n").find("not a cubin, fatbin or PTX"),
            std::string::npos);
  EXPECT_NE(bad_image_message(".versionX 9.0").find("not a cubin, fatbin or PTX"),
            std::string::npos);
}

TEST(ImageRobustness, EveryTruncationOfABinaryImageIsAnError) {
  for (const char* path : all_fixtures()) {
    const auto full = read_file(path);
    if (inspect(full).kind == image_kind::ptx) continue;  // see the PTX test below
    // Every length up to 1 KiB (headers), then every 7th (a prime: all alignments), and the
    // last 64 lengths (the section or entry that ends the image).
    for (std::size_t n = 0; n < full.size(); n += n < 1024 || n + 64 >= full.size() ? 1U : 7U)
      ASSERT_FALSE(parses(std::span(full).first(n)))
          << path << " truncated to " << n << " bytes parsed";
  }
}

TEST(ImageRobustness, TruncatedPtxIsAnErrorOrASmallerModule) {
  const auto full = read_file(CUBRIDGE_IMAGE_PTX_COMPUTE_90);
  const auto all = kernel_map(inspect(full));
  std::size_t parsed = 0;
  for (std::size_t n = 0; n < full.size(); ++n) {
    try {
      const auto info = cubridge::inspect_image(std::span(full).first(n));
      ++parsed;  // cut right after a complete function: a valid, smaller module
      for (const auto& [name, params] : kernel_map(info)) EXPECT_EQ(all.at(name), params) << name;
    } catch (const cubridge::image_error&) {
    }
  }
  EXPECT_LT(parsed, full.size() / 10);
}

TEST(ImageRobustness, BitFlipsGiveAResultOrAnImageError) {
  std::mt19937 rng(12345);
  for (const char* path : all_fixtures()) {
    const auto full = read_file(path);
    auto b = full;
    // One random bit in each of the first 4 KiB (headers, tables), then in every few bytes.
    const std::size_t stride = std::max<std::size_t>(1, full.size() / 4096);
    for (std::size_t i = 0; i < b.size(); i += i < 4096 ? 1 : stride) {
      const auto bit = std::byte(1u << (rng() % 8));
      b[i] ^= bit;
      (void)parses(b);
      b[i] ^= bit;
    }
    // Flipping any bit of a binary image's magic number makes it unrecognisable.
    for (std::size_t i = 0; i < (inspect(full).kind == image_kind::ptx ? 0 : 4); ++i) {
      for (unsigned bit = 0; bit < 8; ++bit) {
        b[i] ^= std::byte(1u << bit);
        EXPECT_FALSE(parses(b)) << path << " byte " << i << " bit " << bit;
        b[i] ^= std::byte(1u << bit);
      }
    }
    // Many bits at once.
    for (int round = 0; round < 200; ++round) {
      b = full;
      for (int k = 0; k < 16; ++k) b[rng() % b.size()] ^= std::byte(1u << (rng() % 8));
      (void)parses(b);
    }
  }
}

TEST(ImageRobustness, RandomInputsAreImageErrors) {
  std::mt19937_64 rng(777);
  for (int round = 0; round < 3000; ++round) {
    bytes b(rng() % 4096);
    for (auto& x : b) x = std::byte(rng() & 0xff);
    EXPECT_FALSE(parses(b));
  }
  // Random bodies behind valid-looking magic numbers and headers.
  const auto cubin = read_file(CUBRIDGE_IMAGE_CUBIN_SM_90);
  const auto fatbin = read_file(CUBRIDGE_IMAGE_FATBIN_MULTI);
  for (int round = 0; round < 3000; ++round) {
    const auto& base = round % 2 == 0 ? cubin : fatbin;
    const std::size_t keep = round % 2 == 0 ? 64 : 16 + 64;
    bytes b(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(keep));
    b.resize(keep + rng() % 8192);
    for (std::size_t i = keep; i < b.size(); ++i) b[i] = std::byte(rng() & 0xff);
    (void)parses(b);
  }
}

TEST(ImageRobustness, HugeRandomInputFailsFast) {
  std::mt19937_64 rng(99);
  bytes b(64u << 20);
  for (std::size_t i = 0; i < b.size(); i += 8) put64(b, i, rng());
  for (const bytes& header :
       {bytes{std::byte{0x12}}, from_text(".version 9.0\n.target sm_90\n"),
        from_text("\x7f"
                  "ELF"),
        bytes{std::byte{0x50}, std::byte{0xed}, std::byte{0x55}, std::byte{0xba}}}) {
    std::copy(header.begin(), header.end(), b.begin());
    const auto start = std::chrono::steady_clock::now();
    EXPECT_FALSE(parses(b));
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  }
  // 64 MiB of blank text: looked at once, then refused.
  std::fill(b.begin(), b.end(), std::byte{' '});
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(parses(b));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

// --------------------------------------------------------------------------------------------

cubridge::image_target target(image_kind kind, int sm, arch_variant variant) {
  cubridge::image_target t;
  t.kind = kind;
  t.sm = sm;
  t.variant = variant;
  return t;
}

TEST(ImageCompatibility, SassRunsOnTheSameMajorWithAHigherMinor) {
  using cubridge::can_run_on;
  const auto sm80 = target(image_kind::cubin, 80, arch_variant::generic);
  EXPECT_TRUE(can_run_on(sm80, {8, 0}));
  EXPECT_TRUE(can_run_on(sm80, {8, 6}));
  EXPECT_TRUE(can_run_on(sm80, {8, 9}));
  EXPECT_FALSE(can_run_on(sm80, {7, 5}));
  EXPECT_FALSE(can_run_on(sm80, {9, 0}));
  const auto sm86 = target(image_kind::cubin, 86, arch_variant::generic);
  EXPECT_FALSE(can_run_on(sm86, {8, 0}));
  EXPECT_TRUE(can_run_on(sm86, {8, 9}));
  const auto sm100 = target(image_kind::cubin, 100, arch_variant::generic);
  EXPECT_TRUE(can_run_on(sm100, {10, 3}));
  EXPECT_FALSE(can_run_on(sm100, {11, 0}));
  EXPECT_FALSE(can_run_on(sm100, {12, 0}));
  const auto sm120 = target(image_kind::cubin, 120, arch_variant::generic);
  EXPECT_TRUE(can_run_on(sm120, {12, 1}));
  EXPECT_FALSE(can_run_on(sm120, {10, 0}));
}

TEST(ImageCompatibility, ArchSpecificRunsOnlyOnItsOwnCapability) {
  using cubridge::can_run_on;
  const auto sm90a = target(image_kind::cubin, 90, arch_variant::arch_specific);
  EXPECT_TRUE(can_run_on(sm90a, {9, 0}));
  EXPECT_FALSE(can_run_on(sm90a, {9, 1}));
  EXPECT_FALSE(can_run_on(sm90a, {10, 0}));
  const auto sm100a = target(image_kind::cubin, 100, arch_variant::arch_specific);
  EXPECT_TRUE(can_run_on(sm100a, {10, 0}));
  EXPECT_FALSE(can_run_on(sm100a, {10, 3}));
  const auto compute90a = target(image_kind::ptx, 90, arch_variant::arch_specific);
  EXPECT_TRUE(can_run_on(compute90a, {9, 0}));
  EXPECT_FALSE(can_run_on(compute90a, {10, 0}));
}

TEST(ImageCompatibility, FamilySpecificRunsWithinItsMajor) {
  using cubridge::can_run_on;
  const auto sm100f = target(image_kind::cubin, 100, arch_variant::family_specific);
  EXPECT_TRUE(can_run_on(sm100f, {10, 0}));
  EXPECT_TRUE(can_run_on(sm100f, {10, 3}));
  EXPECT_FALSE(can_run_on(sm100f, {11, 0}));
  EXPECT_FALSE(can_run_on(sm100f, {12, 0}));
  const auto sm103f = target(image_kind::cubin, 103, arch_variant::family_specific);
  EXPECT_FALSE(can_run_on(sm103f, {10, 0}));
  const auto compute100f = target(image_kind::ptx, 100, arch_variant::family_specific);
  EXPECT_TRUE(can_run_on(compute100f, {10, 3}));
  EXPECT_FALSE(can_run_on(compute100f, {12, 0}));
}

TEST(ImageCompatibility, PtxJitsForAnyLaterDevice) {
  using cubridge::can_run_on;
  const auto compute90 = target(image_kind::ptx, 90, arch_variant::generic);
  EXPECT_TRUE(can_run_on(compute90, {9, 0}));
  EXPECT_TRUE(can_run_on(compute90, {10, 0}));
  EXPECT_TRUE(can_run_on(compute90, {12, 1}));
  EXPECT_FALSE(can_run_on(compute90, {8, 9}));
  const auto compute86 = target(image_kind::ptx, 86, arch_variant::generic);
  EXPECT_FALSE(can_run_on(compute86, {8, 0}));
  EXPECT_TRUE(can_run_on(compute86, {9, 0}));
}

TEST(ImageCompatibility, BadCapabilitiesArePreconditionErrors) {
  const auto sm80 = target(image_kind::cubin, 80, arch_variant::generic);
  for (auto [major, minor] :
       {std::pair{0, 0}, std::pair{8, -1}, std::pair{8, 10}, std::pair{-1, 0}}) {
    try {
      (void)cubridge::can_run_on(sm80, cubridge::compute_capability{major, minor});
      ADD_FAILURE() << major << "." << minor << " accepted";
    } catch (const cubridge::image_error& e) {
      ADD_FAILURE() << "an image_error for a bad capability: " << e.what();
    } catch (const cubridge::error& e) {
      EXPECT_TRUE(e.is(cubridge::errc::precondition)) << e.what();
    }
  }
}

// "Does it run here?" decided once: check_runs_on records the device, and a repeat for the same
// numbers is one compare that trusts the record (an image that was never checked, or checked for
// another device, is decided from its targets as always).
TEST(ImageCompatibility, CheckRunsOnRecordsTheDeviceForARepeat) {
  auto sm80 = inspect(read_file(CUBRIDGE_IMAGE_CUBIN_SM_80));
  EXPECT_FALSE(sm80.checked_for.has_value()) << "inspect_image checks no device";
  EXPECT_THROW(cubridge::check_runs_on(sm80, {7, 5}, "k"), cubridge::image_error);
  EXPECT_FALSE(sm80.checked_for.has_value()) << "a refusal records nothing";
  cubridge::check_runs_on(sm80, {8, 6}, "k");
  EXPECT_EQ(sm80.checked_for, (cubridge::compute_capability{8, 6}));
  // The record is what a repeat looks at: with the targets gone, 8.6 still passes, 9.0 not.
  sm80.targets.clear();
  EXPECT_NO_THROW(cubridge::require_runs_on(sm80, {8, 6}, "k"));
  EXPECT_THROW(cubridge::require_runs_on(sm80, {9, 0}, "k"), cubridge::image_error);
}

TEST(ImageCompatibility, RequireRunsOnNamesBothSides) {
  const auto fatbin = inspect(read_file(CUBRIDGE_IMAGE_FATBIN_MULTI));
  EXPECT_NO_THROW(cubridge::require_runs_on(fatbin, {8, 6}, "module 'm'"));   // sm_80
  EXPECT_NO_THROW(cubridge::require_runs_on(fatbin, {9, 0}, "module 'm'"));   // sm_90a
  EXPECT_NO_THROW(cubridge::require_runs_on(fatbin, {10, 3}, "module 'm'"));  // sm_100f
  EXPECT_NO_THROW(cubridge::require_runs_on(fatbin, {12, 0}, "module 'm'"));  // compute_90
  try {
    cubridge::require_runs_on(fatbin, {7, 5}, "module 'filters'");
    ADD_FAILURE() << "sm_75 accepted";
  } catch (const cubridge::image_error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::incompatible_image));
    const std::string m = e.what();
    for (const char* part : {"module 'filters'", "sm_80", "sm_90a", "sm_100f", "compute_90",
                             "sm_75", "compute capability 7.5"})
      EXPECT_NE(m.find(part), std::string::npos) << part << " missing from: " << m;
  }
  const auto sm90a = inspect(read_file(CUBRIDGE_IMAGE_CUBIN_SM_90A));
  EXPECT_NO_THROW(cubridge::require_runs_on(sm90a, {9, 0}, "k"));
  try {
    cubridge::require_runs_on(sm90a, {10, 0}, "kernels.cubin");
    ADD_FAILURE() << "sm_90a accepted on sm_100";
  } catch (const cubridge::image_error& e) {
    const std::string m = e.what();
    EXPECT_NE(
        m.find("kernels.cubin: cubin has code for sm_90a, none of which runs on a device of sm_100 "
               "(compute capability 10.0)"),
        std::string::npos)
        << m;
  }
}

TEST(ImageCompatibility, TheDevicesVariantIsNotLookedAt) {
  // A bundle's target "sm_90a" is checked as the device 9.0 it names.
  const auto sm90a = target(image_kind::cubin, 90, arch_variant::arch_specific);
  const auto sm100f = target(image_kind::cubin, 100, arch_variant::family_specific);
  using cubridge::can_run_on;
  using cubridge::compute_capability;
  EXPECT_TRUE(can_run_on(sm90a, compute_capability{9, 0, arch_variant::arch_specific}));
  EXPECT_TRUE(can_run_on(sm90a, compute_capability{9, 0, arch_variant::family_specific}));
  EXPECT_FALSE(can_run_on(sm90a, compute_capability{9, 1, arch_variant::arch_specific}));
  EXPECT_TRUE(can_run_on(sm100f, compute_capability{10, 3, arch_variant::arch_specific}));
  try {
    cubridge::require_runs_on(inspect(read_file(CUBRIDGE_IMAGE_CUBIN_SM_90A)),
                              compute_capability{10, 0, arch_variant::arch_specific}, "k");
    ADD_FAILURE() << "sm_90a accepted on sm_100a";
  } catch (const cubridge::image_error& e) {
    // The device is named without a suffix, as the device itself reports it.
    EXPECT_NE(std::string(e.what()).find("device of sm_100 (compute capability 10.0)"),
              std::string::npos)
        << e.what();
  }
}

TEST(ImageCompatibility, TargetsGiveTheirCapabilityWithItsVariant) {
  using cubridge::compute_capability;
  EXPECT_EQ(target(image_kind::cubin, 90, arch_variant::arch_specific).capability(),
            (compute_capability{9, 0, arch_variant::arch_specific}));
  EXPECT_EQ(target(image_kind::ptx, 120, arch_variant::generic).capability(),
            (compute_capability{12, 0}));
  const auto multi = inspect(read_file(CUBRIDGE_IMAGE_FATBIN_MULTI));
  for (const auto& t : multi.targets) {
    SCOPED_TRACE(t.arch_name);
    // arch_name is spelt as compute_capability's one formatter spells it, prefix aside.
    const auto name = cubridge::to_string(t.capability());
    EXPECT_EQ(t.arch_name.substr(t.arch_name.find('_')), name.substr(name.find('_')));
  }
}

TEST(ImageCompatibility, InspectImageCallsAreCounted) {
  const auto cubin = read_file(CUBRIDGE_IMAGE_CUBIN_SM_90);
  const auto before = cubridge::detail::inspect_image_calls();
  (void)inspect(cubin);
  (void)cubridge::inspect_image_file(CUBRIDGE_IMAGE_CUBIN_SM_90);
  EXPECT_THROW((void)cubridge::inspect_image({}), cubridge::image_error);
  EXPECT_EQ(cubridge::detail::inspect_image_calls() - before, 3u);
}

// --------------------------------------------------------------------------------------------

TEST(ImageFiles, InspectImageFile) {
  const auto info = cubridge::inspect_image_file(CUBRIDGE_IMAGE_CUBIN_SM_90);
  EXPECT_EQ(info.targets.at(0).arch_name, "sm_90");
  EXPECT_EQ(kernel_map(info), cubin_kernels);

  const auto missing = std::filesystem::path(::testing::TempDir()) / "cubridge-no-such-image.cubin";
  try {
    (void)cubridge::inspect_image_file(missing);
    ADD_FAILURE() << "a missing file inspected";
  } catch (const cubridge::image_error& e) {
    ADD_FAILURE() << "image_error for a missing file: " << e.what();
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::io)) << e.what();
    EXPECT_NE(std::string(e.what()).find("cubridge-no-such-image.cubin"), std::string::npos)
        << e.what();
  }
  try {
    (void)cubridge::inspect_image_file(::testing::TempDir());
    ADD_FAILURE() << "a directory inspected";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::io)) << e.what();
  }

  const auto junk = std::filesystem::path(::testing::TempDir()) / "cubridge-junk.bin";
  std::ofstream(junk, std::ios::binary) << "junk!";
  try {
    (void)cubridge::inspect_image_file(junk);
    ADD_FAILURE() << "junk inspected";
  } catch (const cubridge::image_error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::bad_image));
    EXPECT_NE(std::string(e.what()).find("cubridge-junk.bin"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("first bytes: 6a 75 6e 6b 21"), std::string::npos)
        << e.what();
  }
  std::filesystem::remove(junk);
}

TEST(ImageNames, KindsAndKernelLookup) {
  EXPECT_EQ(cubridge::to_string(image_kind::cubin), "cubin");
  EXPECT_EQ(cubridge::to_string(image_kind::fatbin), "fatbin");
  EXPECT_EQ(cubridge::to_string(image_kind::ptx), "ptx");
  EXPECT_EQ(cubridge::to_string(image_kind::lto_ir), "lto_ir");
  const auto info = inspect(read_file(CUBRIDGE_IMAGE_CUBIN_SM_80));
  ASSERT_NE(info.find_kernel("aligned_params"), nullptr);
  EXPECT_EQ(info.find_kernel("aligned_params")->parameter_sizes, (sizes{2, 16, 8}));
  EXPECT_EQ(info.find_kernel("helper"), nullptr);
  const auto t = info.targets.at(0);
  EXPECT_EQ(t.sm_major(), 8);
  EXPECT_EQ(t.sm_minor(), 0);
}

}  // namespace
