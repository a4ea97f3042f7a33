// Signed module bundles; the format is specified in docs/bundle-format.md.
#include <cubridge/core/detail/enum_names.hpp>
#include <cubridge/core/detail/file_io.hpp>
#include <cubridge/core/detail/hex.hpp>
#include <cubridge/core/image.hpp>
#include <cubridge/update/bundle.hpp>
#include <cubridge/update/detail/signing.hpp>

#include "detail/ensure_sodium.hpp"

#include <sodium.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace cubridge {
namespace {

constexpr std::string_view magic = "CUBRIDGEB";
constexpr std::uint8_t format_version = 1;
constexpr std::string_view signature_domain = "cubridge bundle v1";
constexpr std::size_t signature_bytes = 64;
constexpr std::size_t header_bytes = 9 + 1;  // magic, format version
constexpr std::size_t max_name_bytes = 128;
constexpr std::string_view public_key_prefix = "cubridge-ed25519-public ";
constexpr std::string_view secret_key_prefix = "cubridge-ed25519-secret ";

static_assert(crypto_sign_BYTES == signature_bytes);
static_assert(crypto_sign_PUBLICKEYBYTES == 32 && crypto_sign_SEEDBYTES == 32);

[[noreturn]] void refuse(bundle_reason reason, std::string call, std::string involved,
                         std::source_location where = std::source_location::current()) {
  throw bundle_error(reason, std::move(call), std::move(involved), where);
}

using detail::ensure_sodium;

const unsigned char* as_uchar(const std::byte* p) {
  return reinterpret_cast<const unsigned char*>(p);
}
unsigned char* as_uchar(std::byte* p) {
  return reinterpret_cast<unsigned char*>(p);
}

std::string sha256_hex(std::span<const std::byte> payload) {
  std::array<std::byte, crypto_hash_sha256_BYTES> digest{};
  crypto_hash_sha256(as_uchar(digest.data()), as_uchar(payload.data()), payload.size());
  return detail::to_hex(digest);
}

// What a signature covers: the domain-separation string, then the message bytes.
std::vector<unsigned char> signed_message(std::string_view domain, std::string_view message) {
  // Sized once and filled with memcpy: g++ 12 -O3 warns falsely (-Warray-bounds) on insert().
  std::vector<unsigned char> out(domain.size() + message.size());
  std::memcpy(out.data(), domain.data(), domain.size());
  if (!message.empty()) std::memcpy(out.data() + domain.size(), message.data(), message.size());
  return out;
}

// --- manifest field checks (shared by signing and verifying) -------------------------------

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

// "sm_" + 2 or 3 digits (no leading zero) + optional "a" or "f"; returns major*10+minor or 0.
int parse_target(std::string_view target) {
  if (target.size() < 5 || target.substr(0, 3) != "sm_") return 0;
  std::string_view digits = target.substr(3);
  if (digits.back() == 'a' || digits.back() == 'f') digits.remove_suffix(1);
  if (digits.size() < 2 || digits.size() > 3 || digits.front() == '0') return 0;
  int value = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return 0;
    value = value * 10 + (c - '0');
  }
  return value;
}

// The manifest's spelling of each kind, the one to_string(payload_kind) returns.
constexpr std::array<detail::enum_name<payload_kind>, 3> payload_kind_names{{
    {payload_kind::cubin, "cubin"},
    {payload_kind::fatbin, "fatbin"},
    {payload_kind::cuda_source, "cuda_source"},
}};
static_assert(detail::lists_values_in_order(payload_kind_names));

constexpr std::array<detail::enum_name<bundle_reason>, 14> bundle_reason_names{{
    {bundle_reason::too_large, "too_large"},
    {bundle_reason::bad_magic, "bad_magic"},
    {bundle_reason::unsupported_version, "unsupported_version"},
    {bundle_reason::malformed, "malformed"},
    {bundle_reason::malformed_manifest, "malformed_manifest"},
    {bundle_reason::invalid_manifest, "invalid_manifest"},
    {bundle_reason::unknown_key, "unknown_key"},
    {bundle_reason::unsigned_bundle, "unsigned_bundle"},
    {bundle_reason::bad_signature, "bad_signature"},
    {bundle_reason::expired, "expired"},
    {bundle_reason::payload_mismatch, "payload_mismatch"},
    {bundle_reason::payload_kind_mismatch, "payload_kind_mismatch"},
    {bundle_reason::target_mismatch, "target_mismatch"},
    {bundle_reason::bad_key, "bad_key"},
}};
static_assert(detail::lists_values_in_order(bundle_reason_names));

