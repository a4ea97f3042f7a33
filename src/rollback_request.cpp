// Signed rollback requests; the format is specified in docs/update-endpoint.md.
#include <cubridge/rollback_request.hpp>

#include <sodium.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <set>
#include <vector>

namespace cubridge {
namespace {

using json = nlohmann::json;
constexpr std::string_view signature_domain = "cubridge rollback v1";
constexpr std::size_t signature_bytes = crypto_sign_BYTES;
constexpr const char* verify_call = "verify_rollback_request";

[[noreturn]] void refuse(bundle_reason reason, const char* call, std::string involved,
                         std::source_location where = std::source_location::current()) {
  throw bundle_error(reason, call, std::move(involved), where);
}

void ensure_sodium() {
  static const int result = sodium_init();
  if (result < 0)
    detail::throw_errc(errc::precondition, "sodium_init", "libsodium failed to initialise");
}

std::string hex(std::span<const unsigned char> bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out += digits[b >> 4];
    out += digits[b & 0xF];
  }
  return out;
}

// Exactly out.size() * 2 lower-case hex digits.
bool parse_lower_hex(std::string_view text, std::span<unsigned char> out) {
  if (text.size() != out.size() * 2) return false;
  auto digit = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < out.size(); ++i) {
    const int hi = digit(text[2 * i]), lo = digit(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<unsigned char>(hi * 16 + lo);
  }
  return true;
}

std::vector<unsigned char> signed_message(std::string_view line) {
  // Sized once and filled with memcpy: g++ 12 -O3 warns falsely (-Warray-bounds) on insert().
  std::vector<unsigned char> message(signature_domain.size() + line.size());
  std::memcpy(message.data(), signature_domain.data(), signature_domain.size());
  if (!line.empty()) std::memcpy(message.data() + signature_domain.size(), line.data(), line.size());
  return message;
}

std::string sign_line(std::string_view line, const secret_key& key) {
  ensure_sodium();
  std::array<unsigned char, crypto_sign_PUBLICKEYBYTES> pk{};
  std::array<unsigned char, crypto_sign_SECRETKEYBYTES> sk{};
  crypto_sign_seed_keypair(pk.data(), sk.data(),
                           reinterpret_cast<const unsigned char*>(key.seed().data()));
  const auto message = signed_message(line);
  std::array<unsigned char, signature_bytes> signature{};
  crypto_sign_detached(signature.data(), nullptr, message.data(), message.size(), sk.data());
  sodium_memzero(sk.data(), sk.size());
  return std::string(line) + "\n" + hex(signature) + "\n";
}

// Line 1 as one flat JSON object: a DOM parse with a callback that refuses nesting and
// duplicate keys (nlohmann would keep the last of duplicates silently).
json parse_request_line(std::string_view line) {
  std::set<std::string> keys;
  std::string problem;
  bool duplicate = false;
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) {
    if ((event == json::parse_event_t::object_start && depth > 0) ||
        event == json::parse_event_t::array_start) {
      if (problem.empty()) problem = "request holds a nested object or array";
      return false;
    }
    if (event == json::parse_event_t::key && !keys.insert(parsed.get<std::string>()).second) {
      duplicate = true;
      if (problem.empty()) problem = "duplicate field '" + parsed.get<std::string>() + "'";
    }
    return true;
  };
  json request;
  try {
    request = json::parse(line.begin(), line.end(), callback);
  } catch (const json::exception& e) {
    refuse(bundle_reason::malformed_manifest, verify_call, e.what());
  }
  if (duplicate) refuse(bundle_reason::malformed_manifest, verify_call, problem);
  if (!problem.empty()) refuse(bundle_reason::invalid_manifest, verify_call, problem);
  if (!request.is_object())
    refuse(bundle_reason::invalid_manifest, verify_call, "request is not a JSON object");
  return request;
}

const std::string& text_field(const json& request, const char* name) {
  const auto it = request.find(name);
  if (it == request.end())
    refuse(bundle_reason::invalid_manifest, verify_call, std::string("missing field '") + name + "'");
  if (!it->is_string())
    refuse(bundle_reason::invalid_manifest, verify_call,
           std::string("field '") + name + "' is not a string");
  return it->get_ref<const std::string&>();
}

}  // namespace

namespace detail {
std::string sign_rollback_line_unchecked(std::string_view request_line, const secret_key& key) {
  return sign_line(request_line, key);
}
}  // namespace detail

