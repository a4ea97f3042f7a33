// Server lists, redaction and credentials files (connection.hpp).
#include <cubridge/core/detail/file_io.hpp>
#include <cubridge/core/detail/printable.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/fleet/connection.hpp>

#include <algorithm>
#include <charconv>

namespace cubridge::fleet {
namespace {

constexpr std::size_t max_servers = 32;

[[noreturn]] void refuse(const std::string& what) {
  cubridge::detail::throw_errc(errc::precondition, "parse server list", what);
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

// A JetStream API prefix: dot-separated tokens of letters, digits, '_' and '-', at most 64.
bool is_subject_prefix(std::string_view prefix) {
  if (prefix.empty() || prefix.size() > 64 || prefix.front() == '.' || prefix.back() == '.')
    return false;
  char previous = 0;
  for (const char c : prefix) {
    const bool word = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '_' || c == '-';
    if (!word && !(c == '.' && previous != '.')) return false;
    previous = c;
  }
  return true;
}

// Checks one URL; throws naming it (redacted) and what is wrong.
void check_url(std::string_view url, std::size_t position, bool hide) {
  // In a list with credentials a password may hold a ',' and split an entry: then an entry is
  // named by its position only, so that no part of a password is ever printed.
  const std::string shown = hide ? "#" + std::to_string(position + 1) + " (credentials hidden)"
                                 : cubridge::detail::printable(redact_url(url), {.quoted = false});
  const auto scheme_end = url.find("://");
  if (scheme_end == std::string_view::npos)
    refuse("server '" + shown + "' is not a URL: give nats://HOST:PORT or tls://HOST:PORT");
  const auto scheme = url.substr(0, scheme_end);
  if (scheme != "nats" && scheme != "tls")
    refuse("server '" + shown + "': scheme '" +
           cubridge::detail::printable(scheme, {.quoted = false}) + "' is neither nats nor tls");
  auto rest = url.substr(scheme_end + 3);
  if (const auto at = rest.rfind('@'); at != std::string_view::npos) rest.remove_prefix(at + 1);
  if (rest.empty()) refuse("server '" + shown + "' names no host");
  std::string_view host = rest, port;
  if (rest.front() == '[') {  // [::1]:4222
    const auto close = rest.find(']');
    if (close == std::string_view::npos) refuse("server '" + shown + "': '[' without ']'");
    host = rest.substr(0, close + 1);
    const auto after = rest.substr(close + 1);
    if (!after.empty() && after.front() != ':')
      refuse("server '" + shown + "': something after the host");
    if (!after.empty()) port = after.substr(1);
  } else if (const auto colon = rest.find(':'); colon != std::string_view::npos) {
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
  }
  if (host.empty() || host == "[]") refuse("server '" + shown + "' names no host");
  for (const char c : host)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' ||
          c == '[' || c == ']' || c == ':'))
      refuse("server '" + shown + "': the host may hold only letters, digits, '.', '-', '_'");
  if (rest.find_first_of("/?# ") != std::string_view::npos)
    refuse("server '" + shown + "': nothing may follow HOST:PORT");
  if (!port.empty() || rest.back() == ':') {
    unsigned value = 0;
    const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (port.empty() || ec != std::errc{} || end != port.data() + port.size() || value == 0 ||
        value > 65535)
      refuse("server '" + shown + "': port '" +
             (hide ? std::string("...") : cubridge::detail::printable(port, {.quoted = false})) +
             "' is not 1 to 65535");
  }
}

}  // namespace