std::optional<payload_kind> parse_kind(std::string_view text) {
  return detail::value_of(payload_kind_names, text);
}

std::string format_time_text(std::chrono::sys_seconds t) {
  const auto days = std::chrono::floor<std::chrono::days>(t);
  const std::chrono::year_month_day ymd{days};
  const std::chrono::hh_mm_ss hms{t - days};
  char text[32];
  std::snprintf(text, sizeof text, "%04d-%02u-%02uT%02d:%02d:%02dZ", static_cast<int>(ymd.year()),
                static_cast<unsigned>(ymd.month()), static_cast<unsigned>(ymd.day()),
                static_cast<int>(hms.hours().count()), static_cast<int>(hms.minutes().count()),
                static_cast<int>(hms.seconds().count()));
  return text;
}

// Strict RFC 3339 UTC in whole seconds: "YYYY-MM-DDTHH:MM:SSZ".
std::optional<std::chrono::sys_seconds> parse_time_text(std::string_view s) {
  if (s.size() != 20 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' ||
      s[16] != ':' || s[19] != 'Z')
    return std::nullopt;
  auto number = [&](std::size_t at, std::size_t n) -> int {
    int v = 0;
    for (std::size_t i = at; i < at + n; ++i) {
      if (s[i] < '0' || s[i] > '9') return -1;
      v = v * 10 + (s[i] - '0');
    }
    return v;
  };
  const int year = number(0, 4), month = number(5, 2), day = number(8, 2);
  const int hour = number(11, 2), minute = number(14, 2), second = number(17, 2);
  if (year < 0 || month < 0 || day < 0 || hour < 0 || hour > 23 || minute < 0 || minute > 59 ||
      second < 0 || second > 59)
    return std::nullopt;
  const std::chrono::year_month_day ymd{std::chrono::year{year},
                                        std::chrono::month{static_cast<unsigned>(month)},
                                        std::chrono::day{static_cast<unsigned>(day)}};
  if (!ymd.ok()) return std::nullopt;
  return std::chrono::sys_days{ymd} + std::chrono::hours{hour} + std::chrono::minutes{minute} +
         std::chrono::seconds{second};
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

// --- strict manifest reader -----------------------------------------------------------------

std::string printable(std::string_view name);

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
      if (f.key == k) return stop("duplicate field " + printable(k));
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
    return fields.empty() ? std::string("(top level)") : printable(fields.back().key);
  }
};

bundle_manifest read_manifest(std::string_view bytes) {
  constexpr const char* call = "verify_bundle (manifest)";
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

  bundle_manifest m;
  const std::array<std::string_view, 9> known = {
      "name",         "version", "target", "kind",   "payload_sha256",
      "payload_size", "created", "key_id", "expires"};  // the last one optional
  for (const auto& f : reader.fields)
    if (std::find(known.begin(), known.end(), f.key) == known.end())
      refuse(bundle_reason::invalid_manifest, call, "unknown field " + printable(f.key));
  auto find = [&](std::string_view key) -> const manifest_reader::field& {
    for (const auto& f : reader.fields)
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
  m.target_sm = parse_target(m.target);
  if (m.target_sm == 0) refuse(bundle_reason::invalid_manifest, call, "target is not sm_NN[a|f]");
  const auto kind = parse_kind(text("kind"));
  if (!kind)
    refuse(bundle_reason::invalid_manifest, call, "kind is not cubin, fatbin or cuda_source");
  m.kind = *kind;
  m.payload_sha256 = text("payload_sha256");
  if (!detail::is_lower_hex(m.payload_sha256, 64))
    refuse(bundle_reason::invalid_manifest, call, "payload_sha256 is not 64 lower-case hex digits");
  m.payload_size = number("payload_size");
  m.created = text("created");
  const auto created = parse_time_text(m.created);
  if (!created)
    refuse(bundle_reason::invalid_manifest, call, "created is not YYYY-MM-DDTHH:MM:SSZ");
  m.created_time = *created;
  if (std::any_of(reader.fields.begin(), reader.fields.end(),
                  [](const auto& f) { return f.key == "expires"; })) {
    m.expires = text("expires");
    m.expires_time = parse_time_text(m.expires);
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

std::uint64_t read_le(std::span<const std::byte> bytes) {
  std::uint64_t v = 0;
  for (std::size_t i = bytes.size(); i-- > 0;)
    v = (v << 8) | std::to_integer<std::uint64_t>(bytes[i]);
  return v;
}

void append_le(std::vector<std::byte>& out, std::uint64_t v, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xFF));
}

std::string printable(std::string_view name) {
  // Names in messages come from untrusted input: show printable ASCII only.
  std::string out = "'";
  for (char c : name.substr(0, 64)) out += (c >= 0x20 && c < 0x7F) ? c : '?';
  return out + (name.size() > 64 ? "...'" : "'");
}

}  // namespace

