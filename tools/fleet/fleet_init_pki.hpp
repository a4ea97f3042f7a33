#pragma once
// The keys, certificates and password hashes of `cubridge fleet init` (fleet_init.cpp):
// certificates through OpenSSL 3's C API, bcrypt hashes through libcrypt (nats-server checks a
// "$2b$" hash itself). Internal to the tool.

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace cubridge::tool::fleet_init_internal {

/// bcrypt's cost: the passwords are 256 random bits, so no cost makes guessing one any harder
/// and the cost only slows every connect down, on the server (it checks the hash once per
/// connect). At 10 it was ~50 ms of server CPU per connection: 100 nodes booting together
/// timed out their handshakes on 2 cores and were closed for good. 4 is bcrypt's least
/// (docs/fleet.md, "A connect storm", has the measured cost per connect).
inline constexpr int bcrypt_cost = 4;
/// Certificates live 10 years (a new init makes new ones).
inline constexpr long validity_days = 3652;

struct openssl_free {
  void operator()(EVP_PKEY* p) const noexcept { EVP_PKEY_free(p); }
  void operator()(X509* p) const noexcept { X509_free(p); }
  void operator()(X509_EXTENSION* p) const noexcept { X509_EXTENSION_free(p); }
  void operator()(BIO* p) const noexcept { BIO_free(p); }
  void operator()(BIGNUM* p) const noexcept { BN_free(p); }
};
using key_ptr = std::unique_ptr<EVP_PKEY, openssl_free>;
using certificate_ptr = std::unique_ptr<X509, openssl_free>;

/// Erases a secret held in a string before it goes.
struct wiped_string {
  std::string text;
  wiped_string() = default;
  explicit wiped_string(std::string t) : text(std::move(t)) {}
  wiped_string(wiped_string&& other) noexcept : text(std::move(other.text)) {}
  wiped_string(const wiped_string&) = delete;
  wiped_string& operator=(const wiped_string&) = delete;
  ~wiped_string() { OPENSSL_cleanse(text.data(), text.size()); }
};

/// @throws error (errc::io) naming `call`, OpenSSL's reason and `involved`.
[[noreturn]] void fail_openssl(const char* call, const std::string& involved);

/// A new P-256 key (`what` names it in errors).
[[nodiscard]] key_ptr make_ec_key(const std::string& what);
/// PEM text of a certificate; of a private key (in secure memory, wiped).
[[nodiscard]] std::string pem_of(const certificate_ptr& cert);
[[nodiscard]] wiped_string pem_of(const key_ptr& key);
/// A certificate of `key` named `common_name`, signed by `issuer_key` (with `issuer` its
/// certificate; null: self-signed), with a random 127-bit serial and `extensions` (nid, value).
[[nodiscard]] certificate_ptr make_certificate(
    EVP_PKEY* key, const std::string& common_name, X509* issuer, EVP_PKEY* issuer_key,
    const std::vector<std::pair<int, std::string>>& extensions);

/// 256 random bits in hex.
[[nodiscard]] wiped_string random_password();
/// The bcrypt hash of `password` as nats-server takes it in place of the password.
[[nodiscard]] std::string bcrypt_hash(const wiped_string& password);

}  // namespace cubridge::tool::fleet_init_internal
