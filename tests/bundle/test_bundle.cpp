// Tests of cubridge/bundle/bundle.hpp: signing and verifying bundles, each refusal with its reason.
#include <cubridge/bundle/bundle.hpp>
#include <cubridge/bundle/error.hpp>

#include "gpu_test.hpp"  // only for the test image paths

#include <gtest/gtest.h>

#include "expect_refused.hpp"
#include "refused_files.hpp"
#include "temp_dir.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

namespace {

using cubridge::bundle_error;
using cubridge::bundle_reason;
using bytes = std::vector<std::byte>;
using cubridge::testing::expect_io_error;
using cubridge::testing::make_fifo;
using cubridge::testing::temp_dir;
using cubridge::testing::thrown_reading_fifo;
using cubridge::testing::write_text;

bytes read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  bytes out(chars.size());
  std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

bytes as_bytes(std::string_view text) {
  bytes out(text.size());
  std::memcpy(out.data(), text.data(), text.size());
  return out;
}

std::string as_text(std::span<const std::byte> b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

class BundleTest : public ::testing::Test {
 protected:
  cubridge::keypair keys = cubridge::generate_keypair();
  cubridge::trusted_keys trusted{keys.public_key};
  bytes cubin = read_file(cubridge::testing::test_cubin_path());  // sm_90

  static cubridge::bundle_manifest_input input(
      std::string name = "filters", std::uint64_t version = 3, std::string target = "sm_90",
      cubridge::payload_kind kind = cubridge::payload_kind::cubin) {
    cubridge::bundle_manifest_input in;
    in.name = std::move(name);
    in.version = version;
    in.target = std::move(target);
    in.kind = kind;
    in.created = std::chrono::sys_days{std::chrono::year{2026} / 11 / 29} + std::chrono::hours{12};
    return in;
  }
  std::string manifest(const cubridge::bundle_manifest_input& in) const {
    return cubridge::detail::manifest_json(in, cubin, keys.public_key);
  }
  // `json` with the value of "name" replaced by `name` as raw bytes.
  static std::string replace_name(std::string json, const std::string& name) {
    const auto at = json.find("\"name\":\"") + 8;
    return json.replace(at, json.find('"', at) - at, name);
  }
  bytes signed_with_manifest(const std::string& json) const {
    return cubridge::detail::sign_bundle_unchecked(json, cubin, keys.secret_key);
  }
  // Offset of the payload in a bundle written by sign_bundle.
  static std::size_t payload_offset(const bytes& bundle) {
    std::uint32_t manifest_size = 0;
    for (std::size_t i = 4; i-- > 0;)
      manifest_size = manifest_size << 8 | std::to_integer<std::uint32_t>(bundle[10 + i]);
    return 10 + 4 + manifest_size + 8;
  }
};

TEST_F(BundleTest, RoundTrip) {
  const auto bundle = cubridge::sign_bundle(input(), cubin, keys.secret_key);
  const auto verified = cubridge::verify_bundle(bundle, trusted);
  EXPECT_EQ(verified.manifest.name, "filters");
  EXPECT_EQ(verified.version(), 3u);
  EXPECT_EQ(verified.manifest.target, "sm_90");
  EXPECT_EQ(verified.manifest.target_capability, (cubridge::compute_capability{9, 0}));
  EXPECT_EQ(verified.manifest.kind, cubridge::payload_kind::cubin);
  EXPECT_EQ(verified.manifest.payload_size, cubin.size());
  EXPECT_EQ(verified.manifest.payload_sha256.size(), 64u);
  EXPECT_EQ(verified.manifest.created, "2026-11-29T12:00:00Z");
  EXPECT_EQ(verified.manifest.created_time,
            std::chrono::sys_days{std::chrono::year{2026} / 11 / 29} + std::chrono::hours{12});
  EXPECT_EQ(verified.manifest.key_id, keys.public_key.id());
  EXPECT_EQ(verified.payload, cubin);
  EXPECT_EQ(as_text(std::span(bundle).first(9)), "CUBRIDGEB");
  EXPECT_EQ(bundle[9], std::byte{1});
}

TEST_F(BundleTest, FatbinAndSourceRoundTrip) {
  const auto fatbin = read_file(cubridge::testing::test_fatbin_path());  // sm_80, sm_90, compute_90
  const auto b1 = cubridge::sign_bundle(input("f", 1, "sm_90", cubridge::payload_kind::fatbin),
                                        fatbin, keys.secret_key);
  EXPECT_EQ(cubridge::verify_bundle(b1, trusted).payload, fatbin);
  const auto source = as_bytes("extern \"C\" __global__ void k(float* x) { x[0] = 1; }\n");
  const auto b2 = cubridge::sign_bundle(
      input("s", 2, "sm_100a", cubridge::payload_kind::cuda_source), source, keys.secret_key);
  const auto v2 = cubridge::verify_bundle(b2, trusted);
  EXPECT_EQ(v2.payload, source);
  EXPECT_EQ(v2.manifest.target_capability,
            (cubridge::compute_capability{10, 0, cubridge::arch_variant::arch_specific}));
  EXPECT_FALSE(v2.image) << "CUDA source is text: there is no image to hand on";
}

// verify_bundle parses the payload once and hands on what it found, so that the receiver (the
// update endpoint, the sink) does not parse it again.
TEST_F(BundleTest, VerifiedBundleHoldsThePayloadsImage) {
  const auto bundle = cubridge::sign_bundle(input(), cubin, keys.secret_key);
  const auto calls = cubridge::detail::inspect_image_calls();
  const auto verified = cubridge::verify_bundle(bundle, trusted);
  EXPECT_EQ(cubridge::detail::inspect_image_calls() - calls, 1u);
  ASSERT_TRUE(verified.image);
  const auto expected = cubridge::inspect_image(cubin);
  EXPECT_EQ(verified.image->kind, cubridge::image_kind::cubin);
  ASSERT_EQ(verified.image->targets.size(), 1u);
  EXPECT_EQ(verified.image->targets[0].arch_name, "sm_90");
  ASSERT_EQ(verified.image->kernels.size(), expected.kernels.size());
  ASSERT_FALSE(expected.kernels.empty());
  for (std::size_t i = 0; i < expected.kernels.size(); ++i) {
    EXPECT_EQ(verified.image->kernels[i].name, expected.kernels[i].name);
    EXPECT_EQ(verified.image->kernels[i].parameter_sizes, expected.kernels[i].parameter_sizes);
  }
  EXPECT_NE(verified.image->find_kernel("fill_u32"), nullptr);

  const auto fatbin = read_file(cubridge::testing::test_fatbin_path());  // sm_80, sm_90, compute_90
  const auto from_fatbin = cubridge::verify_bundle(
      cubridge::sign_bundle(input("f", 1, "sm_90", cubridge::payload_kind::fatbin), fatbin,
                            keys.secret_key),
      trusted);
  ASSERT_TRUE(from_fatbin.image);
  EXPECT_EQ(from_fatbin.image->kind, cubridge::image_kind::fatbin);
  std::vector<std::string> archs;
  for (const auto& t : from_fatbin.image->targets) archs.push_back(t.arch_name);
  std::sort(archs.begin(), archs.end());
  EXPECT_EQ(archs, (std::vector<std::string>{"compute_90", "sm_80", "sm_90"}));
}

TEST_F(BundleTest, ErrorIsACubridgeError) {
  try {
    (void)cubridge::verify_bundle(as_bytes("nope"), trusted);
    FAIL();
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::update_errc::bad_bundle));
    EXPECT_FALSE(e.is(cubridge::errc::bad_image));
    EXPECT_NE(std::string(e.what()).find("bad_magic"), std::string::npos) << e.what();
  }
}