// --- names and errors -------------------------------------------------------------------------

std::string_view to_string(bundle_reason reason) noexcept {
  return detail::name_of(bundle_reason_names, reason, "unknown");
}

std::string_view to_string(payload_kind kind) noexcept {
  return detail::name_of(payload_kind_names, kind, "unknown");
}

bundle_error::bundle_error(bundle_reason reason, std::string call, std::string involved,
                           std::source_location where)
    : error(update_error_domain, static_cast<int>(update_errc::bad_bundle),
            "bundle refused, " + std::string(to_string(reason)), std::move(call),
            std::move(involved), where),
      reason_(reason) {}

std::string check_module_name(std::string_view name) {
  return check_name(name);
}

// --- keys -------------------------------------------------------------------------------------

std::string to_hex(const key_id& id) {
  return detail::to_hex(id);
}

key_id public_key::id() const {
  ensure_sodium();
  std::array<unsigned char, crypto_generichash_BYTES> digest{};  // BLAKE2b-256, unkeyed
  crypto_generichash(digest.data(), digest.size(), as_uchar(bytes.data()), bytes.size(), nullptr,
                     0);
  key_id out{};
  std::memcpy(out.data(), digest.data(), out.size());
  return out;
}

secret_key::secret_key(std::span<const std::byte, 32> seed) noexcept {
  std::copy(seed.begin(), seed.end(), seed_.begin());
}
secret_key::secret_key(secret_key&& other) noexcept : seed_(other.seed_) {
  sodium_memzero(other.seed_.data(), other.seed_.size());
}
secret_key& secret_key::operator=(secret_key&& other) noexcept {
  if (this != &other) {
    seed_ = other.seed_;
    sodium_memzero(other.seed_.data(), other.seed_.size());
  }
  return *this;
}
secret_key::~secret_key() {
  sodium_memzero(seed_.data(), seed_.size());
}

cubridge::public_key secret_key::public_key() const {
  ensure_sodium();
  cubridge::public_key pk;
  std::array<unsigned char, crypto_sign_SECRETKEYBYTES> sk{};
  crypto_sign_seed_keypair(as_uchar(pk.bytes.data()), sk.data(), as_uchar(seed_.data()));
  sodium_memzero(sk.data(), sk.size());
  return pk;
}

keypair generate_keypair() {
  ensure_sodium();
  std::array<std::byte, 32> seed{};
  randombytes_buf(seed.data(), seed.size());
  secret_key sk{std::span<const std::byte, 32>(seed)};
  sodium_memzero(seed.data(), seed.size());
  auto pk = sk.public_key();
  return keypair{pk, std::move(sk)};
}

std::string to_text(const public_key& key) {
  return std::string(public_key_prefix) + detail::to_hex(key.bytes) + "\n";
}
std::string to_text(const secret_key& key) {
  return std::string(secret_key_prefix) + detail::to_hex(key.seed()) + "\n";
}

namespace {
std::array<std::byte, 32> key_bytes_from_text(std::string_view text, std::string_view prefix,
                                              const char* call) {
  if (text.ends_with('\n')) text.remove_suffix(1);
  std::array<std::byte, 32> bytes{};
  if (!text.starts_with(prefix) || !detail::parse_hex(text.substr(prefix.size()), bytes))
    refuse(bundle_reason::bad_key, call, "expected \"" + std::string(prefix) + "<64 hex digits>\"");
  return bytes;
}

// A regular file only (a FIFO would block the reader), sized before it is read.
std::string read_small_file(const std::filesystem::path& path) {
  auto bytes = detail::read_regular_file(path, 4096, "key file");
  std::string text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  sodium_memzero(bytes.data(), bytes.size());
  return text;
}

// Through a fresh file renamed into place: a symlink at `path` is replaced, never written
// through, and a reader never sees half a key.
void write_text_file(const std::filesystem::path& path, const std::string& text, mode_t mode) {
  detail::write_file_atomically(path, std::as_bytes(std::span(text)), mode, true, "key file");
}
}  // namespace

