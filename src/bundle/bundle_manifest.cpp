// Bundle manifests (docs/bundle-format.md, "Manifest"): the field checks shared by signing and
// verifying, the strict reader of a received manifest, and the JSON a signer writes.
#include <cubridge/bundle/bundle.hpp>
#include <cubridge/bundle/detail/signing.hpp>
#include <cubridge/core/detail/enum_names.hpp>
#include <cubridge/core/detail/hex.hpp>
#include <cubridge/core/detail/printable.hpp>

#include "bundle_internal.hpp"
#include "detail/ensure_sodium.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <string>
#include <utility>
#include <vector>

namespace cubridge {
namespace bundle_internal {
namespace {

constexpr std::size_t max_name_bytes = 128;

// Empty when fine, else what is wrong.
std::string check_name(std::string_view name) {
  if (name.empty()) return "name is empty";
  if (name.size() > max_name_bytes) return "name is longer than 128 bytes";
  if (name == ".") return "name is '.'";
  if (name.find("..") != std::string_view::npos) return "name contains '..'";
  for (char c : name) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '/' || c == '\\') return "name contains a path separator";
    if (u < 0x20 || u == 0x7F) return "name contains a control character";
  }
  return {};
}

// The manifest's spelling of each kind, the one to_string(payload_kind) returns.
constexpr std::array<detail::enum_name<payload_kind>, 3> payload_kind_names{{
    {payload_kind::cubin, "cubin"},
    {payload_kind::fatbin, "fatbin"},
    {payload_kind::cuda_source, "cuda_source"},
}};
static_assert(detail::lists_values_in_order(payload_kind_names));

std::optional<payload_kind> parse_kind(std::string_view text) {
  return detail::value_of(payload_kind_names, text);
}

// Empty when `text` has no NUL byte and is valid UTF-8 (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF), else what is wrong and at which byte.
std::string signed_text_problem(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  for (std::size_t i = 0; i < n;) {
    const unsigned c = s[i];
    if (c == 0) return "NUL byte at offset " + std::to_string(i);
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t length = 0;
    unsigned low = 0x80, high = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      length = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      length = 3;
      if (c == 0xE0) low = 0xA0;   // overlong
      if (c == 0xED) high = 0x9F;  // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      length = 4;
      if (c == 0xF0) low = 0x90;   // overlong
      if (c == 0xF4) high = 0x8F;  // above U+10FFFF
    } else {
      return "invalid UTF-8 at offset " + std::to_string(i);
    }
    if (n - i < length) return "truncated UTF-8 sequence at offset " + std::to_string(i);
    if (s[i + 1] < low || s[i + 1] > high) return "invalid UTF-8 at offset " + std::to_string(i);
    for (std::size_t k = 2; k < length; ++k)
      if (s[i + k] < 0x80 || s[i + k] > 0xBF) return "invalid UTF-8 at offset " + std::to_string(i);
    i += length;
  }
  return {};
}

using json = nlohmann::json;

// A SAX handler that accepts one flat JSON object of strings and unsigned integers, and stops
// at the first nested value, duplicate key or other value type (which a DOM parse would hide:
// nlohmann keeps the last of duplicate keys).
struct manifest_reader {
  struct field {
    std::string key;
    std::optional<std::string> text;
    std::optional<std::uint64_t> number;
  };
  std::vector<field> fields;
  int depth = 0;
  std::string schema_problem;  // set when the handler stopped the parse for a schema reason
  std::string syntax_problem;  // set by parse_error