TEST_F(BundleTest, UnsignedIsRefused) {
  auto bundle = cubridge::sign_bundle(input(), cubin, keys.secret_key);
  std::fill(bundle.end() - 64, bundle.end(), std::byte{0});
  EXPECT_REFUSED(cubridge::verify_bundle(bundle, trusted), bundle_reason::unsigned_bundle);
}

TEST_F(BundleTest, UnknownKeyIsRefused) {
  const auto bundle = cubridge::sign_bundle(input(), cubin, keys.secret_key);
  const auto other = cubridge::generate_keypair();
  EXPECT_REFUSED(cubridge::verify_bundle(bundle, cubridge::trusted_keys{other.public_key}),
                 bundle_reason::unknown_key);
  EXPECT_REFUSED(cubridge::verify_bundle(bundle, cubridge::trusted_keys{}),
                 bundle_reason::unknown_key);
}

TEST_F(BundleTest, SignatureByAnotherKeyWithTheSameIdIsRefused) {
  // A forger who copies a trusted key id into the manifest still cannot sign for it.
  const auto forger = cubridge::generate_keypair();
  auto json = manifest(input());  // names the trusted key's id
  const auto bundle = cubridge::detail::sign_bundle_unchecked(json, cubin, forger.secret_key);
  EXPECT_REFUSED(cubridge::verify_bundle(bundle, trusted), bundle_reason::bad_signature);
}

TEST_F(BundleTest, TamperedPayloadIsRefused) {
  auto bundle = cubridge::sign_bundle(input(), cubin, keys.secret_key);
  bundle[payload_offset(bundle) + cubin.size() / 2] ^= std::byte{0x01};
  EXPECT_REFUSED(cubridge::verify_bundle(bundle, trusted), bundle_reason::payload_mismatch);
}

TEST_F(BundleTest, SwappedPayloadOfOtherSizeIsRefused) {
  // A payload replaced by one of another length (lengths rewritten consistently).
  // The signature covers the manifest only, so it is the one a correct bundle carries.
  const auto json = manifest(input());
  bytes shorter(cubin.begin(), cubin.end() - 1);
  const auto bundle = cubridge::detail::sign_bundle_unchecked(json, shorter, keys.secret_key);
  EXPECT_REFUSED(cubridge::verify_bundle(bundle, trusted), bundle_reason::payload_mismatch);
}

