// Signed rollback requests; the format is specified in docs/update-endpoint.md.
#include <cubridge/bundle/detail/signing.hpp>
#include <cubridge/bundle/rollback_request.hpp>
#include <cubridge/core/detail/printable.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <set>
#include <vector>

namespace cubridge {
namespace {

using json = nlohmann::json;
constexpr std::string_view signature_domain = "cubridge rollback v1";
constexpr const char* verify_call = "verify_rollback_request";

[[noreturn]] void refuse(bundle_reason reason, const char* call, std::string involved,
                         std::source_location where = std::source_location::current()) {
  throw bundle_error(reason, call, std::move(involved), where);
}

std::string sign_line(std::string_view line, const secret_key& key) {
  const auto signature = detail::sign_detached(signature_domain, line, key);
  return std::string(line) + "\n" + detail::to_hex(signature) + "\n";
}

// Line 1 as one flat JSON object: a DOM parse with a callback that refuses nesting and
// duplicate keys (nlohmann would keep the last of duplicates silently).
json parse_request_line(std::string_view line) {
  // Before the parser: nlohmann's lexer takes a NUL for the end of the input, so whatever
  // follows one (more fields, invalid UTF-8) would be signed but never read.
  if (auto problem = detail::check_signed_text(line); !problem.empty())
    refuse(bundle_reason::malformed_manifest, verify_call, "request line: " + problem);
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
      if (problem.empty())
        problem = "duplicate field " + detail::printable(parsed.get<std::string>());
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
    refuse(bundle_reason::invalid_manifest, verify_call,
           std::string("missing field '") + name + "'");
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
  std::array<std::byte, 16> nonce{};
  detail::random_bytes(nonce);
  json request = json::object();
  request["action"] = "rollback";
  request["module"] = std::string(module);
  request["from_version"] = from_version;
  request["nonce"] = detail::to_hex(nonce);
  request["created"] = detail::format_time(
      std::chrono::floor<std::chrono::seconds>(created.value_or(std::chrono::system_clock::now())));
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
  std::array<std::byte, 64> signature{};
  if (!detail::parse_lower_hex(signature_text, signature))
    refuse(bundle_reason::malformed, verify_call,
           "line 2 is not a signature of 128 lower-case hex digits");

  const json request = parse_request_line(line);
  static constexpr std::array<std::string_view, 6> known = {"action", "created", "from_version",
                                                            "key_id", "module",  "nonce"};
  for (const auto& [field, value] : request.items())
    if (std::find(known.begin(), known.end(), field) == known.end())
      refuse(bundle_reason::invalid_manifest, verify_call,
             "unknown field " + detail::printable(field));

  rollback_request out;
  const auto& id_text = text_field(request, "key_id");
  if (!detail::parse_lower_hex(id_text, out.key_id))
    refuse(bundle_reason::invalid_manifest, verify_call, "key_id is not 16 lower-case hex digits");

  const public_key* key = keys.find(out.key_id);
  if (!key) refuse(bundle_reason::unknown_key, verify_call, "key " + id_text + " is not trusted");
  if (std::all_of(signature.begin(), signature.end(),
                  [](std::byte b) { return b == std::byte{0}; }))
    refuse(bundle_reason::unsigned_bundle, verify_call, "signature is all zero");
  if (!detail::verify_detached(signature_domain, line, signature, *key))
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
  std::array<std::byte, 16> nonce{};
  if (!detail::parse_lower_hex(out.nonce, nonce))
    refuse(bundle_reason::invalid_manifest, verify_call, "nonce is not 32 lower-case hex digits");
  const auto created = detail::parse_time(text_field(request, "created"));
  if (!created)
    refuse(bundle_reason::invalid_manifest, verify_call, "created is not YYYY-MM-DDTHH:MM:SSZ");
  out.created = *created;
  return out;
}

}  // namespace cubridge
