// The keys, certificates and password hashes of `cubridge fleet init` (fleet_init_pki.hpp).
#include "fleet/fleet_init_pki.hpp"

#include <cubridge/core/error.hpp>

#include <crypt.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>

#include <cerrno>
#include <cstring>

namespace cubridge::tool::fleet_init_internal {

namespace {

[[noreturn]] void fail_io(const std::string& call, const std::string& involved) {
  cubridge::detail::throw_errc(errc::io, call, involved);
}

// OpenSSL's reason for the last failure (its error queue emptied).
std::string openssl_reason() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "no reason given";
  char text[256];
  ERR_error_string_n(code, text, sizeof text);
  return text;
}

}  // namespace

void fail_openssl(const char* call, const std::string& involved) {
  fail_io(std::string(call) + " (" + openssl_reason() + ")", involved);
}

// ---------------------------------------------------------------------------------------------
// Keys and certificates.

key_ptr make_ec_key(const std::string& what) {
  key_ptr key(EVP_EC_gen("P-256"));
  if (!key) fail_openssl("EVP_EC_gen", what);
  return key;
}

std::string pem_of(const certificate_ptr& cert) {
  std::unique_ptr<BIO, openssl_free> bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_X509(bio.get(), cert.get()) != 1)
    fail_openssl("PEM_write_bio_X509", "a certificate");
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<std::size_t>(size));
}

wiped_string pem_of(const key_ptr& key) {
  std::unique_ptr<BIO, openssl_free> bio(BIO_new(BIO_s_secmem()));
  if (!bio ||
      PEM_write_bio_PrivateKey(bio.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr) != 1)
    fail_openssl("PEM_write_bio_PrivateKey", "a private key");
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return wiped_string(std::string(data, static_cast<std::size_t>(size)));
}

namespace {

void add_extension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  std::unique_ptr<X509_EXTENSION, openssl_free> extension(
      X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str()));
  if (!extension || X509_add_ext(cert, extension.get(), -1) != 1)
    fail_openssl("X509V3_EXT_conf_nid", std::string(OBJ_nid2sn(nid)) + " = " + value);
}

}  // namespace

certificate_ptr make_certificate(EVP_PKEY* key, const std::string& common_name, X509* issuer,
                                 EVP_PKEY* issuer_key,
                                 const std::vector<std::pair<int, std::string>>& extensions) {
  certificate_ptr cert(X509_new());
  if (!cert) fail_openssl("X509_new", common_name);
  unsigned char serial_bytes[16];
  if (RAND_bytes(serial_bytes, sizeof serial_bytes) != 1)
    fail_openssl("RAND_bytes", "a serial number");
  serial_bytes[0] &= 0x7f;  // positive
  serial_bytes[0] |= 0x40;  // and never shorter than 16 bytes
  std::unique_ptr<BIGNUM, openssl_free> serial(
      BN_bin2bn(serial_bytes, sizeof serial_bytes, nullptr));
  X509_NAME* name = X509_get_subject_name(cert.get());
  const auto add_name = [&](const char* field, const std::string& value) {
    if (X509_NAME_add_entry_by_txt(name, field, MBSTRING_UTF8,
                                   reinterpret_cast<const unsigned char*>(value.c_str()), -1, -1,
                                   0) != 1)
      fail_openssl("X509_NAME_add_entry_by_txt", value);
  };
  add_name("O", "cubridge fleet");
  add_name("CN", common_name);
  const bool ok =
      serial && X509_set_version(cert.get(), X509_VERSION_3) == 1 &&
      BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(cert.get())) &&
      X509_gmtime_adj(X509_getm_notBefore(cert.get()), -300) &&
      X509_time_adj_ex(X509_getm_notAfter(cert.get()), validity_days, 0, nullptr) &&
      X509_set_pubkey(cert.get(), key) == 1 &&
      X509_set_issuer_name(cert.get(), issuer ? X509_get_subject_name(issuer) : name) == 1;
  if (!ok) fail_openssl("X509 fields", common_name);
  X509* signer = issuer ? issuer : cert.get();
  for (const auto& [nid, value] : extensions) add_extension(cert.get(), signer, nid, value);
  if (X509_sign(cert.get(), issuer_key, EVP_sha256()) <= 0) fail_openssl("X509_sign", common_name);
  return cert;
}

// ---------------------------------------------------------------------------------------------
// Passwords.

wiped_string random_password() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof bytes) != 1) fail_openssl("RAND_bytes", "a password");
  static constexpr char digits[] = "0123456789abcdef";
  wiped_string text;
  text.text.reserve(2 * sizeof bytes);
  for (const unsigned char b : bytes) {
    text.text.push_back(digits[b >> 4]);
    text.text.push_back(digits[b & 15]);
  }
  OPENSSL_cleanse(bytes, sizeof bytes);
  return text;
}

std::string bcrypt_hash(const wiped_string& password) {
  char setting[CRYPT_GENSALT_OUTPUT_SIZE];
  if (!crypt_gensalt_rn("$2b$", bcrypt_cost, nullptr, 0, setting, sizeof setting))
    fail_io("crypt_gensalt_rn", std::string("a bcrypt salt: ") + std::strerror(errno));
  const auto data = std::make_unique<crypt_data>();
  const char* hash = crypt_rn(password.text.c_str(), setting, data.get(), sizeof *data);
  std::string result = hash ? hash : "";
  OPENSSL_cleanse(data.get(), sizeof *data);
  if (!result.starts_with("$2b$")) fail_io("crypt_rn", "a bcrypt hash of a password");
  return result;
}

}  // namespace cubridge::tool::fleet_init_internal