TEST_F(BundleTest, TamperedManifestIsRefused) {
  auto bundle = cubridge::sign_bundle(input(), cubin, keys.secret_key);
  auto text = as_text(bundle);
  const auto at = text.find("\"version\":3");
  ASSERT_NE(at, std::string::npos);
  bundle[at + 10] = std::byte{'4'};  // version bumped to 4
  EXPECT_REFUSED(cubridge::verify_bundle(bundle, trusted), bundle_reason::bad_signature);
}

TEST_F(BundleTest, TamperedSignatureIsRefused) {
  auto bundle = cubridge::sign_bundle(input(), cubin, keys.secret_key);
  bundle[bundle.size() - 10] ^= std::byte{0x80};
  EXPECT_REFUSED(cubridge::verify_bundle(bundle, trusted), bundle_reason::bad_signature);
}

TEST_F(BundleTest, EveryTruncationIsRefused) {
  const auto bundle = cubridge::sign_bundle(input(), cubin, keys.secret_key);
  for (std::size_t n = 0; n < bundle.size(); ++n) {
    try {
      (void)cubridge::verify_bundle(std::span(bundle).first(n), trusted);
      ADD_FAILURE() << "prefix of " << n << " bytes accepted";
    } catch (const bundle_error& e) {
      const auto expected = n < 9 ? bundle_reason::bad_magic : bundle_reason::malformed;
      if (e.reason() != expected) {
        ADD_FAILURE() << "prefix of " << n << " bytes: " << cubridge::to_string(e.reason());
        break;
      }
    }
  }
  auto longer = bundle;
  longer.push_back(std::byte{0});
  EXPECT_REFUSED(cubridge::verify_bundle(longer, trusted), bundle_reason::malformed);
}

TEST_F(BundleTest, OversizedIsRefused) {
  const auto bundle = cubridge::sign_bundle(input(), cubin, keys.secret_key);
  cubridge::verify_limits limits;
  limits.max_bundle_bytes = bundle.size() - 1;
  EXPECT_REFUSED(cubridge::verify_bundle(bundle, trusted, limits), bundle_reason::too_large);
  limits.max_bundle_bytes = bundle.size();
  EXPECT_NO_THROW((void)cubridge::verify_bundle(bundle, trusted, limits));
  limits.max_manifest_bytes = 16;
  EXPECT_REFUSED(cubridge::verify_bundle(bundle, trusted, limits), bundle_reason::too_large);
  // A too-large bundle is refused before anything is read: garbage of the size is refused so.
  const bytes garbage(limits.max_bundle_bytes + 1, std::byte{0xFF});
  EXPECT_REFUSED(cubridge::verify_bundle(garbage, trusted, limits), bundle_reason::too_large);
}

TEST_F(BundleTest, HugeLengthsAreRefused) {
  auto bundle = cubridge::sign_bundle(input(), cubin, keys.secret_key);
  auto manifest_huge = bundle;
  std::fill(manifest_huge.begin() + 10, manifest_huge.begin() + 14, std::byte{0xFF});
  EXPECT_REFUSED(cubridge::verify_bundle(manifest_huge, trusted), bundle_reason::too_large);
  cubridge::verify_limits unlimited{SIZE_MAX, SIZE_MAX};
  EXPECT_REFUSED(cubridge::verify_bundle(manifest_huge, trusted, unlimited),
                 bundle_reason::malformed);
  auto payload_huge = bundle;
  const auto at = payload_offset(bundle) - 8;
  std::fill(payload_huge.begin() + static_cast<std::ptrdiff_t>(at),
            payload_huge.begin() + static_cast<std::ptrdiff_t>(at + 8), std::byte{0xFF});
  EXPECT_REFUSED(cubridge::verify_bundle(payload_huge, trusted, unlimited),
                 bundle_reason::malformed);
}

TEST_F(BundleTest, BadMagicAndVersionAreRefused) {
  auto bundle = cubridge::sign_bundle(input(), cubin, keys.secret_key);
  auto magic = bundle;
  magic[0] = std::byte{'X'};
  EXPECT_REFUSED(cubridge::verify_bundle(magic, trusted), bundle_reason::bad_magic);
  auto version = bundle;
  version[9] = std::byte{2};
  EXPECT_REFUSED(cubridge::verify_bundle(version, trusted), bundle_reason::unsupported_version);
}

TEST_F(BundleTest, MalformedJsonIsRefused) {
  const auto json = manifest(input());
  for (const std::string& bad :
       {std::string("{\"name\":"), std::string(""), std::string("not json"), json + "x",
        json + json, std::string("{\"name\":\"a\xff\"}"),
        std::string("{\"name\":\"a\",\"name\":\"b\"}")}) {
    SCOPED_TRACE(bad);
    EXPECT_REFUSED(cubridge::verify_bundle(signed_with_manifest(bad), trusted),
                   bundle_reason::malformed_manifest);
  }
  for (const std::string& bad :
       {std::string("[]"), std::string("\"x\""), std::string("3"), std::string("null"),
        std::string("{}"), std::string("{\"name\":{\"a\":1}}"), std::string("{\"name\":[1]}")}) {
    SCOPED_TRACE(bad);
    EXPECT_REFUSED(cubridge::verify_bundle(signed_with_manifest(bad), trusted),
                   bundle_reason::invalid_manifest);
  }
}