public_key public_key_from_text(std::string_view text) {
  return public_key{key_bytes_from_text(text, public_key_prefix, "public_key_from_text")};
}

secret_key secret_key_from_text(std::string_view text) {
  auto seed = key_bytes_from_text(text, secret_key_prefix, "secret_key_from_text");
  secret_key key{std::span<const std::byte, 32>(seed)};
  sodium_memzero(seed.data(), seed.size());
  return key;
}

void write_key_file(const std::filesystem::path& path, const public_key& key) {
  write_text_file(path, to_text(key), 0644);
}
void write_key_file(const std::filesystem::path& path, const secret_key& key) {
  auto text = to_text(key);
  write_text_file(path, text, 0600);
  sodium_memzero(text.data(), text.size());
}
public_key read_public_key_file(const std::filesystem::path& path) {
  return public_key_from_text(read_small_file(path));
}
secret_key read_secret_key_file(const std::filesystem::path& path) {
  auto text = read_small_file(path);
  auto key = secret_key_from_text(text);
  sodium_memzero(text.data(), text.size());
  return key;
}

trusted_keys::trusted_keys(std::initializer_list<public_key> keys) {
  for (const auto& k : keys) add(k);
}
void trusted_keys::add(const public_key& key) {
  if (std::find(keys_.begin(), keys_.end(), key) == keys_.end()) keys_.push_back(key);
}
const public_key* trusted_keys::find(const key_id& id) const noexcept {
  for (const auto& k : keys_) {
    try {
      if (k.id() == id) return &k;
    } catch (...) {  // only if libsodium cannot initialise; then no key is usable
      return nullptr;
    }
  }
  return nullptr;
}

// --- signing ----------------------------------------------------------------------------------

namespace detail {

std::string manifest_json(const bundle_manifest_input& input, std::span<const std::byte> payload,
                          const public_key& signer) {
  constexpr const char* call = "sign_bundle";
  if (auto problem = check_name(input.name); !problem.empty())
    refuse(bundle_reason::invalid_manifest, call, problem);
  if (input.version == 0) refuse(bundle_reason::invalid_manifest, call, "version is 0");
  if (parse_target(input.target) == 0)
    refuse(bundle_reason::invalid_manifest, call,
           "target is not sm_NN[a|f]: " + printable(input.target));
  ensure_sodium();
  const auto created = std::chrono::floor<std::chrono::seconds>(
      input.created.value_or(std::chrono::system_clock::now()));
  json m = json::object();
  m["name"] = input.name;
  m["version"] = input.version;
  m["target"] = input.target;
  m["kind"] = std::string(to_string(input.kind));
  m["payload_sha256"] = sha256_hex(payload);
  m["payload_size"] = static_cast<std::uint64_t>(payload.size());
  m["created"] = format_time_text(created);
  if (!parse_time_text(m["created"].get<std::string>()))
    refuse(bundle_reason::invalid_manifest, call, "created is not a year 0000 to 9999 time");
  if (input.expires) {
    const auto expires = std::chrono::floor<std::chrono::seconds>(*input.expires);
    if (expires <= created)
      refuse(bundle_reason::invalid_manifest, call,
             "expires " + format_time_text(expires) + " is not after created " +
                 format_time_text(created));
    if (!parse_time_text(format_time_text(expires)))
      refuse(bundle_reason::invalid_manifest, call, "expires is not a year 0000 to 9999 time");
    m["expires"] = format_time_text(expires);
  }
  m["key_id"] = to_hex(signer.id());
  try {
    return m.dump();  // keys sorted, compact, UTF-8
  } catch (const json::exception&) {
    refuse(bundle_reason::invalid_manifest, call, "name is not valid UTF-8");
  }
}

std::string format_time(std::chrono::sys_seconds time) {
  return format_time_text(time);
}
std::optional<std::chrono::sys_seconds> parse_time(std::string_view text) {
  return parse_time_text(text);
}

std::string check_signed_text(std::string_view text) {
  return signed_text_problem(text);
}

std::string printable(std::string_view text) {
  return cubridge::printable(text);
}

std::vector<std::byte> sign_bundle_unchecked(std::string_view manifest,
                                             std::span<const std::byte> payload,
                                             const secret_key& key) {
  ensure_sodium();
  CUBRIDGE_EXPECTS(manifest.size() <= std::numeric_limits<std::uint32_t>::max(),
                   "manifest over 4 GiB");
  std::vector<std::byte> out;
  out.reserve(header_bytes + 4 + manifest.size() + 8 + payload.size() + signature_bytes);
  for (char c : magic) out.push_back(static_cast<std::byte>(c));
  out.push_back(static_cast<std::byte>(format_version));
  append_le(out, manifest.size(), 4);
  for (char c : manifest) out.push_back(static_cast<std::byte>(c));
  append_le(out, payload.size(), 8);
  out.insert(out.end(), payload.begin(), payload.end());

  const auto signature = sign_detached(signature_domain, manifest, key);
  out.insert(out.end(), signature.begin(), signature.end());
  return out;
}

void random_bytes(std::span<std::byte> out) {
  ensure_sodium();
  randombytes_buf(out.data(), out.size());
}

std::array<std::byte, 64> sign_detached(std::string_view domain, std::string_view message,
                                        const secret_key& key) {
  ensure_sodium();
  std::array<unsigned char, crypto_sign_PUBLICKEYBYTES> pk{};
  std::array<unsigned char, crypto_sign_SECRETKEYBYTES> sk{};
  crypto_sign_seed_keypair(pk.data(), sk.data(), as_uchar(key.seed().data()));
  const auto signed_bytes = signed_message(domain, message);
  std::array<std::byte, 64> signature{};
  crypto_sign_detached(as_uchar(signature.data()), nullptr, signed_bytes.data(),
                       signed_bytes.size(), sk.data());
  sodium_memzero(sk.data(), sk.size());
  return signature;
}

bool verify_detached(std::string_view domain, std::string_view message,
                     std::span<const std::byte, 64> signature, const public_key& key) {
  ensure_sodium();
  const auto signed_bytes = signed_message(domain, message);
  return crypto_sign_verify_detached(as_uchar(signature.data()), signed_bytes.data(),
                                     signed_bytes.size(), as_uchar(key.bytes.data())) == 0;
}

}  // namespace detail

