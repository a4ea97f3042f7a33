// Tests of cubridge/bundle/unverified_bundle.hpp: a bundle read as verify_bundle reads it, with
// the same limits and refusals up to the manifest, and nothing after (signature, key, payload).
#include <cubridge/bundle/bundle.hpp>
#include <cubridge/bundle/detail/signing.hpp>
#include <cubridge/bundle/unverified_bundle.hpp>

#include "gpu_test.hpp"  // the test image paths and read_bytes

#include <gtest/gtest.h>

#include "expect_refused.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace {

using cubridge::bundle_reason;
using cubridge::read_bundle_unverified;
using bytes = std::vector<std::byte>;

bytes as_bytes(std::string_view text) {
  bytes out(text.size());
  std::memcpy(out.data(), text.data(), text.size());
  return out;
}

class UnverifiedBundle : public ::testing::Test {
 protected:
  cubridge::keypair keys = cubridge::generate_keypair();
  bytes cubin = cubridge::testing::read_bytes(cubridge::testing::test_cubin_path());  // sm_90
  cubridge::bundle_manifest_input input{.name = "filters", .version = 3, .target = "sm_90"};
  bytes bundle = cubridge::sign_bundle(input, cubin, keys.secret_key);
};

TEST_F(UnverifiedBundle, ReadsWhatVerifyBundleReads) {
  const auto read = read_bundle_unverified(bundle);
  const auto verified = cubridge::verify_bundle(bundle, {keys.public_key});
  EXPECT_EQ(read.manifest.name, "filters");
  EXPECT_EQ(read.manifest.version, 3u);
  EXPECT_EQ(read.manifest.target, "sm_90");
  EXPECT_EQ(read.manifest.key_id, keys.public_key.id());
  EXPECT_EQ(read.manifest.payload_sha256, verified.manifest.payload_sha256);
  EXPECT_EQ(read.manifest.created, verified.manifest.created);
  EXPECT_EQ(read.payload, cubin);
}

// What it does not check, by design: anyone may write these bytes.
TEST_F(UnverifiedBundle, TrustsNothingAfterTheManifest) {
  bytes unsigned_bundle = bundle;
  std::fill(unsigned_bundle.end() - 64, unsigned_bundle.end(), std::byte{0});
  EXPECT_EQ(read_bundle_unverified(unsigned_bundle).manifest.name, "filters");
  EXPECT_REFUSED(cubridge::verify_bundle(unsigned_bundle, {keys.public_key}),
                 bundle_reason::unsigned_bundle);

  bytes tampered_payload = bundle;
  tampered_payload[tampered_payload.size() - 64 - 1] ^= std::byte{1};
  EXPECT_EQ(read_bundle_unverified(tampered_payload).payload.back(), cubin.back() ^ std::byte{1});
}

TEST_F(UnverifiedBundle, RefusesAsVerifyBundleDoesUpToTheManifest) {
  EXPECT_REFUSED(read_bundle_unverified(as_bytes("CUBRIDGE")), bundle_reason::bad_magic);
  EXPECT_REFUSED(read_bundle_unverified(as_bytes("an ELF, say")), bundle_reason::bad_magic);
  bytes version_2 = bundle;
  version_2[9] = std::byte{2};
  EXPECT_REFUSED(read_bundle_unverified(version_2), bundle_reason::unsupported_version);
  for (const std::size_t cut :
       {std::size_t{9}, std::size_t{12}, std::size_t{40}, bundle.size() / 2, bundle.size() - 1})
    EXPECT_REFUSED(read_bundle_unverified(std::span(bundle).first(cut)), bundle_reason::malformed);
  bytes trailing = bundle;
  trailing.push_back(std::byte{0});
  EXPECT_REFUSED(read_bundle_unverified(trailing), bundle_reason::malformed);
  const auto bad_name = cubridge::detail::sign_bundle_unchecked(R"({"name":"a/b","version":1})",
                                                                cubin, keys.secret_key);
  EXPECT_REFUSED(read_bundle_unverified(bad_name), bundle_reason::invalid_manifest);
  const auto not_json =
      cubridge::detail::sign_bundle_unchecked("{\"name\":", cubin, keys.secret_key);
  EXPECT_REFUSED(read_bundle_unverified(not_json), bundle_reason::malformed_manifest);
}

TEST_F(UnverifiedBundle, AppliesTheSizeLimitsBeforeParsing) {
  cubridge::verify_limits limits;
  limits.max_bundle_bytes = bundle.size() - 1;
  EXPECT_REFUSED(read_bundle_unverified(bundle, limits), bundle_reason::too_large);
  limits = {};
  limits.max_manifest_bytes = 10;
  EXPECT_REFUSED(read_bundle_unverified(bundle, limits), bundle_reason::too_large);
  // Too large is said before the magic is read: a 64 MiB file of anything is not parsed.
  limits = {};
  limits.max_bundle_bytes = 4;
  EXPECT_REFUSED(read_bundle_unverified(as_bytes("not a bundle")), bundle_reason::bad_magic);
  EXPECT_REFUSED(read_bundle_unverified(as_bytes("not a bundle"), limits),
                 bundle_reason::too_large);
}

TEST(BundleMagic, TellsABundleFromAnImageByItsFirstBytes) {
  EXPECT_TRUE(cubridge::has_bundle_magic(as_bytes("CUBRIDGEB")));
  EXPECT_TRUE(cubridge::has_bundle_magic(as_bytes("CUBRIDGEB\x01 and anything")));
  EXPECT_FALSE(cubridge::has_bundle_magic(as_bytes("CUBRIDGE")));
  EXPECT_FALSE(
      cubridge::has_bundle_magic(as_bytes("\x7f"
                                          "ELF")));
  EXPECT_FALSE(cubridge::has_bundle_magic({}));
}

}  // namespace