TEST_F(BundleTest, MissingOrExtraFieldsAreRefused) {
  const auto json = manifest(input());
  // Keys are written sorted: created, key_id, kind, name, payload_sha256, payload_size, target,
  // version.
  for (const std::string_view key_view :
       {"created", "key_id", "kind", "name", "payload_sha256", "payload_size", "target"}) {
    const std::string key(key_view);
    SCOPED_TRACE(key);
    auto missing = json;
    const auto start = missing.find("\"" + key + "\":");
    ASSERT_NE(start, std::string::npos);
    const auto end = missing.find(",\"", start);  // next field
    missing.erase(start, end + 1 - start);
    EXPECT_REFUSED(cubridge::verify_bundle(signed_with_manifest(missing), trusted),
                   bundle_reason::invalid_manifest);
  }
  auto no_version = json;
  no_version.erase(no_version.find(",\"version\""));
  no_version += "}";
  EXPECT_REFUSED(cubridge::verify_bundle(signed_with_manifest(no_version), trusted),
                 bundle_reason::invalid_manifest);
  auto extra = json;
  extra.insert(1, "\"extra\":1,");
  EXPECT_REFUSED(cubridge::verify_bundle(signed_with_manifest(extra), trusted),
                 bundle_reason::invalid_manifest);
  // Sanity: the untouched manifest, signed the same way, verifies.
  EXPECT_NO_THROW((void)cubridge::verify_bundle(signed_with_manifest(json), trusted));
}

TEST_F(BundleTest, IllTypedFieldsAreRefused) {
  const auto json = manifest(input());
  auto replace = [&](std::string from, std::string to) {
    auto out = json;
    const auto at = out.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return out.replace(at, from.size(), to);
  };
  for (const auto& bad :
       {replace("\"version\":3", "\"version\":\"3\""), replace("\"version\":3", "\"version\":0"),
        replace("\"version\":3", "\"version\":-3"), replace("\"version\":3", "\"version\":3.0"),
        replace("\"version\":3", "\"version\":99999999999999999999999"),
        replace("\"version\":3", "\"version\":true"), replace("\"version\":3", "\"version\":null"),
        replace("\"target\":\"sm_90\"", "\"target\":\"sm90\""),
        replace("\"target\":\"sm_90\"", "\"target\":\"compute_90\""),
        replace("\"kind\":\"cubin\"", "\"kind\":\"ptx\""),
        replace("\"created\":\"2026-11-29T12:00:00Z\"", "\"created\":\"2026-02-30T12:00:00Z\""),
        replace("\"created\":\"2026-11-29T12:00:00Z\"", "\"created\":\"2026-11-29 12:00:00\""),
        replace("\"key_id\":\"", "\"key_id\":\"X")}) {
    SCOPED_TRACE(bad);
    EXPECT_REFUSED(cubridge::verify_bundle(signed_with_manifest(bad), trusted),
                   bundle_reason::invalid_manifest);
  }
}

// nlohmann's lexer ends its input at a NUL byte: without a check of its own, the verifier would
// accept a signed manifest with anything after a NUL (more JSON, invalid UTF-8) that another
// parser reads differently.
TEST_F(BundleTest, NulBytesAndInvalidUtf8AnywhereAreRefused) {
  const auto json = manifest(input());
  const std::string nul(1, '\0');
  for (const std::string& bad :
       {json + nul, json + nul + "garbage", json + nul + "\xff\xfe", json + nul + json,
        json.substr(0, json.size() - 1) + nul + "}", nul + json, json + "\xff", json + " \xc0\xaf",
        // in a string: overlong '/', a UTF-16 surrogate, beyond U+10FFFF, truncated
        replace_name(json,
                     "a\xc0\xaf"
                     "b"),
        replace_name(json,
                     "a\xed\xa0\x80"
                     "b"),
        replace_name(json,
                     "a\xf4\x90\x80\x80"
                     "b"),
        replace_name(json, "a\xe2\x82")}) {
    SCOPED_TRACE(::testing::PrintToString(bad));
    EXPECT_REFUSED(cubridge::verify_bundle(signed_with_manifest(bad), trusted),
                   bundle_reason::malformed_manifest);
  }
  try {
    (void)cubridge::verify_bundle(signed_with_manifest(json + nul + "x"), trusted);
    ADD_FAILURE() << "a manifest with a NUL byte verified";
  } catch (const bundle_error& e) {
    EXPECT_NE(e.involved().find("NUL byte at offset " + std::to_string(json.size())),
              std::string::npos)
        << e.what();
  }
  // Valid UTF-8 of every length still verifies (a name is any UTF-8 without control characters).
  EXPECT_NO_THROW((void)cubridge::verify_bundle(
      signed_with_manifest(replace_name(json, "\xc3\xa9t\xc3\xa9-\xe2\x82\xac-\xf0\x9f\x9a\x80")),
      trusted));
}

