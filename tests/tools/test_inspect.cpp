// `cubridge inspect` (tools/inspect.hpp): demangled kernel names beside the mangled ones, and
// signed bundles read, verified with the right key, refused with a wrong one or when truncated.
// Checked in-process (inspect_file, describe_file, render_file) and through the built command's
// output and exit codes (tools/exit_codes.hpp). No GPU: the test cubin is nvcc's, built with the
// tests.
#include "exit_codes.hpp"
#include "inspect.hpp"
#include "temp_dir.hpp"

#include <cubridge/bundle/bundle.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include <sys/wait.h>

namespace {

namespace fs = std::filesystem;
using cubridge::bundle_error;
using cubridge::bundle_reason;
using cubridge::testing::temp_dir;
using cubridge::tool::demangled_name;
using cubridge::tool::describe_file;
using cubridge::tool::inspect_file;
using cubridge::tool::render_file;

// The test kernels' scale<float>(float*, float, std::size_t), a C++ kernel; fill_u32 is
// extern "C".
constexpr std::string_view scale_mangled = "_Z5scaleIfEvPT_S0_m";
constexpr std::string_view scale_demangled = "void scale<float>(float*, float, unsigned long)";

bool contains(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

std::vector<std::byte> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> chars((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

void write_bytes(const fs::path& path, std::span<const std::byte> bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}

struct run_result {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// The built command with `arguments` (no shell metacharacters in them), as a user runs it.
run_result run_tool(const std::string& arguments) {
  const std::string command = std::string(CUBRIDGE_TOOL_PATH) + " " + arguments + " 2>&1";
  FILE* out = ::popen(command.c_str(), "r");
  if (!out) return {};
  run_result r;
  std::array<char, 4096> buffer{};
  while (const auto n = std::fread(buffer.data(), 1, buffer.size(), out))
    r.output.append(buffer.data(), n);
  const int status = ::pclose(out);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(Demangle, AMangledNameReadsAsCpp) {
  EXPECT_EQ(demangled_name("_Z5scalePffi"), "scale(float*, float, int)");
  EXPECT_EQ(demangled_name(std::string(scale_mangled)), std::string(scale_demangled));
}

TEST(Demangle, AnExternCNameHasNone) {
  EXPECT_EQ(demangled_name("fill_u32"), std::nullopt);
  // __cxa_demangle alone reads these as types ("float", "int"): a kernel named so is not C++.
  EXPECT_EQ(demangled_name("f"), std::nullopt);
  EXPECT_EQ(demangled_name("i"), std::nullopt);
  EXPECT_EQ(demangled_name("_Z"), std::nullopt);  // the prefix, then nothing the demangler takes
}

TEST(InspectImage, KernelsShowTheirDemangledNames) {
  const auto inspected = inspect_file(CUBRIDGE_TEST_CUBIN);
  ASSERT_FALSE(inspected.bundle);
  ASSERT_TRUE(inspected.image);
  const auto text = render_file(inspected, "k.cubin");
  EXPECT_TRUE(contains(text, "  kernel  " + std::string(scale_mangled) + "(8 B, 4 B, 8 B)  " +
                                 std::string(scale_demangled) + "\n"))
      << text;
  EXPECT_TRUE(contains(text, "  kernel  fill_u32(8 B, 4 B, 8 B)\n")) << text;

  const auto json = describe_file(inspected);
  EXPECT_FALSE(json.contains("bundle"));
  bool saw_scale = false, saw_fill = false;
  for (const auto& k : json["kernels"]) {
    if (k["name"] == scale_mangled) saw_scale = (k["demangled"] == scale_demangled);
    if (k["name"] == "fill_u32") saw_fill = k["demangled"].is_null();
  }
  EXPECT_TRUE(saw_scale) << json.dump(2);
  EXPECT_TRUE(saw_fill) << json.dump(2);
}

// A bundle of the test cubin, signed by `signer`, saved under a name that says nothing of it.
class InspectBundle : public ::testing::Test {
 protected:
  void SetUp() override {
    cubridge::bundle_manifest_input input{.name = "filters", .version = 3, .target = "sm_90"};
    bytes = cubridge::sign_bundle(input, read_bytes(CUBRIDGE_TEST_CUBIN), signer.secret_key);
    write_bytes(bundle, bytes);
    cubridge::write_key_file(dir.path / "right.pub", signer.public_key);
    cubridge::write_key_file(dir.path / "wrong.pub", other.public_key);
  }
  [[nodiscard]] std::string signer_id() const { return cubridge::to_hex(signer.public_key.id()); }

  temp_dir dir;
  cubridge::keypair signer = cubridge::generate_keypair();
  cubridge::keypair other = cubridge::generate_keypair();
  fs::path bundle = dir.path / "filters.bin";  // recognised by its magic, not its name
  std::vector<std::byte> bytes;
};

TEST_F(InspectBundle, WithoutAKeyItIsReadNotVerified) {
  const auto inspected = inspect_file(bundle);
  ASSERT_TRUE(inspected.bundle);
  EXPECT_FALSE(inspected.bundle->verified);
  EXPECT_EQ(inspected.bundle->manifest.name, "filters");
  ASSERT_TRUE(inspected.image);
  EXPECT_NE(inspected.image->find_kernel("fill_u32"), nullptr);

  const auto text = render_file(inspected, "filters.bin");
  EXPECT_TRUE(text.starts_with("filters.bin: bundle\n")) << text;
  EXPECT_TRUE(contains(text, "  name:      filters\n  version:   3\n  target:    sm_90\n")) << text;
  EXPECT_TRUE(contains(text, "  signer:    key " + signer_id() + "\n")) << text;
  EXPECT_TRUE(contains(text, "  signature: not verified (pass --key FILE to verify)\n")) << text;
  EXPECT_FALSE(contains(text, "expires")) << text;
  EXPECT_TRUE(contains(text, "filters.bin (payload): cubin\n")) << text;

  const auto json = describe_file(inspected);
  EXPECT_EQ(json["bundle"]["name"], "filters");
  EXPECT_EQ(json["bundle"]["version"], 3);
  EXPECT_EQ(json["bundle"]["signer"], signer_id());
  EXPECT_EQ(json["bundle"]["verified"], false);
  EXPECT_TRUE(json["bundle"]["expires"].is_null());
  EXPECT_EQ(json["kind"], "cubin");  // the payload's image fields beside "bundle"

  const auto r = run_tool("inspect " + bundle.string());
  EXPECT_EQ(r.exit_code, cubridge::tool::exit_ok) << r.output;
  EXPECT_TRUE(contains(r.output, "signature: not verified (pass --key FILE to verify)"))
      << r.output;
  EXPECT_TRUE(contains(r.output, std::string(scale_demangled))) << r.output;
}

TEST_F(InspectBundle, TheRightKeyVerifiesIt) {
  const auto inspected = inspect_file(bundle, {other.public_key, signer.public_key});
  ASSERT_TRUE(inspected.bundle);
  EXPECT_TRUE(inspected.bundle->verified);
  EXPECT_TRUE(contains(render_file(inspected, "b"), "  signature: verified by " + signer_id()));
  EXPECT_EQ(describe_file(inspected)["bundle"]["verified"], true);

  const auto r = run_tool("inspect --key " + (dir.path / "right.pub").string() + " " +
                          bundle.string() + " --json");
  EXPECT_EQ(r.exit_code, cubridge::tool::exit_ok) << r.output;
  const auto json = nlohmann::json::parse(r.output);
  EXPECT_EQ(json["bundle"]["verified"], true);
  EXPECT_EQ(json["bundle"]["signer"], signer_id());
}

TEST_F(InspectBundle, AWrongKeyRefusesItNamingTheReason) {
  try {
    (void)inspect_file(bundle, {other.public_key});
    ADD_FAILURE() << "a bundle signed by another key verified";
  } catch (const bundle_error& e) {
    EXPECT_EQ(e.reason(), bundle_reason::unknown_key);
    EXPECT_TRUE(contains(e.what(), bundle.string())) << e.what();
  }
  const auto r =
      run_tool("inspect --key " + (dir.path / "wrong.pub").string() + " " + bundle.string());
  EXPECT_EQ(r.exit_code, cubridge::tool::exit_failure) << r.output;
  EXPECT_TRUE(contains(r.output, "unknown_key")) << r.output;
  EXPECT_TRUE(contains(r.output, "is not trusted")) << r.output;
  EXPECT_FALSE(contains(r.output, "signature: verified")) << r.output;
}

TEST_F(InspectBundle, ATamperedSignatureIsRefused) {
  bytes.back() ^= std::byte{1};
  write_bytes(bundle, bytes);
  const auto r =
      run_tool("inspect --key " + (dir.path / "right.pub").string() + " " + bundle.string());
  EXPECT_EQ(r.exit_code, cubridge::tool::exit_failure) << r.output;
  EXPECT_TRUE(contains(r.output, "bad_signature")) << r.output;
}

TEST_F(InspectBundle, TruncatedBytesThatStartLikeABundleAreRefused) {
  const fs::path cut = dir.path / "cut.cubin";
  write_bytes(cut, std::span(bytes).first(bytes.size() / 2));
  try {
    (void)inspect_file(cut);
    ADD_FAILURE() << "a truncated bundle was read";
  } catch (const bundle_error& e) {
    EXPECT_EQ(e.reason(), bundle_reason::malformed);
    EXPECT_TRUE(contains(e.what(), "cut.cubin")) << e.what();
  }
  const auto r = run_tool("inspect " + cut.string());
  EXPECT_EQ(r.exit_code, cubridge::tool::exit_failure) << r.output;
  EXPECT_TRUE(contains(r.output, "malformed")) << r.output;
  EXPECT_TRUE(contains(r.output, "truncated in the payload")) << r.output;
}

TEST_F(InspectBundle, AKeyForAnImageIsAFailure) {
  const auto r = run_tool("inspect --key " + (dir.path / "right.pub").string() + " " +
                          std::string(CUBRIDGE_TEST_CUBIN));
  EXPECT_EQ(r.exit_code, cubridge::tool::exit_failure) << r.output;
  EXPECT_TRUE(contains(r.output, "is no bundle")) << r.output;
}

}  // namespace