std::vector<std::string> parse_server_list(std::string_view servers) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    const auto comma = servers.find(',', start);
    const auto entry = trim(servers.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    const bool hide = servers.find('@') != std::string_view::npos;
    if (entry.empty())
      refuse(hide ? "the server list has an empty entry (#" + std::to_string(out.size() + 1) +
                        ", credentials hidden)"
                  : "the server list '" + redact_server_list(servers) + "' has an empty entry");
    check_url(entry, out.size(), hide);
    out.emplace_back(entry);
    if (out.size() > max_servers)
      refuse("the server list has more than " + std::to_string(max_servers) + " URLs");
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

std::string redact_url(std::string_view url) {
  const auto scheme_end = url.find("://");
  const auto host_start = scheme_end == std::string_view::npos ? 0 : scheme_end + 3;
  // The credentials end at the last '@' (a password may hold one); a host holds none.
  const auto at = url.rfind('@');
  if (at == std::string_view::npos || at < host_start) return std::string(url);
  return std::string(url.substr(0, host_start)) + "***" + std::string(url.substr(at));
}

std::string redact_server_list(std::string_view servers) {
  std::string out;
  std::size_t start = 0;
  for (;;) {
    const auto comma = servers.find(',', start);
    out += redact_url(servers.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    if (comma == std::string_view::npos) return out;
    out += ',';
    start = comma + 1;
  }
}

namespace {

// Calls `take(number, field, value)` for each "field value" line of `text` (value printable, no
// spaces), skipping comments and blank lines; `where(number)` names a line in errors.
template <class Take>
void for_each_field(std::string_view text, const std::string& file, std::string_view what,
                    Take take) {
  std::size_t start = 0, number = 0;
  while (start < text.size()) {
    auto end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    const auto line = trim(text.substr(start, end - start));
    start = end + 1;
    ++number;
    if (line.empty() || line.front() == '#') continue;
    const auto space = line.find(' ');
    const auto field = line.substr(0, space);
    const auto value =
        space == std::string_view::npos ? std::string_view{} : trim(line.substr(space));
    bool printable = !value.empty();
    for (const char c : value) printable = printable && c > ' ' && c < 0x7f;
    if (!printable)
      cubridge::detail::throw_errc(errc::precondition, std::string("read ") + std::string(what),
                                   "'" + file + "' line " + std::to_string(number) +
                                       ": a value of printable characters, no spaces");
    take(number, field, value);
  }
}

std::string read_small_file(const std::filesystem::path& path, std::size_t limit,
                            const char* what) {
  cubridge::detail::regular_file file(path, limit, what);
  std::vector<std::byte> bytes;
  file.read_rest(bytes);
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

}  // namespace

bus_credentials read_credentials_file(const std::filesystem::path& path, bool allow_readable) {
  cubridge::detail::regular_file file(path, max_credentials_bytes, "credentials file");
  if (!allow_readable && (file.status().st_mode & 077) != 0)
    cubridge::detail::throw_errc(
        errc::io, "read credentials file",
        "'" + path.string() + "' may be read by group or others (chmod 600 it)");
  std::vector<std::byte> bytes;
  file.read_rest(bytes);
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  bus_credentials out;
  for_each_field(text, path.string(), "credentials file",
                 [&](std::size_t number, std::string_view field, std::string_view value) {
                   const auto where = "'" + path.string() + "' line " + std::to_string(number);
                   if (field == "user")
                     out.user = value;
                   else if (field == "password")
                     out.password = value;
                   else if (field == "api_prefix" && is_subject_prefix(value))
                     out.api_prefix = value;
                   else if (field == "api_prefix")
                     cubridge::detail::throw_errc(errc::precondition, "read credentials file",
                                                  where +
                                                      ": api_prefix is dot-separated tokens of "
                                                      "letters, digits, '_' and '-'");
                   else
                     cubridge::detail::throw_errc(
                         errc::precondition, "read credentials file",
                         where + ": unknown field '" +
                             cubridge::detail::printable(field, {.quoted = false}) +
                             "' (user, password, api_prefix)");
                 });
  if (out.user.empty() || out.password.empty())
    cubridge::detail::throw_errc(errc::precondition, "read credentials file",
                                 "'" + path.string() + "' needs a user and a password line");
  return out;
}

void write_credentials_file(const std::filesystem::path& path, const bus_credentials& credentials,
                            std::string_view comment) {
  std::string text;
  if (!comment.empty()) text += "# " + std::string(comment) + "\n";
  text += "user " + credentials.user + "\npassword " + credentials.password + "\n";
  if (!credentials.api_prefix.empty()) text += "api_prefix " + credentials.api_prefix + "\n";
  cubridge::detail::write_file_atomically(path, std::as_bytes(std::span(text.data(), text.size())),
                                          0600, false, "credentials file");
}

bus_options read_bus_profile(const std::filesystem::path& path) {
  const auto text = read_small_file(path, max_profile_bytes, "fleet profile");
  bus_options out;
  std::vector<std::string> seen;
  const auto folder = path.parent_path();
  const auto relative = [&](std::string_view value) {
    const std::filesystem::path p(value);
    return p.is_absolute() || folder.empty() ? p : folder / p;
  };
  for_each_field(text, path.string(), "fleet profile",
                 [&](std::size_t number, std::string_view field, std::string_view value) {
                   const auto where = "'" + path.string() + "' line " + std::to_string(number);
                   const auto wrong = [&](const std::string& why) {
                     cubridge::detail::throw_errc(errc::precondition, "read fleet profile",
                                                  where + ": " + why);
                   };
                   if (std::find(seen.begin(), seen.end(), field) != seen.end())
                     wrong("'" + std::string(field) + "' given twice");
                   seen.emplace_back(field);
                   if (field == "server") {
                     try {
                       (void)parse_server_list(value);
                     } catch (const error& e) {
                       wrong(e.what());
                     }
                     out.servers = value;
                   } else if (field == "credentials") {
                     out.credentials = relative(value);
                   } else if (field == "ca") {
                     out.ca_file = relative(value);
                   } else if (field == "replicas") {
                     if (value.size() != 1 || value[0] < '1' || value[0] > '5')
                       wrong("replicas is 1 to 5");
                     out.replicas = value[0] - '0';
                   } else {
                     wrong("unknown field '" +
                           cubridge::detail::printable(field, {.quoted = false}) +
                           "' (server, credentials, ca, replicas)");
                   }
                 });
  return out;
}

void write_bus_profile(const std::filesystem::path& path, const bus_options& bus,
                       std::string_view comment) {
  std::string text;
  if (!comment.empty()) text += "# " + std::string(comment) + "\n";
  text += "server " + bus.servers + "\n";
  if (!bus.credentials.empty()) text += "credentials " + bus.credentials.string() + "\n";
  if (!bus.ca_file.empty()) text += "ca " + bus.ca_file.string() + "\n";
  if (bus.replicas != 1) text += "replicas " + std::to_string(bus.replicas) + "\n";
  cubridge::detail::write_file_atomically(path, std::as_bytes(std::span(text.data(), text.size())),
                                          0644, false, "fleet profile");
}

std::string api_prefix_of(const bus_options& bus) {
  if (!bus.api_prefix.empty() || bus.credentials.empty()) return bus.api_prefix;
  return read_credentials_file(bus.credentials).api_prefix;
}

}  // namespace cubridge::fleet
