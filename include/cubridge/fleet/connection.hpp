#pragma once
// How the fleet's two sides reach the bus (docs/fleet.md, "Running it"): a server list that
// works (comma-separated, each URL tried, the one in use said), an identity from a credentials
// file (`cubridge fleet init` writes one per node and one for the operator), TLS verified
// against the fleet's CA, and the replica count of what the control side creates. URLs are
// printed only with their credentials cut out (redact_url).

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace cubridge::fleet {

/// Where the bus is and who this side is on it.
struct bus_options {
  /// One URL or several, comma-separated: "nats://127.0.0.1:4222,nats://127.0.0.1:4223"; a
  /// scheme of nats:// or tls:// (TLS), a host, a port (4222 when none). Credentials in a URL
  /// are taken but never printed; prefer `credentials`.
  std::string servers = "nats://127.0.0.1:4222";
  /// A credentials file (read_credentials_file); empty: none (an open server, a demo only).
  std::filesystem::path credentials{};
  /// The CA certificate (PEM) that signed the servers' certificates. Given, or a tls:// URL:
  /// the connection is TLS and the server's certificate is verified.
  std::filesystem::path ca_file{};
  /// Replicas of the streams and the bucket this side creates (1; 3 in a 3-server cluster).
  int replicas = 1;
  /// The JetStream API prefix; empty: the credentials file's `api_prefix`, else "$JS.API". A node
  /// of `cubridge fleet init` (an account of its own, which reaches the fleet's streams only
  /// through exports) uses "cubridge.api", written into its credentials file
  /// (docs/fleet-security.md).
  std::string api_prefix{};
};

/// The URLs of a server list, each checked: a scheme of nats:// or tls://, a host, a port
/// 1-65535 when given, nothing after it; at most 32. Throws cubridge::error (errc::precondition)
/// naming the entry (redacted) and what is wrong.
[[nodiscard]] std::vector<std::string> parse_server_list(std::string_view servers);

/// `url` with any "user:password@" cut out: "nats://***@host:4222".
[[nodiscard]] std::string redact_url(std::string_view url);
/// Every URL of a comma-separated list redacted, joined with ",".
[[nodiscard]] std::string redact_server_list(std::string_view servers);

/// A user and password of the bus (users of the server's own configuration), and the JetStream
/// API prefix that identity reaches JetStream through (empty: "$JS.API").
struct bus_credentials {
  std::string user{};
  std::string password{};
  std::string api_prefix{};
};

/// Largest credentials file read, in bytes.
inline constexpr std::size_t max_credentials_bytes = 4096;

/// Reads a credentials file: lines "user NAME" and "password SECRET" (printable, no spaces), an
/// optional "api_prefix PREFIX" (subject tokens of letters, digits, '_' and '-', dot-separated),
/// '#' comments and blank lines allowed. Refuses a file others may read unless
/// `allow_readable`. Throws cubridge::error (errc::io) when unreadable, too large, not a regular
/// file, or readable by others; (errc::precondition) when malformed, naming the line.
[[nodiscard]] bus_credentials read_credentials_file(const std::filesystem::path& path,
                                                    bool allow_readable = false);
/// Writes one (mode 0600, a new file: an existing one is refused); the api_prefix line only when
/// one is given. Throws cubridge::error (errc::io).
void write_credentials_file(const std::filesystem::path& path, const bus_credentials& credentials,
                            std::string_view comment = {});

/// The JetStream API prefix `bus` reaches JetStream through: bus.api_prefix when given, else
/// the credentials file's, else empty ("$JS.API"). Throws as read_credentials_file.
[[nodiscard]] std::string api_prefix_of(const bus_options& bus);

/// Largest profile read, in bytes.
inline constexpr std::size_t max_profile_bytes = 4096;

/// A profile: a bus_options in a file, so that the server, credentials and CA need not be
/// repeated on every command (`cubridge fleet init` writes `operator.profile`; `--profile FILE`
/// or CUBRIDGE_FLEET_PROFILE names one). Lines "server URLS", "credentials FILE", "ca FILE",
/// "replicas N" (1 to 5), each at most once; '#' comments and blank lines. A relative path is
/// relative to the profile's own folder. Fields it does not name keep bus_options' defaults.
/// Throws cubridge::error (errc::io) when unreadable or too large; (errc::precondition) when
/// malformed, naming the file and line.
[[nodiscard]] bus_options read_bus_profile(const std::filesystem::path& path);
/// Writes one (mode 0644: paths, no secret; a new file: an existing one is refused), naming
/// each field of `bus` that differs from the default. Throws cubridge::error (errc::io).
void write_bus_profile(const std::filesystem::path& path, const bus_options& bus,
                       std::string_view comment = {});

}  // namespace cubridge::fleet
