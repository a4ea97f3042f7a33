#include "update/arguments.hpp"

#include "update/server_text.hpp"

#include <cubridge/bundle/bundle.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <map>

namespace cubridge::tool {
namespace {

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string shown(std::string_view s) {
  return "'" + printable(s, 100) + "'";
}

}  // namespace

std::optional<std::uint64_t> parse_version(std::string_view text) {
  if (!all_digits(text) || text.front() == '0') return std::nullopt;
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size()) return std::nullopt;  // > 2^64-1
  return value;
}

CLI::Validator version_validator() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (parse_version(text)) return {};
        if (all_digits(text) && text.find_first_not_of('0') == std::string::npos)
          return shown(text) + " is not a version: versions start at 1";
        if (all_digits(text) && text.front() != '0')
          return shown(text) + " is over 18446744073709551615 (2^64-1), the largest version";
        return shown(text) +
               " is not a version: write it in decimal digits, 1 to 18446744073709551615, with "
               "no sign, spaces, leading zeros or 0x";
      },
      "VERSION", "module version");
}

CLI::Validator duration_transform(bool unit_required) {
  const auto options = static_cast<CLI::AsNumberWithUnit::Options>(
      CLI::AsNumberWithUnit::CASE_SENSITIVE |
      (unit_required ? CLI::AsNumberWithUnit::UNIT_REQUIRED
                     : CLI::AsNumberWithUnit::UNIT_OPTIONAL));
  return CLI::AsNumberWithUnit(
      std::map<std::string, double>{{"ms", 0.001}, {"s", 1}, {"m", 60}, {"h", 3600}, {"d", 86400}},
      options, "UNIT");
}

parsed_duration parse_duration(std::string_view text, bool unit_required) {
  std::string value(text);
  std::string error;
  try {
    error = duration_transform(unit_required)(value);  // CLI11 throws some reasons, returns others
  } catch (const CLI::Error& e) {
    error = e.what();
  }
  if (!error.empty()) return {0, error};
  double seconds = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), seconds);
  if (ec != std::errc{} || end != value.data() + value.size() || !std::isfinite(seconds))
    return {0, "'" + value + "' seconds is not a finite number"};
  return {seconds, {}};
}

std::chrono::system_clock::time_point parse_expires(std::string_view text,
                                                    std::chrono::system_clock::time_point now) {
  using namespace std::chrono;
  if (const auto at = detail::parse_time(text)) {
    if (*at <= now) throw usage_error("--expires " + shown(text) + " is not in the future");
    return *at;
  }
  const auto [seconds, why] = parse_duration(text, true);
  if (!why.empty())
    throw usage_error("--expires " + shown(text) +
                      " is neither a duration (30m, 12h, 7d: a number and s, m, h or d) nor an "
                      "RFC 3339 UTC time (2027-01-31T00:00:00Z): " +
                      why);
  if (seconds < 1) throw usage_error("--expires " + shown(text) + " is under one second");
  constexpr double limit = 100.0 * 366 * 86400;  // 100 years
  if (seconds > limit) throw usage_error("--expires " + shown(text) + " is over 100 years");
  return now + std::chrono::seconds{static_cast<std::int64_t>(seconds)};
}

std::string endpoint_url::text() const {
  const bool ipv6 = host.find(':') != std::string::npos;
  return scheme + "://" + (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

endpoint_url parse_endpoint_url(std::string_view url) {
  const auto bad = [&](const std::string& why) -> usage_error {
    return usage_error("the endpoint URL " + shown(url) + " " + why +
                       " (write http://HOST:PORT or https://HOST:PORT)");
  };
  endpoint_url out;
  const auto colon_slashes = url.find("://");
  if (colon_slashes == std::string_view::npos) throw bad("has no scheme");
  for (const char c : url.substr(0, colon_slashes))
    out.scheme += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  if (out.scheme != "http" && out.scheme != "https")
    throw bad("has the scheme " + shown(out.scheme) + ": only http and https are spoken");
  auto rest = url.substr(colon_slashes + 3);
  while (rest.ends_with('/')) rest.remove_suffix(1);  // "http://host:7070/" is the same endpoint
  if (const auto at = rest.find_first_of("/?#"); at != std::string_view::npos)
    throw bad("has a path, query or fragment (" + shown(rest.substr(at)) +
              "): the endpoint's paths are fixed");
  if (rest.find('@') != std::string_view::npos) throw bad("has user info ('@'), which is not sent");
  std::optional<std::string_view> port;  // none: the scheme's own
  if (rest.starts_with('[')) {
    const auto close = rest.find(']');
    if (close == std::string_view::npos) throw bad("has an IPv6 address without its ']'");
    out.host = std::string(rest.substr(1, close - 1));
    const auto after = rest.substr(close + 1);
    if (!after.empty() && !after.starts_with(':')) throw bad("has text after the IPv6 address");
    if (!after.empty()) port = after.substr(1);
    const bool ipv6 =
        !out.host.empty() && std::all_of(out.host.begin(), out.host.end(), [](char c) {
          return std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.';
        });
    if (!ipv6) throw bad("has a malformed IPv6 address");
  } else {
    const auto colon = rest.find(':');
    out.host = std::string(rest.substr(0, colon));
    if (colon != std::string_view::npos) port = rest.substr(colon + 1);
    const bool name = std::all_of(out.host.begin(), out.host.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
    });
    if (out.host.empty()) throw bad("has no host");
    if (!name) throw bad("has a malformed host name");
  }
  if (!port) {
    out.port = out.scheme == "https" ? 443 : 80;
  } else {
    int value = 0;
    const bool number =
        all_digits(*port) && port->size() <= 5 &&
        std::from_chars(port->data(), port->data() + port->size(), value).ec == std::errc{};
    if (!number || value < 1 || value > 65535)
      throw bad("has the port " + shown(*port) + ": a port is a number from 1 to 65535");
    out.port = value;
  }
  return out;
}

}  // namespace cubridge::tool