std::vector<std::byte> sign_bundle(const bundle_manifest_input& input,
                                   std::span<const std::byte> payload, const secret_key& key) {
  return detail::sign_bundle_unchecked(detail::manifest_json(input, payload, key.public_key()),
                                       payload, key);
}

// --- verifying --------------------------------------------------------------------------------

verified_bundle verify_bundle(std::span<const std::byte> bytes, const trusted_keys& keys,
                              const verify_limits& limits) {
  constexpr const char* call = "verify_bundle";
  // 1. Size, before reading a single byte.
  if (bytes.size() > limits.max_bundle_bytes)
    refuse(
        bundle_reason::too_large, call,
        std::to_string(bytes.size()) + " bytes, limit " + std::to_string(limits.max_bundle_bytes));
  // 2. Magic and format version.
  if (bytes.size() < magic.size() || std::memcmp(bytes.data(), magic.data(), magic.size()) != 0)
    refuse(bundle_reason::bad_magic, call, "does not start with \"CUBRIDGEB\"");
  if (bytes.size() < header_bytes)
    refuse(bundle_reason::malformed, call, "truncated before the format version");
  if (std::to_integer<std::uint8_t>(bytes[magic.size()]) != format_version)
    refuse(bundle_reason::unsupported_version, call,
           "format version " + std::to_string(std::to_integer<unsigned>(bytes[magic.size()])) +
               ", expected 1");
  // 3. Lengths: each compared with what remains, so no sum can overflow.
  auto rest = bytes.subspan(header_bytes);
  if (rest.size() < 4) refuse(bundle_reason::malformed, call, "truncated in the manifest length");
  const std::uint64_t manifest_size = read_le(rest.first(4));
  rest = rest.subspan(4);
  if (manifest_size > limits.max_manifest_bytes)
    refuse(bundle_reason::too_large, call,
           "manifest of " + std::to_string(manifest_size) + " bytes, limit " +
               std::to_string(limits.max_manifest_bytes));
  if (manifest_size > rest.size())
    refuse(bundle_reason::malformed, call, "truncated in the manifest");
  const auto manifest_bytes = rest.first(static_cast<std::size_t>(manifest_size));
  rest = rest.subspan(manifest_bytes.size());
  if (rest.size() < 8) refuse(bundle_reason::malformed, call, "truncated in the payload length");
  const std::uint64_t payload_size = read_le(rest.first(8));
  rest = rest.subspan(8);
  if (payload_size > rest.size())
    refuse(bundle_reason::malformed, call, "truncated in the payload");
  const auto payload = rest.first(static_cast<std::size_t>(payload_size));
  rest = rest.subspan(payload.size());
  if (rest.size() < signature_bytes)
    refuse(bundle_reason::malformed, call, "truncated in the signature");
  if (rest.size() > signature_bytes)
    refuse(bundle_reason::malformed, call,
           std::to_string(rest.size() - signature_bytes) + " bytes after the signature");
  const auto signature = rest.first<signature_bytes>();

  // 4. Manifest syntax and schema.
  const std::string_view manifest_text(reinterpret_cast<const char*>(manifest_bytes.data()),
                                       manifest_bytes.size());
  bundle_manifest manifest = read_manifest(manifest_text);
  const std::string who =
      "module " + printable(manifest.name) + " v" + std::to_string(manifest.version);

  // 5. Key id trusted.
  const public_key* key = keys.find(manifest.key_id);
  if (!key)
    refuse(bundle_reason::unknown_key, call,
           who + ": key " + to_hex(manifest.key_id) + " is not trusted");

  // 6. Signature.
  if (std::all_of(signature.begin(), signature.end(),
                  [](std::byte b) { return b == std::byte{0}; }))
    refuse(bundle_reason::unsigned_bundle, call, who + ": signature is all zero");
  if (!detail::verify_detached(signature_domain, manifest_text, signature, *key))
    refuse(bundle_reason::bad_signature, call,
           who + ": signature does not verify with key " + to_hex(manifest.key_id));

  // 7. Expiry, against the receiver's clock: only once the signature vouches for the times.
  const auto now = std::chrono::floor<std::chrono::seconds>(
      limits.now.value_or(std::chrono::system_clock::now()));
  if (manifest.expires_time && now >= *manifest.expires_time)
    refuse(bundle_reason::expired, call,
           who + ": expired at " + manifest.expires + ", it is " + format_time_text(now));
  if (!manifest.expires_time && limits.require_expiry)
    refuse(bundle_reason::expired, call,
           who + ": has no expires field and this receiver requires one");
  if (limits.max_age && now - manifest.created_time > *limits.max_age)
    refuse(bundle_reason::expired, call,
           who + ": created " + manifest.created + ", more than " +
               std::to_string(limits.max_age->count()) + " s before " + format_time_text(now));

  // 8. Payload size and hash.
  if (manifest.payload_size != payload.size())
    refuse(bundle_reason::payload_mismatch, call,
           who + ": payload is " + std::to_string(payload.size()) + " bytes, manifest says " +
               std::to_string(manifest.payload_size));
  if (sha256_hex(payload) != manifest.payload_sha256)
    refuse(bundle_reason::payload_mismatch, call,
           who + ": payload SHA-256 differs from the manifest's");

  // 9. Payload kind and target.
  if (manifest.kind == payload_kind::cuda_source) {
    if (std::find(payload.begin(), payload.end(), std::byte{0}) != payload.end())
      refuse(bundle_reason::payload_kind_mismatch, call, who + ": CUDA source contains a NUL byte");
  } else {
    image_info info;
    try {
      info = inspect_image(payload);
    } catch (const error& e) {
      refuse(bundle_reason::payload_kind_mismatch, call,
             who + ": payload is not a " + std::string(to_string(manifest.kind)) + ": " + e.what());
    }
    const auto expected =
        manifest.kind == payload_kind::cubin ? image_kind::cubin : image_kind::fatbin;
    if (info.kind != expected)
      refuse(bundle_reason::payload_kind_mismatch, call,
             who + ": manifest says " + std::string(to_string(manifest.kind)) + ", payload is " +
                 std::string(to_string(info.kind)));
    bool runs = false;
    try {
      runs = can_run_on(info, manifest.target_sm / 10, manifest.target_sm % 10);
    } catch (const error&) {
      runs = false;
    }
    if (!runs)
      refuse(bundle_reason::target_mismatch, call,
             who + ": image has no code that runs on " + manifest.target);
  }
  return verified_bundle{std::move(manifest),
                         std::vector<std::byte>(payload.begin(), payload.end())};
}

}  // namespace cubridge