  bool stop(std::string why) {
    if (schema_problem.empty()) schema_problem = std::move(why);
    return false;
  }
  bool value_ok() {
    if (depth != 1) return stop("manifest is not a JSON object");
    return true;
  }
  bool null() { return stop("field " + current() + " is null"); }
  bool boolean(bool) { return stop("field " + current() + " is a boolean"); }
  bool number_integer(json::number_integer_t) {
    return stop("field " + current() + " is a negative number");
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (!value_ok()) return false;
    fields.back().number = v;
    return true;
  }
  bool number_float(json::number_float_t, const json::string_t&) {
    return stop("field " + current() + " is not an unsigned integer");
  }
  bool string(json::string_t& v) {
    if (!value_ok()) return false;
    fields.back().text = std::move(v);
    return true;
  }
  bool binary(json::binary_t&) { return stop("binary value"); }
  bool start_object(std::size_t) {
    if (depth != 0) return stop("field " + current() + " is an object");
    ++depth;
    return true;
  }
  bool key(json::string_t& k) {
    for (const auto& f : fields)
      if (f.key == k) return stop("duplicate field " + detail::printable(k));
    fields.push_back({std::move(k), std::nullopt, std::nullopt});
    return true;
  }
  bool end_object() {
    --depth;
    return true;
  }
  bool start_array(std::size_t) {
    return stop(depth == 0 ? "manifest is not a JSON object"
                           : "field " + current() + " is an array");
  }
  bool end_array() { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    syntax_problem = e.what();
    return false;
  }
  // The field being read, for messages: from untrusted input, so printable and bounded.
  std::string current() const {
    return fields.empty() ? std::string("(top level)") : detail::printable(fields.back().key);
  }
};

constexpr const char* read_call = "verify_bundle (manifest)";

// The manifest's fields, each a string or an unsigned integer, in their order.
std::vector<manifest_reader::field> read_fields(std::string_view bytes) {
  constexpr const char* call = read_call;
  // Before the parser: nlohmann's lexer takes a NUL for the end of the input, so whatever
  // follows one (more JSON, invalid UTF-8) would be signed but never read.
  if (auto problem = signed_text_problem(bytes); !problem.empty())
    refuse(bundle_reason::malformed_manifest, call, "manifest: " + problem);
  manifest_reader reader;
  bool ok = false;
  try {
    ok = json::sax_parse(bytes.begin(), bytes.end(), &reader, json::input_format_t::json, true);
  } catch (const json::exception& e) {
    refuse(bundle_reason::malformed_manifest, call, e.what());
  }
  if (!ok) {
    if (!reader.syntax_problem.empty())
      refuse(bundle_reason::malformed_manifest, call, reader.syntax_problem);
    const bool duplicate = reader.schema_problem.starts_with("duplicate");
    refuse(duplicate ? bundle_reason::malformed_manifest : bundle_reason::invalid_manifest, call,
           reader.schema_problem.empty() ? "manifest rejected" : reader.schema_problem);
  }
  return std::move(reader.fields);
}

}  // namespace

