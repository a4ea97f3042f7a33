#pragma once
// The strict forms of what `sign` and `push` take on the command line: module versions, expiry
// times and endpoint URLs. A malformed one is a usage error (exit 64), never a silent guess.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace cubridge::tool {

/// A command line that is wrong in a way the parser could not see (exit_usage).
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A module version: decimal digits only (no sign, space, "0x" or leading zero), 1 to 2^64-1.
/// nullopt for anything else; CLI11's own conversion (strtoull, base 0) would read "-1" or
/// "18446744073709551616" as 2^64-1, "0x10" as 16 and "010" as 8.
[[nodiscard]] std::optional<std::uint64_t> parse_version(std::string_view text);

/// The CLI11 check for --version: refuses what parse_version refuses, with the reason.
[[nodiscard]] CLI::Validator version_validator();

/// A duration as options take it, through CLI11's unit parsing (CLI::AsNumberWithUnit): a number
/// and one of the units ms, s, m, h, d ("500ms", "90s", "1.5h", "7d"; CLI11 also reads " 5 m",
/// "+5m" and a unit alone as one of it), turned into seconds. A bare number is seconds unless
/// `unit_required`. As an option's transform: `->transform(duration_transform())`.
[[nodiscard]] CLI::Validator duration_transform(bool unit_required = false);

/// The same for a text: its seconds, or the reason it is not a duration.
struct parsed_duration {
  double seconds = 0;
  std::string error;  ///< empty when it parsed
};
[[nodiscard]] parsed_duration parse_duration(std::string_view text, bool unit_required);

/// --expires: a duration from `now` (duration_transform's form with a unit, above 0 and at most
/// 100 years) or an RFC 3339 UTC time after `now` ("2027-01-31T00:00:00Z"). Throws usage_error
/// saying what was wrong.
[[nodiscard]] std::chrono::system_clock::time_point parse_expires(
    std::string_view text, std::chrono::system_clock::time_point now);

/// An update endpoint's address: http or https, a host, a port (80 / 443 by default).
struct endpoint_url {
  std::string scheme;  ///< "http" or "https"
  std::string host;    ///< a name, an IPv4 address, or an IPv6 address without its brackets
  int port = 0;
  /// "http://127.0.0.1:7070", "https://[::1]:8443".
  [[nodiscard]] std::string text() const;
};

/// Parses `scheme://host[:port][/]`. Throws usage_error naming the problem: no scheme, a scheme
/// other than http or https, an empty or malformed host, user info, a port that is not 1 to
/// 65535, or a path, query or fragment (the endpoint's paths are fixed).
[[nodiscard]] endpoint_url parse_endpoint_url(std::string_view url);

}  // namespace cubridge::tool
