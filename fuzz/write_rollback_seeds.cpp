// Writes the seed requests of rollback_fuzz (fuzz/corpus/rollback/), signed with the fuzzers'
// fixed key (fuzz_key.hpp) and with fixed nonces, so that rewriting them changes nothing. Each
// seed is verified first: the valid ones must verify, the others must be refused for the reason
// they were written for.
//   write_rollback_seeds DIR      (scripts/fuzz-rollback says how it is run)
// Exits 0 once every seed is written and checked, 1 when one is not, 64 on a usage error.
#include <cubridge/bundle/bundle.hpp>
#include <cubridge/bundle/rollback_request.hpp>

#include "fuzz_key.hpp"

#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace {

using cubridge::bundle_reason;

class seed_writer {
 public:
  explicit seed_writer(std::filesystem::path dir) : dir_(std::move(dir)) {}

  /// Writes a seed that must verify.
  void valid(const std::string& name, const std::string& body) {
    try {
      (void)cubridge::verify_rollback_request(body, keys_);
    } catch (const cubridge::bundle_error& e) {
      fail(name, std::string("refused: ") + e.what());
    }
    write(name, body);
  }
  /// Writes a seed that must be refused for `expected`.
  void refused(const std::string& name, const std::string& body, bundle_reason expected) {
    try {
      (void)cubridge::verify_rollback_request(body, keys_);
      fail(name, "verified; expected " + std::string(cubridge::to_string(expected)));
    } catch (const cubridge::bundle_error& e) {
      if (e.reason() != expected)
        fail(name, "refused as " + std::string(cubridge::to_string(e.reason())) + ", expected " +
                       std::string(cubridge::to_string(expected)) + ": " + e.what());
    }
    write(name, body);
  }
  [[nodiscard]] int failures() const noexcept { return failures_; }

 private:
  void write(const std::string& name, const std::string& body) {
    std::ofstream out(dir_ / name, std::ios::binary);
    out.write(body.data(), static_cast<std::streamsize>(body.size()));
    if (!out.flush()) throw std::runtime_error("cannot write " + (dir_ / name).string());
  }
  void fail(const std::string& name, const std::string& why) {
    std::fprintf(stderr, "write_rollback_seeds: %s: %s\n", name.c_str(), why.c_str());
    ++failures_;
  }

  std::filesystem::path dir_;
  cubridge::trusted_keys keys_{cubridge_fuzz::fuzz_secret_key().public_key()};
  int failures_ = 0;
};

int write_seeds(const std::filesystem::path& dir) {
  const auto key = cubridge_fuzz::fuzz_secret_key();
  const auto id = cubridge::to_hex(key.public_key().id());
  seed_writer seeds(dir);
  auto sign = [&](const std::string& line) {
    return cubridge::detail::sign_rollback_line_unchecked(line, key);
  };
  // The signer's form: compact, keys sorted.
  auto line = [&](const std::string& module, const std::string& version) {
    return "{\"action\":\"rollback\",\"created\":\"2026-11-29T12:00:00Z\",\"from_version\":" +
           version + ",\"key_id\":\"" + id + "\",\"module\":\"" + module +
           "\",\"nonce\":\"00112233445566778899aabbccddeeff\"}";
  };

  const auto canonical = sign(line("filters", "7"));
  seeds.valid("valid.req", canonical);
  seeds.valid("valid_max_version.req", [&] {
    auto b = sign(line("a-b_c.d", "18446744073709551615"));
    b.pop_back();  // without the final newline
    return b;
  }());
  seeds.valid("valid_escaped_module.req", sign(line("\\u00e9t\\u00e9 \\\"q\\\"", "2")));
  seeds.valid("valid_reordered.req",
              sign("{ \"nonce\" : \"ffeeddccbbaa99887766554433221100\", \"module\": \"m\", "
                   "\"key_id\": \"" +
                   id +
                   "\", \"from_version\": 1, "
                   "\"created\": \"2000-02-29T23:59:59Z\", \"action\": \"rollback\" }"));

  const auto request_line = line("filters", "7");
  seeds.refused("one_line.req", request_line, bundle_reason::malformed);
  seeds.refused("unsigned.req", request_line + "\n" + std::string(128, '0') + "\n",
                bundle_reason::unsigned_bundle);
  auto tampered = canonical;
  tampered.replace(tampered.find("filters"), 7, "filtert");
  seeds.refused("tampered.req", tampered, bundle_reason::bad_signature);
  const auto stranger = cubridge::secret_key_from_text(
      "cubridge-ed25519-secret ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100\n");
  seeds.refused("unknown_key.req",
                cubridge::detail::sign_rollback_line_unchecked(
                    "{\"action\":\"rollback\",\"created\":\"2026-11-29T12:00:00Z\","
                    "\"from_version\":7,\"key_id\":\"" +
                        cubridge::to_hex(stranger.public_key().id()) +
                        "\",\"module\":\"filters\",\"nonce\":\"00112233445566778899aabbccddeeff\"}",
                    stranger),
                bundle_reason::unknown_key);
  auto with = [&](const std::string& extra) {
    auto l = request_line;
    l.insert(l.size() - 1, extra);
    return sign(l);
  };
  seeds.refused("extra_field.req", with(",\"extra\":1"), bundle_reason::invalid_manifest);
  seeds.refused("nested_field.req", with(",\"x\":{\"y\":[1]}"), bundle_reason::invalid_manifest);
  seeds.refused("duplicate_field.req", with(",\"module\":\"other\""),
                bundle_reason::malformed_manifest);
  seeds.refused(
      "bad_date.req",
      sign("{\"action\":\"rollback\",\"created\":\"2026-02-29T12:00:00Z\","
           "\"from_version\":7,\"key_id\":\"" +
           id + "\",\"module\":\"filters\",\"nonce\":\"00112233445566778899aabbccddeeff\"}"),
      bundle_reason::invalid_manifest);
  seeds.refused("fractional_version.req", sign(line("filters", "7.0")),
                bundle_reason::invalid_manifest);
  seeds.refused("nul_after_line.req",
                sign(request_line + std::string(1, '\0') + ",\"module\":\"other\"}"),
                bundle_reason::malformed_manifest);
  seeds.refused("exponent_version.req", sign(line("filters", "1e3")),
                bundle_reason::invalid_manifest);
  return seeds.failures() == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 64;
  }
  try {
    return write_seeds(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "write_rollback_seeds: %s\n", e.what());
    return 1;
  }
}
