#pragma once
// `cubridge fleet init`: the authenticated set-up of a fleet's bus (docs/fleet-security.md).
// Into a new directory it writes a CA of the fleet, a certificate per server, the nats-server
// configuration(s) (TLS required, a user per node and one for the operator, each with its
// subject permissions, JetStream; a JetStream cluster on loopback with --cluster 3), the
// credentials files, the nodes' and the operator's Ed25519 keys and a README.txt saying how to
// start it. Self-contained: it needs no server and no connection.
#include <CLI/CLI.hpp>

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace cubridge::tool {

/// What `cubridge fleet init` writes.
struct fleet_init_options {
  /// The directory written into: new (made, with its parents), or empty; made 0700.
  std::filesystem::path dir;
  /// The node ids (check_fleet_name), each a user of the servers and a key pair; not
  /// "operator" (the operator's user).
  std::vector<std::string> nodes;
  /// The names clients reach the servers by, IP addresses or DNS names: the subject alternative
  /// names of every server certificate.
  std::vector<std::string> hosts = {"127.0.0.1", "localhost"};
  /// 1, or 3 or 5 servers of one JetStream cluster on loopback.
  int servers = 1;
  /// The client port of the first server; server i (from 1) takes port + i - 1.
  int port = 4222;
  /// The cluster (route) port of the first server; server i takes cluster_port + i - 1.
  int cluster_port = 6222;
  /// An existing operator key file (`cubridge keygen`, public or secret): its public half is
  /// written to operator.pub and no operator.key is made. Empty: a fresh key pair.
  std::filesystem::path operator_key;
  /// The nodes in an account of their own (NODES) that reaches the fleet's account (FLEET,
  /// where the streams and the bucket live) only through the exports of what a node needs.
  /// Closes what permissions in one account cannot (a JetStream reply sent to any subject,
  /// docs/fleet-security.md); the nodes then use the JetStream API prefix node_api_prefix,
  /// written into their credentials files. The default; false (`--one-account`): one account
  /// whose users' permissions are the only boundary.
  bool node_account = true;
};

/// The operator's user on the servers.
inline constexpr std::string_view operator_user = "operator";
/// The JetStream API prefix (jsOptions.Prefix) of a node in the NODES account (node_account).
inline constexpr std::string_view node_api_prefix = "cubridge.api";

/// The subjects node `node` may publish to: its own result and heartbeat subjects and the
/// JetStream API subjects the agent's calls need (docs/fleet-security.md lists why each).
[[nodiscard]] std::vector<std::string> node_publish_permissions(std::string_view node,
                                                                bool node_account);
/// The subjects a node may subscribe to: libnats's default inbox prefix only.
[[nodiscard]] std::vector<std::string> node_subscribe_permissions();

/// Writes everything into options.dir. Throws usage_error (update/arguments.hpp) for options
/// that are wrong (a directory that is not empty, a bad node id, host or port, a duplicate),
/// cubridge::error (errc::io) when a file cannot be written or the operator key read; after a
/// failure the directory holds nothing of what was written.
void write_fleet_init(const fleet_init_options& options);

/// Registers `init` on the `fleet` command, its options bound to `options`.
CLI::App* add_fleet_init_command(CLI::App& fleet, fleet_init_options& options);

/// write_fleet_init, then what was written and how to start the server(s) on stdout. Returns
/// exit_ok, exit_usage (bad options) or exit_failure (a file not written), the error in one
/// line on stderr. Never throws; prints no secret.
[[nodiscard]] int run_fleet_init(const fleet_init_options& options) noexcept;

}  // namespace cubridge::tool
