// Signed module bundles (update/bundle.hpp): keys, sign_bundle and verify_bundle for Python.
#include "bindings.hpp"

#include <cubridge/bundle/bundle.hpp>
#include <cubridge/core/error.hpp>

#include <nanobind/operators.h>
#include <nanobind/stl/chrono.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace nb = nanobind;

namespace cubridge::python {
namespace {

using time_point = std::chrono::system_clock::time_point;

payload_kind parse_kind(const std::string& kind) {
  for (const auto k : {payload_kind::cubin, payload_kind::fatbin, payload_kind::cuda_source})
    if (kind == to_string(k)) return k;
  detail::throw_errc(errc::precondition, "cubridge.sign_bundle",
                     "kind '" + kind + "' is not one of 'cubin', 'fatbin', 'cuda_source'");
}

nb::bytes sign(const nb::bytes& payload, const secret_key& key, const std::string& name,
               std::uint64_t version, const std::string& target, const std::string& kind,
               std::optional<time_point> created, std::optional<time_point> expires) {
  bundle_manifest_input input{.name = name,
                              .version = version,
                              .target = target,
                              .kind = parse_kind(kind),
                              .created = created,
                              .expires = expires};
  return to_bytes(sign_bundle(input, byte_span(payload), key));
}

verified_bundle verify(const nb::bytes& bundle, const std::vector<public_key>& keys,
                       bool require_expiry, std::optional<double> max_age_seconds,
                       std::optional<time_point> now) {
  trusted_keys trusted;
  for (const auto& k : keys) trusted.add(k);
  verify_limits limits;
  limits.require_expiry = require_expiry;
  limits.now = now;
  if (max_age_seconds)
    limits.max_age = std::chrono::seconds(static_cast<std::int64_t>(*max_age_seconds));
  return verify_bundle(byte_span(bundle), trusted, limits);
}

void bind_keys(nb::module_& m) {
  nb::class_<public_key>(m, "PublicKey", "An Ed25519 public key that verifies bundles.")
      .def_prop_ro(
          "bytes", [](const public_key& k) { return to_bytes(k.bytes); }, "The 32 key bytes.")
      .def_prop_ro(
          "id", [](const public_key& k) { return to_hex(k.id()); },
          "The key id a manifest names (16 hex digits).")
      .def(
          "to_text", [](const public_key& k) { return to_text(k); },
          "'cubridge-ed25519-public <hex>\\n', the key file's form.")
      .def_static("from_text", &public_key_from_text, nb::arg("text"),
                  "Parses to_text's form; raises BundleError (reason 'bad_key') otherwise.")
      .def(nb::self == nb::self)
      .def("__repr__", [](const public_key& k) { return "<PublicKey " + to_hex(k.id()) + ">"; });

  nb::class_<secret_key>(m, "SecretKey", "An Ed25519 secret key that signs bundles.")
      .def_prop_ro("public_key", &secret_key::public_key, "The public key of this secret key.")
      .def(
          "to_text", [](const secret_key& k) { return to_text(k); },
          "'cubridge-ed25519-secret <hex>\\n', the key file's form (keep it secret).")
      .def_static("from_text", &secret_key_from_text, nb::arg("text"),
                  "Parses to_text's form; raises BundleError (reason 'bad_key') otherwise.")
      .def("__repr__", [](const secret_key& k) {
        return "<SecretKey of " + to_hex(k.public_key().id()) + ">";
      });

  nb::class_<keypair>(m, "KeyPair", "A public key and its secret key.")
      .def_ro("public_key", &keypair::public_key, "The public key (give it to receivers).")
      .def_ro("secret_key", &keypair::secret_key, "The secret key (sign with it).");

  m.def("generate_keypair", &generate_keypair, "A fresh Ed25519 key pair (libsodium).");
}

}  // namespace

void bind_bundles(nb::module_& m) {
  bind_keys(m);
  nb::class_<bundle_manifest>(m, "BundleManifest", "The signed manifest of a verified bundle.")
      .def_ro("name", &bundle_manifest::name, "The module's name.")
      .def_ro("version", &bundle_manifest::version, "The module's version (> 0).")
      .def_ro("target", &bundle_manifest::target, "The target architecture as signed ('sm_90').")
      .def_prop_ro(
          "kind", [](const bundle_manifest& b) { return std::string(to_string(b.kind)); },
          "'cubin', 'fatbin' or 'cuda_source'.")
      .def_ro("payload_sha256", &bundle_manifest::payload_sha256, "Hex SHA-256 of the payload.")
      .def_ro("payload_size", &bundle_manifest::payload_size, "The payload's size in bytes.")
      .def_ro("created", &bundle_manifest::created, "Creation time, 'YYYY-MM-DDTHH:MM:SSZ'.")
      .def_prop_ro(
          "expires",
          [](const bundle_manifest& b) {
            return b.expires.empty() ? std::nullopt : std::optional<std::string>(b.expires);
          },
          "Expiry time in the form of `created`, or None.")
      .def_prop_ro(
          "key_id", [](const bundle_manifest& b) { return to_hex(b.key_id); },
          "Id of the key that signed it.");

  nb::class_<verified_bundle>(m, "VerifiedBundle", "A bundle that passed every check.")
      .def_ro("manifest", &verified_bundle::manifest, "The signed manifest.")
      .def_prop_ro(
          "payload", [](const verified_bundle& b) { return to_bytes(b.payload); },
          "The payload: cubin, fatbin or CUDA C++ source.")
      .def_ro("image", &verified_bundle::image,
              "What inspect found in a cubin or fatbin payload; None for CUDA source.")
      .def_prop_ro("version", &verified_bundle::version, "manifest.version.");

  m.def("sign_bundle", &sign, nb::arg("payload"), nb::arg("secret_key"), nb::kw_only(),
        nb::arg("name"), nb::arg("version"), nb::arg("target"), nb::arg("kind") = "cubin",
        nb::arg("created") = nb::none(), nb::arg("expires") = nb::none(),
        "A signed bundle of `payload` (sign_bundle).");
  m.def("verify_bundle", &verify, nb::arg("bundle"), nb::arg("trusted_keys"), nb::kw_only(),
        nb::arg("require_expiry") = false, nb::arg("max_age_seconds") = nb::none(),
        nb::arg("now") = nb::none(),
        "The verified bundle, or BundleError naming the first failed check (verify_bundle).");
}

}  // namespace cubridge::python