TEST_F(BundleTest, VersionsAreExactlyTheUnsignedSixtyFourBitIntegers) {
  const auto json = manifest(input());
  auto with_version = [&](const std::string& version) {
    auto out = json;
    out.replace(out.find("\"version\":3"), 11, "\"version\":" + version);
    return out;
  };
  EXPECT_EQ(
      cubridge::verify_bundle(signed_with_manifest(with_version("18446744073709551615")), trusted)
          .version(),
      18446744073709551615u);
  EXPECT_EQ(cubridge::verify_bundle(cubridge::sign_bundle(input("filters", 18446744073709551615u),
                                                          cubin, keys.secret_key),
                                    trusted)
                .version(),
            18446744073709551615u);
  for (const std::string& bad :
       {std::string("18446744073709551616"), std::string("36893488147419103232"),
        std::string("1e3"), std::string("1E3"), std::string("1.0"), std::string("3.5"),
        std::string("-1"), std::string("-0"), std::string("\"5\""), std::string("0")}) {
    SCOPED_TRACE(bad);
    EXPECT_REFUSED(cubridge::verify_bundle(signed_with_manifest(with_version(bad)), trusted),
                   bundle_reason::invalid_manifest);
  }
  for (const std::string& bad : {std::string("+5"), std::string("05"), std::string("0x5")}) {
    SCOPED_TRACE(bad);
    EXPECT_REFUSED(cubridge::verify_bundle(signed_with_manifest(with_version(bad)), trusted),
                   bundle_reason::malformed_manifest);
  }
}

// --- expiry -------------------------------------------------------------------------------------

TEST_F(BundleTest, ExpiresIsSignedAndEnforcedAgainstTheClock) {
  const auto created = *input().created;
  auto in = input();
  in.expires = created + std::chrono::hours{24} + std::chrono::milliseconds{999};  // cut to s
  const auto bundle = cubridge::sign_bundle(in, cubin, keys.secret_key);
  EXPECT_NE(as_text(bundle).find("\"expires\":\"2026-11-30T12:00:00Z\""), std::string::npos);
  cubridge::verify_limits limits;
  limits.now = created + std::chrono::hours{1};
  const auto verified = cubridge::verify_bundle(bundle, trusted, limits);
  EXPECT_EQ(verified.manifest.expires, "2026-11-30T12:00:00Z");
  ASSERT_TRUE(verified.manifest.expires_time.has_value());
  EXPECT_EQ(*verified.manifest.expires_time,
            std::chrono::sys_days{std::chrono::year{2026} / 11 / 30} + std::chrono::hours{12});
  limits.now = created + std::chrono::hours{24} - std::chrono::seconds{1};
  EXPECT_NO_THROW((void)cubridge::verify_bundle(bundle, trusted, limits));
  limits.now = created + std::chrono::hours{24};  // valid strictly before `expires`
  EXPECT_REFUSED(cubridge::verify_bundle(bundle, trusted, limits), bundle_reason::expired);
  limits.now = created + std::chrono::hours{24 * 400};
  EXPECT_REFUSED(cubridge::verify_bundle(bundle, trusted, limits), bundle_reason::expired);
  // The default clock is the system's: a bundle that expired in 2000 is refused today.
  auto old = input();
  old.created = std::chrono::sys_days{std::chrono::year{1999} / 1 / 1};
  old.expires = std::chrono::sys_days{std::chrono::year{2000} / 1 / 1};
  EXPECT_REFUSED(
      cubridge::verify_bundle(cubridge::sign_bundle(old, cubin, keys.secret_key), trusted),
      bundle_reason::expired);
  // The expiry is covered by the signature: pushing it later breaks the signature, which is
  // reported first.
  auto moved = as_text(bundle);
  moved.replace(moved.find("2026-11-30T12"), 13, "2099-11-30T12");
  limits.now = created + std::chrono::hours{48};
  EXPECT_REFUSED(cubridge::verify_bundle(as_bytes(moved), trusted, limits),
                 bundle_reason::bad_signature);
}

TEST_F(BundleTest, BundlesWithoutExpiresNeverExpireUnlessTheReceiverSaysSo) {
  const auto bundle = cubridge::sign_bundle(input(), cubin, keys.secret_key);
  EXPECT_EQ(as_text(bundle).find("expires"), std::string::npos) << "format unchanged without it";
  cubridge::verify_limits limits;
  limits.now = *input().created + std::chrono::hours{24 * 365 * 50};
  const auto verified = cubridge::verify_bundle(bundle, trusted, limits);
  EXPECT_EQ(verified.manifest.expires, "");
  EXPECT_FALSE(verified.manifest.expires_time.has_value());
  limits.require_expiry = true;
  EXPECT_REFUSED(cubridge::verify_bundle(bundle, trusted, limits), bundle_reason::expired);
  auto in = input();
  in.expires = *in.created + std::chrono::hours{24 * 365 * 100};
  EXPECT_NO_THROW((void)cubridge::verify_bundle(cubridge::sign_bundle(in, cubin, keys.secret_key),
                                                trusted, limits));
}