std::string sign_rollback_request(std::string_view module, std::uint64_t from_version,
                                  const secret_key& key,
                                  std::optional<std::chrono::system_clock::time_point> created) {
  constexpr const char* call = "sign_rollback_request";
  if (auto problem = check_module_name(module); !problem.empty())
    refuse(bundle_reason::invalid_manifest, call, problem);
  if (from_version == 0) refuse(bundle_reason::invalid_manifest, call, "from_version is 0");
  ensure_sodium();
  std::array<unsigned char, 16> nonce{};
  randombytes_buf(nonce.data(), nonce.size());
  json request = json::object();
  request["action"] = "rollback";
  request["module"] = std::string(module);
  request["from_version"] = from_version;
  request["nonce"] = hex(nonce);
  request["created"] = detail::format_time(std::chrono::floor<std::chrono::seconds>(
      created.value_or(std::chrono::system_clock::now())));
  request["key_id"] = to_hex(key.public_key().id());
  std::string line;
  try {
    line = request.dump();  // compact, keys sorted, one line (control characters are escaped)
  } catch (const json::exception&) {
    refuse(bundle_reason::invalid_manifest, call, "module name is not valid UTF-8");
  }
  return sign_line(line, key);
}

rollback_request verify_rollback_request(std::string_view body, const trusted_keys& keys) {
  if (body.size() > max_rollback_request_bytes)
    refuse(bundle_reason::too_large, verify_call,
           std::to_string(body.size()) + " bytes, limit " +
               std::to_string(max_rollback_request_bytes));
  // Two lines: the request as signed, then the signature; one final newline is optional.
  const auto newline = body.find('\n');
  if (newline == std::string_view::npos)
    refuse(bundle_reason::malformed, verify_call,
           "expected two lines: the request JSON, then the signature in hex");
  const std::string_view line = body.substr(0, newline);
  std::string_view signature_text = body.substr(newline + 1);
  if (signature_text.ends_with('\n')) signature_text.remove_suffix(1);
  std::array<unsigned char, signature_bytes> signature{};
  if (!parse_lower_hex(signature_text, signature))
    refuse(bundle_reason::malformed, verify_call,
           "line 2 is not a signature of 128 lower-case hex digits");

  const json request = parse_request_line(line);
  static constexpr std::array<std::string_view, 6> known = {"action", "created", "from_version",
                                                            "key_id", "module",  "nonce"};
  for (const auto& [field, value] : request.items())
    if (std::find(known.begin(), known.end(), field) == known.end())
      refuse(bundle_reason::invalid_manifest, verify_call, "unknown field '" + field + "'");

  rollback_request out;
  const auto& id_text = text_field(request, "key_id");
  std::array<unsigned char, 8> id{};
  if (!parse_lower_hex(id_text, id))
    refuse(bundle_reason::invalid_manifest, verify_call, "key_id is not 16 lower-case hex digits");
  std::memcpy(out.key_id.data(), id.data(), id.size());

  const public_key* key = keys.find(out.key_id);
  if (!key)
    refuse(bundle_reason::unknown_key, verify_call, "key " + id_text + " is not trusted");
  if (std::all_of(signature.begin(), signature.end(), [](unsigned char c) { return c == 0; }))
    refuse(bundle_reason::unsigned_bundle, verify_call, "signature is all zero");
  ensure_sodium();
  const auto message = signed_message(line);
  if (crypto_sign_verify_detached(signature.data(), message.data(), message.size(),
                                  reinterpret_cast<const unsigned char*>(key->bytes.data())) != 0)
    refuse(bundle_reason::bad_signature, verify_call,
           "signature does not verify with key " + id_text);

  // Signed by a trusted key; now the schema.
  if (text_field(request, "action") != "rollback")
    refuse(bundle_reason::invalid_manifest, verify_call, "action is not \"rollback\"");
  out.module = text_field(request, "module");
  if (auto problem = check_module_name(out.module); !problem.empty())
    refuse(bundle_reason::invalid_manifest, verify_call, problem);
  const auto version = request.find("from_version");
  if (version == request.end() || !version->is_number_unsigned())
    refuse(bundle_reason::invalid_manifest, verify_call,
           "from_version is missing or not an unsigned integer");
  out.from_version = version->get<std::uint64_t>();
  if (out.from_version == 0)
    refuse(bundle_reason::invalid_manifest, verify_call, "from_version is 0");
  out.nonce = text_field(request, "nonce");
  std::array<unsigned char, 16> nonce{};
  if (!parse_lower_hex(out.nonce, nonce))
    refuse(bundle_reason::invalid_manifest, verify_call, "nonce is not 32 lower-case hex digits");
  const auto created = detail::parse_time(text_field(request, "created"));
  if (!created)
    refuse(bundle_reason::invalid_manifest, verify_call, "created is not YYYY-MM-DDTHH:MM:SSZ");
  out.created = *created;
  return out;
}

}  // namespace cubridge
