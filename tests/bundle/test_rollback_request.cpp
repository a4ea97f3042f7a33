// Tests of cubridge/bundle/rollback_request.hpp: signing and verifying rollback requests.
#include <cubridge/bundle/rollback_request.hpp>

#include <gtest/gtest.h>

#include "expect_refused.hpp"

#include <string>

namespace {

using cubridge::bundle_error;
using cubridge::bundle_reason;

class RollbackRequestTest : public ::testing::Test {
 protected:
  cubridge::keypair keys = cubridge::generate_keypair();
  cubridge::trusted_keys trusted{keys.public_key};
  std::chrono::sys_seconds noon =
      std::chrono::sys_days{std::chrono::year{2026} / 11 / 29} + std::chrono::hours{12};
};

TEST_F(RollbackRequestTest, RoundTrip) {
  const auto body = cubridge::sign_rollback_request("filters", 7, keys.secret_key, noon);
  const auto line = body.substr(0, body.find('\n'));
  EXPECT_EQ(line.find("{\"action\":\"rollback\",\"created\":\"2026-11-29T12:00:00Z\","
                      "\"from_version\":7,\"key_id\":\"" +
                      cubridge::to_hex(keys.public_key.id()) +
                      "\",\"module\":\"filters\","
                      "\"nonce\":\""),
            0u)
      << line;
  const auto r = cubridge::verify_rollback_request(body, trusted);
  EXPECT_EQ(r.module, "filters");
  EXPECT_EQ(r.from_version, 7u);
  EXPECT_EQ(r.created, noon);
  EXPECT_EQ(r.nonce.size(), 32u);
  EXPECT_EQ(r.key_id, keys.public_key.id());
  // Without the final newline too.
  EXPECT_EQ(cubridge::verify_rollback_request(body.substr(0, body.size() - 1), trusted).nonce,
            r.nonce);
}

TEST_F(RollbackRequestTest, EachRequestHasAFreshNonce) {
  const auto a = cubridge::verify_rollback_request(
      cubridge::sign_rollback_request("filters", 7, keys.secret_key), trusted);
  const auto b = cubridge::verify_rollback_request(
      cubridge::sign_rollback_request("filters", 7, keys.secret_key), trusted);
  EXPECT_NE(a.nonce, b.nonce);
}

TEST_F(RollbackRequestTest, SignerRefusesBadInput) {
  EXPECT_REFUSED(cubridge::sign_rollback_request("../x", 7, keys.secret_key),
                 bundle_reason::invalid_manifest);
  EXPECT_REFUSED(cubridge::sign_rollback_request("filters", 0, keys.secret_key),
                 bundle_reason::invalid_manifest);
}

TEST_F(RollbackRequestTest, EveryRefusalHasItsReason) {
  const auto body = cubridge::sign_rollback_request("filters", 7, keys.secret_key, noon);
  const auto line = body.substr(0, body.find('\n'));
  auto sign = [&](const std::string& l) {
    return cubridge::detail::sign_rollback_line_unchecked(l, keys.secret_key);
  };
  const auto id = cubridge::to_hex(keys.public_key.id());
  const std::string fields = "\"created\":\"2026-11-29T12:00:00Z\",\"key_id\":\"" + id +
                             "\",\"nonce\":\"00112233445566778899aabbccddeeff\"";

  EXPECT_REFUSED(cubridge::verify_rollback_request(std::string(5000, 'x'), trusted),
                 bundle_reason::too_large);
  EXPECT_REFUSED(cubridge::verify_rollback_request(line, trusted), bundle_reason::malformed);
  EXPECT_REFUSED(cubridge::verify_rollback_request(line + "\nabc\n", trusted),
                 bundle_reason::malformed);
  EXPECT_REFUSED(cubridge::verify_rollback_request(body + "\n", trusted), bundle_reason::malformed);
  EXPECT_REFUSED(cubridge::verify_rollback_request(sign("{\"action\":"), trusted),
                 bundle_reason::malformed_manifest);
  EXPECT_REFUSED(cubridge::verify_rollback_request(sign("{\"a\":1,\"a\":2}"), trusted),
                 bundle_reason::malformed_manifest);
  EXPECT_REFUSED(cubridge::verify_rollback_request(sign("[1]"), trusted),
                 bundle_reason::invalid_manifest);
  EXPECT_REFUSED(cubridge::verify_rollback_request(
                     sign("{\"action\":\"rollback\",\"from_version\":7,\"module\":\"filters\"," +
                          fields + ",\"extra\":1}"),
                     trusted),
                 bundle_reason::invalid_manifest);
  EXPECT_REFUSED(
      cubridge::verify_rollback_request(
          sign("{\"action\":\"promote\",\"from_version\":7,\"module\":\"filters\"," + fields + "}"),
          trusted),
      bundle_reason::invalid_manifest);
  EXPECT_REFUSED(cubridge::verify_rollback_request(
                     sign("{\"action\":\"rollback\",\"from_version\":-7,\"module\":\"filters\"," +
                          fields + "}"),
                     trusted),
                 bundle_reason::invalid_manifest);
  EXPECT_REFUSED(
      cubridge::verify_rollback_request(
          sign("{\"action\":\"rollback\",\"from_version\":7,\"module\":\"a/b\"," + fields + "}"),
          trusted),
      bundle_reason::invalid_manifest);
  EXPECT_REFUSED(cubridge::verify_rollback_request(
                     sign("{\"action\":\"rollback\",\"from_version\":7,\"module\":\"m\","
                          "\"created\":\"yesterday\",\"key_id\":\"" +
                          id + "\",\"nonce\":\"00112233445566778899aabbccddeeff\"}"),
                     trusted),
                 bundle_reason::invalid_manifest);
  EXPECT_REFUSED(cubridge::verify_rollback_request(
                     sign("{\"action\":\"rollback\",\"from_version\":7,\"module\":\"m\","
                          "\"created\":\"2026-11-29T12:00:00Z\",\"key_id\":\"" +
                          id + "\",\"nonce\":\"short\"}"),
                     trusted),
                 bundle_reason::invalid_manifest);

  const auto stranger = cubridge::generate_keypair();
  EXPECT_REFUSED(cubridge::verify_rollback_request(
                     cubridge::sign_rollback_request("filters", 7, stranger.secret_key), trusted),
                 bundle_reason::unknown_key);
  EXPECT_REFUSED(cubridge::verify_rollback_request(line + "\n" + std::string(128, '0'), trusted),
                 bundle_reason::unsigned_bundle);
  auto tampered = body;
  tampered.replace(tampered.find("filters"), 7, "filtert");
  EXPECT_REFUSED(cubridge::verify_rollback_request(tampered, trusted),
                 bundle_reason::bad_signature);
  // Another request's signature does not verify this one.
  const auto other = cubridge::sign_rollback_request("filters", 8, keys.secret_key, noon);
  EXPECT_REFUSED(cubridge::verify_rollback_request(line + other.substr(other.find('\n')), trusted),
                 bundle_reason::bad_signature);
}

// nlohmann's lexer ends its input at a NUL byte: without a check of its own, the verifier would
// accept a signed request line with anything after a NUL that another parser reads differently.
TEST_F(RollbackRequestTest, NulBytesAndInvalidUtf8AnywhereAreRefused) {
  const auto body = cubridge::sign_rollback_request("filters", 7, keys.secret_key, noon);
  const auto line = body.substr(0, body.find('\n'));
  auto sign = [&](const std::string& l) {
    return cubridge::detail::sign_rollback_line_unchecked(l, keys.secret_key);
  };
  const std::string nul(1, '\0');
  auto module = [&](const std::string& raw) {
    auto l = line;
    return l.replace(l.find("filters"), 7, raw);
  };
  for (const std::string& bad :
       {line + nul, line + nul + ",\"module\":\"other\"}", line + nul + "\xff\xfe", line + "\xff",
        module("fil\xc0\xaf"
               "ters"),
        module("fil\xed\xa0\x80"
               "ters"),
        module("fil\xe2\x82")}) {
    SCOPED_TRACE(::testing::PrintToString(bad));
    EXPECT_REFUSED(cubridge::verify_rollback_request(sign(bad), trusted),
                   bundle_reason::malformed_manifest);
  }
  // A NUL in the signature line is no signature either.
  EXPECT_REFUSED(cubridge::verify_rollback_request(body.substr(0, body.size() - 1) + nul, trusted),
                 bundle_reason::malformed);
  // Valid UTF-8 in the module name still verifies.
  EXPECT_EQ(
      cubridge::verify_rollback_request(sign(module("\xc3\xa9t\xc3\xa9\xf0\x9f\x9a\x80")), trusted)
          .module,
      "\xc3\xa9t\xc3\xa9\xf0\x9f\x9a\x80");
}

TEST_F(RollbackRequestTest, FromVersionIsExactlyAnUnsignedSixtyFourBitInteger) {
  const auto body = cubridge::sign_rollback_request("filters", 7, keys.secret_key, noon);
  const auto line = body.substr(0, body.find('\n'));
  auto with_version = [&](const std::string& version) {
    auto l = line;
    l.replace(l.find("\"from_version\":7"), 16, "\"from_version\":" + version);
    return cubridge::detail::sign_rollback_line_unchecked(l, keys.secret_key);
  };
  EXPECT_EQ(
      cubridge::verify_rollback_request(with_version("18446744073709551615"), trusted).from_version,
      18446744073709551615u);
  EXPECT_EQ(cubridge::verify_rollback_request(
                cubridge::sign_rollback_request("filters", 18446744073709551615u, keys.secret_key),
                trusted)
                .from_version,
            18446744073709551615u);
  for (const std::string& bad :
       {std::string("18446744073709551616"), std::string("1e3"), std::string("1.0"),
        std::string("-1"), std::string("-0"), std::string("\"5\""), std::string("0"),
        std::string("null"), std::string("true")}) {
    SCOPED_TRACE(bad);
    EXPECT_REFUSED(cubridge::verify_rollback_request(with_version(bad), trusted),
                   bundle_reason::invalid_manifest);
  }
}

}  // namespace