TEST_F(BundleTest, MaxAgeRefusesBundlesCreatedLongAgo) {
  const auto bundle = cubridge::sign_bundle(input(), cubin, keys.secret_key);
  cubridge::verify_limits limits;
  limits.now = *input().created + std::chrono::hours{2};
  limits.max_age = std::chrono::hours{3};
  EXPECT_NO_THROW((void)cubridge::verify_bundle(bundle, trusted, limits));
  limits.max_age = std::chrono::hours{2};
  EXPECT_NO_THROW((void)cubridge::verify_bundle(bundle, trusted, limits));
  limits.max_age = std::chrono::hours{1};
  EXPECT_REFUSED(cubridge::verify_bundle(bundle, trusted, limits), bundle_reason::expired);
}

TEST_F(BundleTest, ExpiresMustBeAWellFormedTimeAfterCreated) {
  auto in = input();
  in.expires = in.created;
  EXPECT_REFUSED(cubridge::sign_bundle(in, cubin, keys.secret_key),
                 bundle_reason::invalid_manifest);
  in.expires = *in.created - std::chrono::seconds{1};
  EXPECT_REFUSED(cubridge::sign_bundle(in, cubin, keys.secret_key),
                 bundle_reason::invalid_manifest);
  in.expires = *in.created + std::chrono::milliseconds{500};  // the same second once cut
  EXPECT_REFUSED(cubridge::sign_bundle(in, cubin, keys.secret_key),
                 bundle_reason::invalid_manifest);
  const auto json = manifest(input());
  auto with_expires = [&](const std::string& value) {
    auto out = json;
    out.insert(out.find(",\"key_id\""), ",\"expires\":" + value);
    return out;
  };
  EXPECT_NO_THROW((void)cubridge::verify_bundle(
      signed_with_manifest(with_expires("\"2126-11-29T12:00:00Z\"")), trusted));
  for (const std::string& bad :
       {std::string("\"2026-11-29T12:00:00Z\""), std::string("\"2026-11-29T11:59:59Z\""),
        std::string("\"2126-11-29 12:00:00\""), std::string("\"never\""), std::string("\"\""),
        std::string("4102444800"), std::string("null")}) {
    SCOPED_TRACE(bad);
    EXPECT_REFUSED(cubridge::verify_bundle(signed_with_manifest(with_expires(bad)), trusted),
                   bundle_reason::invalid_manifest);
  }
  EXPECT_REFUSED(cubridge::verify_bundle(
                     signed_with_manifest(with_expires("\"2126-11-29T12:00:00Z\",\"expires\":"
                                                       "\"2127-11-29T12:00:00Z\"")),
                     trusted),
                 bundle_reason::malformed_manifest);
}

TEST_F(BundleTest, BadNamesAreRefused) {
  const std::string null_name("a\0b", 3);
  for (const auto& name :
       {std::string("a/b"), std::string("/abs"), std::string("a\\b"), std::string(".."),
        std::string("../x"), std::string("a..b"), null_name, std::string("tab\there"),
        std::string(""), std::string("."), std::string(129, 'n')}) {
    SCOPED_TRACE(name);
    EXPECT_REFUSED(cubridge::sign_bundle(input(name), cubin, keys.secret_key),
                   bundle_reason::invalid_manifest);
  }
  // The same names written by a signer that does not check them are refused by the verifier.
  const auto json = manifest(input("NAME"));
  for (const std::string_view escaped :
       {"a/b", "a\\\\b", "..", "../etc", "a\\u0000b", "a\\u001fb", "."}) {
    SCOPED_TRACE(escaped);
    auto bad = json;
    bad.replace(bad.find("NAME"), 4, escaped);
    EXPECT_REFUSED(cubridge::verify_bundle(signed_with_manifest(bad), trusted),
                   bundle_reason::invalid_manifest);
  }
  EXPECT_NO_THROW((void)cubridge::verify_bundle(
      cubridge::sign_bundle(input(std::string(128, 'n')), cubin, keys.secret_key), trusted));
}

TEST_F(BundleTest, BadTargetsAreRefusedBySigner) {
  for (const std::string_view target :
       {"sm90", "sm_9", "sm_090", "sm_1000", "compute_90", "sm_90b", "sm_", ""}) {
    SCOPED_TRACE(target);
    EXPECT_REFUSED(
        cubridge::sign_bundle(input("m", 1, std::string(target)), cubin, keys.secret_key),
        bundle_reason::invalid_manifest);
  }
  EXPECT_REFUSED(cubridge::sign_bundle(input("m", 0), cubin, keys.secret_key),
                 bundle_reason::invalid_manifest);
}