bundle_manifest read_manifest(std::string_view bytes) {
  constexpr const char* call = read_call;
  const auto fields = read_fields(bytes);
  bundle_manifest m;
  const std::array<std::string_view, 9> known = {
      "name",         "version", "target", "kind",   "payload_sha256",
      "payload_size", "created", "key_id", "expires"};  // the last one optional
  for (const auto& f : fields)
    if (std::find(known.begin(), known.end(), f.key) == known.end())
      refuse(bundle_reason::invalid_manifest, call, "unknown field " + detail::printable(f.key));
  auto find = [&](std::string_view key) -> const manifest_reader::field& {
    for (const auto& f : fields)
      if (f.key == key) return f;
    refuse(bundle_reason::invalid_manifest, call, "missing field '" + std::string(key) + "'");
  };
  auto text = [&](std::string_view key) -> const std::string& {
    const auto& f = find(key);
    if (!f.text)
      refuse(bundle_reason::invalid_manifest, call,
             "field '" + std::string(key) + "' is not a string");
    return *f.text;
  };
  auto number = [&](std::string_view key) -> std::uint64_t {
    const auto& f = find(key);
    if (!f.number)
      refuse(bundle_reason::invalid_manifest, call,
             "field '" + std::string(key) + "' is not an unsigned integer");
    return *f.number;
  };

  m.name = text("name");
  if (auto problem = check_name(m.name); !problem.empty())
    refuse(bundle_reason::invalid_manifest, call, problem);
  m.version = number("version");
  if (m.version == 0) refuse(bundle_reason::invalid_manifest, call, "version is 0");
  m.target = text("target");
  const auto target = parse_compute_capability(m.target);
  if (!target) refuse(bundle_reason::invalid_manifest, call, "target is not sm_NN[a|f]");
  m.target_capability = *target;
  const auto kind = parse_kind(text("kind"));
  if (!kind)
    refuse(bundle_reason::invalid_manifest, call, "kind is not cubin, fatbin or cuda_source");
  m.kind = *kind;
  m.payload_sha256 = text("payload_sha256");
  if (!detail::is_lower_hex(m.payload_sha256, 64))
    refuse(bundle_reason::invalid_manifest, call, "payload_sha256 is not 64 lower-case hex digits");
  m.payload_size = number("payload_size");
  m.created = text("created");
  const auto created = detail::parse_time(m.created);
  if (!created)
    refuse(bundle_reason::invalid_manifest, call, "created is not YYYY-MM-DDTHH:MM:SSZ");
  m.created_time = *created;
  if (std::any_of(fields.begin(), fields.end(), [](const auto& f) { return f.key == "expires"; })) {
    m.expires = text("expires");
    m.expires_time = detail::parse_time(m.expires);
    if (!m.expires_time)
      refuse(bundle_reason::invalid_manifest, call, "expires is not YYYY-MM-DDTHH:MM:SSZ");
    if (*m.expires_time <= m.created_time)
      refuse(bundle_reason::invalid_manifest, call,
             "expires " + m.expires + " is not after created " + m.created);
  }
  const auto& id = text("key_id");
  if (!detail::is_lower_hex(id, 16) || !detail::parse_hex(id, m.key_id))
    refuse(bundle_reason::invalid_manifest, call, "key_id is not 16 lower-case hex digits");
  return m;
}

}  // namespace bundle_internal

using namespace bundle_internal;

std::string_view to_string(payload_kind kind) noexcept {
  return detail::name_of(payload_kind_names, kind, "unknown");
}

std::string check_module_name(std::string_view name) {
  return check_name(name);
}

namespace detail {

std::string manifest_json(const bundle_manifest_input& input, std::span<const std::byte> payload,
                          const public_key& signer) {
  constexpr const char* call = "sign_bundle";
  if (auto problem = check_name(input.name); !problem.empty())
    refuse(bundle_reason::invalid_manifest, call, problem);
  if (input.version == 0) refuse(bundle_reason::invalid_manifest, call, "version is 0");
  if (!parse_compute_capability(input.target))
    refuse(bundle_reason::invalid_manifest, call,
           "target is not sm_NN[a|f]: " + detail::printable(input.target));
  detail::ensure_sodium();
  const auto created = std::chrono::floor<std::chrono::seconds>(
      input.created.value_or(std::chrono::system_clock::now()));
  json m = json::object();
  m["name"] = input.name;
  m["version"] = input.version;
  m["target"] = input.target;
  m["kind"] = std::string(to_string(input.kind));
  m["payload_sha256"] = sha256_hex(payload);
  m["payload_size"] = static_cast<std::uint64_t>(payload.size());
  m["created"] = detail::format_time(created);
  if (!detail::parse_time(m["created"].get<std::string>()))
    refuse(bundle_reason::invalid_manifest, call, "created is not a year 0000 to 9999 time");
  if (input.expires) {
    const auto expires = std::chrono::floor<std::chrono::seconds>(*input.expires);
    if (expires <= created)
      refuse(bundle_reason::invalid_manifest, call,
             "expires " + detail::format_time(expires) + " is not after created " +
                 detail::format_time(created));
    if (!detail::parse_time(detail::format_time(expires)))
      refuse(bundle_reason::invalid_manifest, call, "expires is not a year 0000 to 9999 time");
    m["expires"] = detail::format_time(expires);
  }
  m["key_id"] = to_hex(signer.id());
  try {
    return m.dump();  // keys sorted, compact, UTF-8
  } catch (const json::exception&) {
    refuse(bundle_reason::invalid_manifest, call, "name is not valid UTF-8");
  }
}

std::string check_signed_text(std::string_view text) {
  return signed_text_problem(text);
}

}  // namespace detail
}  // namespace cubridge
