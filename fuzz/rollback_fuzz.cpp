// libFuzzer target for cubridge::verify_rollback_request: any body must either verify or raise
// cubridge::bundle_error; anything else (a crash, a sanitizer report, another exception, a
// timeout, a broken invariant below) is a bug. The trusted key is fixed (fuzz_key.hpp) so that the
// seeds in fuzz/corpus/rollback/ (signed with it by fuzz/write_rollback_seeds.cpp) reach the
// checks after the signature.
//
// A mutated line 1 no longer matches its signature, so each input is also verified a second time
// with line 1 re-signed by the fixed key: that is what carries the fuzzer into the schema checks
// (action, module name, from_version, nonce, created). The freshness window and the nonce memory
// are the endpoint's (src/update/update_endpoint.cpp) and are not reached from here.
#include <cubridge/bundle/rollback_request.hpp>

#include "fuzz_key.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

namespace {

const cubridge::secret_key& fuzz_secret_key() {
  static const cubridge::secret_key key = cubridge_fuzz::fuzz_secret_key();
  return key;
}

const cubridge::trusted_keys& fuzz_keys() {
  static const cubridge::trusted_keys keys{fuzz_secret_key().public_key()};
  return keys;
}

void require(bool holds, const char* what) {
  if (holds) return;
  std::fprintf(stderr, "rollback_fuzz: invariant broken: %s\n", what);
  std::abort();
}

bool is_lower_hex(std::string_view text) {
  for (char c : text)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// Verifies `body`; nullopt when refused with the library's error. Any other exception escapes
// to libFuzzer, which reports it.
std::optional<cubridge::rollback_request> verify(std::string_view body) {
  try {
    return cubridge::verify_rollback_request(body, fuzz_keys());
  } catch (const cubridge::bundle_error&) {
    return std::nullopt;
  }
}

// What verify_rollback_request promises about a request it returns, and the round trips: the
// time through its text form, and the fields through sign_rollback_request (which must accept
// whatever the verifier accepted and write a body that verifies to the same fields).
void check_verified(const cubridge::rollback_request& request) {
  require(cubridge::check_module_name(request.module).empty(), "verified module name is invalid");
  require(request.from_version != 0, "verified from_version is 0");
  require(request.nonce.size() == 32 && is_lower_hex(request.nonce),
          "verified nonce is not 32 lower-case hex digits");
  require(request.key_id == fuzz_secret_key().public_key().id(), "verified key id is not trusted");

  const auto time_text = cubridge::detail::format_time(request.created);
  require(cubridge::detail::parse_time(time_text) == request.created,
          "created does not survive format_time/parse_time");

  // sign_rollback_request takes a system_clock::time_point (nanoseconds: years 1677 to 2262)
  // while created may be any year from 0000 to 9999; outside that range the re-signed request
  // is made at the epoch instead (converting would overflow).
  using std::chrono::seconds;
  using clock = std::chrono::system_clock;
  const bool signer_can_hold_created =
      request.created >= std::chrono::ceil<seconds>(clock::time_point::min()) &&
      request.created <= std::chrono::floor<seconds>(clock::time_point::max());
  const auto created_for_signer =
      signer_can_hold_created ? clock::time_point(request.created) : clock::time_point{};
  const auto resigned = cubridge::verify_rollback_request(
      cubridge::sign_rollback_request(request.module, request.from_version, fuzz_secret_key(),
                                      created_for_signer),
      fuzz_keys());
  require(resigned.module == request.module, "re-signed module differs");
  require(resigned.from_version == request.from_version, "re-signed from_version differs");
  require(!signer_can_hold_created || resigned.created == request.created,
          "re-signed created differs");
  require(resigned.key_id == request.key_id, "re-signed key id differs");
  require(resigned.nonce != request.nonce, "sign_rollback_request reused the nonce");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);

  // 1. The body as sent.
  if (const auto request = verify(body)) check_verified(*request);

  // 2. Line 1 (the whole input when it has no newline) signed as is by the trusted key.
  const std::string_view line = body.substr(0, body.find('\n'));
  if (line.size() + 2 + 128 > cubridge::max_rollback_request_bytes) return 0;
  const std::string signed_body =
      cubridge::detail::sign_rollback_line_unchecked(line, fuzz_secret_key());
  if (const auto request = verify(signed_body)) check_verified(*request);
  return 0;
}