TEST_F(BundleTest, CubinForAnotherTargetIsRefused) {
  const auto bundle =
      cubridge::sign_bundle(input("m", 1, "sm_80"), cubin, keys.secret_key);  // an sm_90 cubin
  EXPECT_REFUSED(cubridge::verify_bundle(bundle, trusted), bundle_reason::target_mismatch);
  const auto other = read_file(cubridge::testing::test_cubin_other_path());  // sm_80
  EXPECT_REFUSED(
      cubridge::verify_bundle(cubridge::sign_bundle(input("m", 1, "sm_90"), other, keys.secret_key),
                              trusted),
      bundle_reason::target_mismatch);
  EXPECT_NO_THROW((void)cubridge::verify_bundle(
      cubridge::sign_bundle(input("m", 1, "sm_86"), other, keys.secret_key), trusted));
}

// With the receiver's device in its limits, verify_bundle answers "does it run here?" too, once:
// a refusal of its own, and the image it returns records the device it was checked for.
TEST_F(BundleTest, TheReceiversDeviceIsCheckedOnceAndRecorded) {
  const auto bundle = cubridge::sign_bundle(input("m", 1, "sm_90"), cubin, keys.secret_key);
  cubridge::verify_limits limits;
  const auto unchecked = cubridge::verify_bundle(bundle, trusted, limits);
  ASSERT_TRUE(unchecked.image.has_value());
  EXPECT_FALSE(unchecked.image->checked_for.has_value()) << "no device named, none recorded";

  limits.device = cubridge::compute_capability{9, 0};
  const auto here = cubridge::verify_bundle(bundle, trusted, limits);
  ASSERT_TRUE(here.image.has_value());
  EXPECT_EQ(here.image->checked_for, (cubridge::compute_capability{9, 0}));

  limits.device = cubridge::compute_capability{8, 0};  // an sm_90 cubin cannot run on sm_80
  try {
    (void)cubridge::verify_bundle(bundle, trusted, limits);
    ADD_FAILURE() << "an sm_90 cubin verified for an sm_80 device";
  } catch (const cubridge::bundle_error& e) {
    EXPECT_EQ(e.reason(), bundle_reason::wrong_device);
    EXPECT_NE(std::string(e.what()).find("sm_80"), std::string::npos) << e.what();
  }
  // CUDA source is compiled by the receiver for exactly its device: the numbers must agree.
  const std::string source = "extern \"C\" __global__ void k() {}";
  const auto text = std::as_bytes(std::span(source));
  const auto for_90 = cubridge::sign_bundle(
      input("m", 1, "sm_90", cubridge::payload_kind::cuda_source), text, keys.secret_key);
  limits.device = cubridge::compute_capability{9, 0};
  EXPECT_NO_THROW((void)cubridge::verify_bundle(for_90, trusted, limits));
  limits.device = cubridge::compute_capability{8, 6};
  EXPECT_REFUSED(cubridge::verify_bundle(for_90, trusted, limits), bundle_reason::wrong_device);
}

TEST_F(BundleTest, PayloadKindLieIsRefused) {
  const auto bundle = cubridge::sign_bundle(input("m", 1, "sm_90", cubridge::payload_kind::fatbin),
                                            cubin, keys.secret_key);
  EXPECT_REFUSED(cubridge::verify_bundle(bundle, trusted), bundle_reason::payload_kind_mismatch);
  const auto fatbin = read_file(cubridge::testing::test_fatbin_path());
  EXPECT_REFUSED(
      cubridge::verify_bundle(cubridge::sign_bundle(input(), fatbin, keys.secret_key), trusted),
      bundle_reason::payload_kind_mismatch);
  const auto text = as_bytes("this is not an image");
  EXPECT_REFUSED(
      cubridge::verify_bundle(cubridge::sign_bundle(input(), text, keys.secret_key), trusted),
      bundle_reason::payload_kind_mismatch);
  EXPECT_REFUSED(
      cubridge::verify_bundle(
          cubridge::sign_bundle(input("m", 1, "sm_90", cubridge::payload_kind::cuda_source), cubin,
                                keys.secret_key),
          trusted),
      bundle_reason::payload_kind_mismatch);  // a cubin has NUL bytes
}

TEST_F(BundleTest, KeysRoundTripAsText) {
  const auto public_text = cubridge::to_text(keys.public_key);
  EXPECT_TRUE(public_text.starts_with("cubridge-ed25519-public "));
  EXPECT_EQ(public_text.size(), 24u + 64u + 1u);
  EXPECT_EQ(cubridge::public_key_from_text(public_text), keys.public_key);
  const auto secret = cubridge::secret_key_from_text(cubridge::to_text(keys.secret_key));
  EXPECT_EQ(secret.public_key(), keys.public_key);
  EXPECT_EQ(cubridge::to_hex(keys.public_key.id()).size(), 16u);
  const std::vector<std::string> bad_texts = {
      "", "cubridge-ed25519-public ", "cubridge-ed25519-public 00",
      public_text.substr(0, public_text.size() - 3) + "zz\n",
      "cubridge-ed25519-secret " + public_text.substr(24)};
  for (const auto& bad : bad_texts) {
    EXPECT_REFUSED(cubridge::public_key_from_text(bad), bundle_reason::bad_key);
  }
  EXPECT_REFUSED(cubridge::secret_key_from_text(public_text), bundle_reason::bad_key);
}

TEST_F(BundleTest, KeysRoundTripAsFiles) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("cubridge_bundle_keys_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  cubridge::write_key_file(dir / "k.pub", keys.public_key);
  cubridge::write_key_file(dir / "k.key", keys.secret_key);
  EXPECT_EQ(std::filesystem::status(dir / "k.key").permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  EXPECT_EQ(cubridge::read_public_key_file(dir / "k.pub"), keys.public_key);
  const auto secret = cubridge::read_secret_key_file(dir / "k.key");
  const auto bundle = cubridge::sign_bundle(input(), cubin, secret);
  EXPECT_NO_THROW((void)cubridge::verify_bundle(bundle, trusted));
  try {
    (void)cubridge::read_public_key_file(dir / "missing.pub");
    ADD_FAILURE();
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::io));
  }
  std::filesystem::remove_all(dir);
}

// The key files' readers are built on detail/file_io.hpp: a FIFO is refused, not waited on,
// and a key is written without following a link at its path.
TEST(KeyFiles, ReadersRefuseAFifoInsteadOfWaitingOnIt) {
  temp_dir dir;
  const auto fifo = make_fifo(dir.path / "k.key");
  expect_io_error(thrown_reading_fifo(fifo, [&] { (void)cubridge::read_secret_key_file(fifo); }),
                  {"is a FIFO"});
  expect_io_error(thrown_reading_fifo(fifo, [&] { (void)cubridge::read_public_key_file(fifo); }),
                  {"is a FIFO"});
}

TEST(KeyFiles, WriteKeyFileReplacesALinkAndTightensAnExistingFile) {
  temp_dir dir;
  const auto keys = cubridge::generate_keypair();
  write_text(dir.path / "victim", "precious");
  std::filesystem::create_symlink(dir.path / "victim", dir.path / "k.key");
  cubridge::write_key_file(dir.path / "k.key", keys.secret_key);
  EXPECT_EQ(as_text(read_file(dir.path / "victim")), "precious")
      << "the secret key went through the link";
  EXPECT_FALSE(std::filesystem::is_symlink(dir.path / "k.key"));
  EXPECT_EQ(cubridge::read_secret_key_file(dir.path / "k.key").public_key(), keys.public_key);

  write_text(dir.path / "loose.key", "old");
  ::chmod((dir.path / "loose.key").c_str(), 0644);
  cubridge::write_key_file(dir.path / "loose.key", keys.secret_key);
  struct ::stat st {};
  ASSERT_EQ(::stat((dir.path / "loose.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

// The names of bundle_reason and payload_kind (detail/enum_names.hpp tables) and of the code
// bundle_error carries, as they were before they moved onto tables.
TEST(BundleNames, ReasonsKeepTheirSpelling) {
  using r = cubridge::bundle_reason;
  constexpr std::array<std::pair<r, std::string_view>, 15> expected{{
      {r::too_large, "too_large"},
      {r::bad_magic, "bad_magic"},
      {r::unsupported_version, "unsupported_version"},
      {r::malformed, "malformed"},
      {r::malformed_manifest, "malformed_manifest"},
      {r::invalid_manifest, "invalid_manifest"},
      {r::unknown_key, "unknown_key"},
      {r::unsigned_bundle, "unsigned_bundle"},
      {r::bad_signature, "bad_signature"},
      {r::expired, "expired"},
      {r::payload_mismatch, "payload_mismatch"},
      {r::payload_kind_mismatch, "payload_kind_mismatch"},
      {r::target_mismatch, "target_mismatch"},
      {r::wrong_device, "wrong_device"},
      {r::bad_key, "bad_key"},
  }};
  for (const auto& [value, name] : expected) EXPECT_EQ(cubridge::to_string(value), name);
  EXPECT_EQ(cubridge::to_string(static_cast<r>(99)), "unknown");
}

TEST(BundleNames, PayloadKindsKeepTheirSpelling) {
  using k = cubridge::payload_kind;
  EXPECT_EQ(cubridge::to_string(k::cubin), "cubin");
  EXPECT_EQ(cubridge::to_string(k::fatbin), "fatbin");
  EXPECT_EQ(cubridge::to_string(k::cuda_source), "cuda_source");
  EXPECT_EQ(cubridge::to_string(static_cast<k>(99)), "unknown");
}

TEST(BundleNames, UpdateErrcKeepsItsSpelling) {
  EXPECT_EQ(cubridge::to_string(cubridge::update_errc::bad_bundle), "CUBRIDGE_BAD_BUNDLE");
}

}  // namespace
