// `cubridge fleet init` (fleet_init.hpp): the options checked, the servers' configuration, the
// files written; certificates and password hashes come from fleet_init_pki.hpp, keys from
// cubridge's own key functions, credentials files through fleet/connection.hpp.
#include "fleet/fleet_init.hpp"
#include "fleet/fleet_init_pki.hpp"

#include "exit_codes.hpp"
#include "update/arguments.hpp"

#include <cubridge/bundle/bundle.hpp>
#include <cubridge/core/detail/printable.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/fleet/connection.hpp>
#include <cubridge/fleet/subjects.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>

namespace cubridge::tool {
namespace {

namespace fs = std::filesystem;
using detail::printable;
using namespace fleet_init_internal;

/// The most nodes one init writes (each costs a bcrypt hash, well under a millisecond at cost 4).
constexpr std::size_t max_nodes = 1000;
/// Where the servers of a cluster reach one another.
constexpr std::string_view route_host = "127.0.0.1";

[[noreturn]] void fail_io(const std::string& call, const std::string& involved) {
  cubridge::detail::throw_errc(errc::io, call, involved);
}

// Writes a new file (one that exists is refused, a link is not followed) with exactly `mode`.
void write_new_file(const fs::path& path, std::string_view text, mode_t mode) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0) fail_io("open", path.string() + ": " + std::strerror(errno));
  bool ok = ::fchmod(fd, mode) == 0;  // the umask may have taken bits away from a public file
  for (std::size_t done = 0; ok && done < text.size();) {
    const auto n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<std::size_t>(n);
  }
  const int saved = errno;
  if (::close(fd) != 0 && ok) ok = false;
  if (!ok) fail_io("write", path.string() + ": " + std::strerror(saved ? saved : errno));
}

void make_private_directory(const fs::path& path) {
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST)
    fail_io("mkdir", path.string() + ": " + std::strerror(errno));
  if (::chmod(path.c_str(), 0700) != 0)
    fail_io("chmod", path.string() + ": " + std::strerror(errno));
}

// ---------------------------------------------------------------------------------------------
// Checking what was asked.

bool is_ip_address(const std::string& host) {
  unsigned char address[16];
  return ::inet_pton(AF_INET, host.c_str(), address) == 1 ||
         ::inet_pton(AF_INET6, host.c_str(), address) == 1;
}

// A DNS name: labels of 1 to 63 letters, digits and '-' (not first or last), 253 bytes at most.
bool is_dns_name(std::string_view name) {
  if (name.empty() || name.size() > 253) return false;
  std::size_t start = 0;
  while (start <= name.size()) {
    const auto dot = name.find('.', start);
    const auto label = name.substr(start, dot == std::string_view::npos ? name.npos : dot - start);
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-')
      return false;
    for (const char c : label)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') return false;
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return true;
}

bool is_loopback(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr v4{};
  return ::inet_pton(AF_INET, host.c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127;
}

// A path as a quoted string of a nats-server configuration: refused when it holds what the
// configuration's quoting cannot carry.
std::string quoted(const std::string& text) {
  for (const char ch : text)
    if (const auto c = static_cast<unsigned char>(ch);
        c < 0x20 || c == 0x7f || c == '"' || c == '\\')
      throw usage_error("--dir '" + printable(text, {.quoted = false}) +
                        "' holds a quote, backslash or control character, which the server "
                        "configuration cannot name");
  return "\"" + text + "\"";
}

struct checked_options {
  fs::path dir;  // absolute
  std::vector<std::string> nodes;
  std::vector<std::string> hosts;
  int servers = 1;
  int port = 0;
  int cluster_port = 0;
  bool node_account = false;
  std::optional<public_key> operator_public;  // from --operator-key
  std::string operator_secret;                // the secret key file the operator signs with
};

checked_options check(const fleet_init_options& o) {
  checked_options c;
  if (o.dir.empty()) throw usage_error("give the directory to write into: --dir D");
  c.dir = fs::absolute(o.dir).lexically_normal();
  if (c.dir.has_filename() == false && c.dir.has_parent_path()) c.dir = c.dir.parent_path();
  (void)quoted(c.dir.string());
  std::error_code ec;
  const auto status = fs::symlink_status(c.dir, ec);
  if (fs::exists(status)) {
    if (!fs::is_directory(status))
      throw usage_error("--dir " + printable(c.dir.string()) + " exists and is not a directory");
    if (!fs::is_empty(c.dir, ec) || ec)
      throw usage_error("--dir " + printable(c.dir.string()) +
                        " is not empty: fleet init writes only into a new or empty directory");
  }

  if (o.servers != 1 && o.servers != 3 && o.servers != 5)
    throw usage_error("--cluster " + std::to_string(o.servers) + ": give 3 or 5 servers (or 1)");
  c.servers = o.servers;
  const auto check_ports = [&](int first, const char* option) {
    if (first < 1 || first > 65535 - (c.servers - 1))
      throw usage_error(std::string(option) + " " + std::to_string(first) +
                        (c.servers == 1 ? " is not a port (1-65535)"
                                        : " leaves no room for " + std::to_string(c.servers) +
                                              " consecutive ports (1-65535)"));
  };
  check_ports(o.port, "--port");
  c.port = o.port;
  if (c.servers > 1) {
    check_ports(o.cluster_port, "--cluster-port");
    if (o.cluster_port < o.port + c.servers && o.port < o.cluster_port + c.servers)
      throw usage_error("--port " + std::to_string(o.port) + " and --cluster-port " +
                        std::to_string(o.cluster_port) + " overlap for " +
                        std::to_string(c.servers) + " servers");
    c.cluster_port = o.cluster_port;
  }

  if (o.nodes.empty()) throw usage_error("give at least one node: --node ID (repeatable)");
  if (o.nodes.size() > max_nodes)
    throw usage_error(std::to_string(o.nodes.size()) + " nodes is over the " +
                      std::to_string(max_nodes) + " one init writes");
  std::set<std::string, std::less<>> seen;
  for (const auto& node : o.nodes) {
    if (const auto problem =
            fleet::check_fleet_name(node, "node id '" + printable(node, {.quoted = false}) + "'");
        !problem.empty())
      throw usage_error("--node: " + problem);
    if (node == operator_user)
      throw usage_error("--node: 'operator' is the operator's user; name the node otherwise");
    if (!seen.insert(node).second) throw usage_error("--node " + node + " is given twice");
    c.nodes.push_back(node);
  }

  std::set<std::string, std::less<>> host_seen;
  for (const auto& host : o.hosts) {
    if (!is_ip_address(host) && !is_dns_name(host))
      throw usage_error("--host '" + printable(host, {.quoted = false}) +
                        "' is neither an IP address nor a DNS name");
    if (host_seen.insert(host).second) c.hosts.push_back(host);
  }
  if (c.hosts.empty()) throw usage_error("give at least one --host the servers are reached by");

  if (!o.operator_key.empty()) {
    c.operator_secret = "OPERATOR.key";  // a public key was given: the secret one is elsewhere
    try {
      c.operator_public = read_public_key_file(o.operator_key);
    } catch (const bundle_error&) {
      try {
        c.operator_public = read_secret_key_file(o.operator_key).public_key();
        c.operator_secret = fs::absolute(o.operator_key).lexically_normal().string();
      } catch (const bundle_error&) {
        fail_io("reading --operator-key",
                o.operator_key.string() + " is neither a public nor a secret cubridge key file");
      }
    }
  } else {
    c.operator_secret = (c.dir / "operator.key").string();
  }
  c.node_account = o.node_account;
  return c;
}

// ---------------------------------------------------------------------------------------------
// The servers' configuration.

struct user_entry {
  std::string name;
  std::string password_hash;
};

std::string file_suffix(const checked_options& c, int server) {
  return c.servers == 1 ? "" : "-" + std::to_string(server);
}

std::string quoted_list(const std::vector<std::string>& items, std::string_view indent) {
  std::string text = "[\n";
  for (const auto& item : items) text += std::string(indent) + "  \"" + item + "\"\n";
  return text + std::string(indent) + "]";
}

std::string user_block(const user_entry& user, const std::vector<std::string>& publish,
                       const std::vector<std::string>& subscribe, std::string_view indent) {
  const std::string in(indent);
  return in + "{\n" + in + "  user: \"" + user.name + "\"\n" + in + "  password: \"" +
         user.password_hash + "\"\n" + in + "  permissions: {\n" + in +
         "    publish: { allow: " + quoted_list(publish, in + "    ") + " }\n" + in +
         "    subscribe: { allow: " + quoted_list(subscribe, in + "    ") + " }\n" + in + "  }\n" +
         in + "}\n";
}

// The JetStream API subjects a node calls (without the prefix: "STREAM.INFO.*"), each for one
// of the agent's calls; docs/fleet-security.md has the table.
std::vector<std::string> node_api_subjects() {
  const std::string kv(fleet::control_bucket_stream);
  return {
      "STREAM.INFO.*",  // js_KeyValue (binds the bucket), js_GetStreamInfo on a stream
      "STREAM.NAMES",   // kvStore_Watch looks the stream of its subject up
      "DIRECT.GET.*.cubridge.bundle.>",  // js_DirectGetMsg of a bundle's subject
      "DIRECT.GET." + kv + ".$KV." + std::string(fleet::control_bucket) + ".>",  // kvStore_Get
      "DIRECT.GET." + kv,       // the desired state's history, by sequence (its body names the key)
      "CONSUMER.CREATE." + kv,  // kvStore_Watch: its ephemeral ordered consumer
      "CONSUMER.DELETE." + kv + ".*",  // kvWatcher_Stop / _Destroy deletes it
  };
}

// Flow control replies of the watch's ordered consumer ($JS.FC.<stream>.<consumer>.<id>).
std::string flow_control_subject() {
  return "$JS.FC." + std::string(fleet::control_bucket_stream) + ".>";
}

// Server `server`'s TLS block, proven by the fleet's CA; `verify`: the other side must prove
// itself by certificate too (routes), not only by user and password (clients).
std::string tls_block(const checked_options& c, int server, bool verify,
                      const std::string& indent) {
  const std::string suffix = file_suffix(c, server);
  const auto file = [&](const std::string& name) { return quoted((c.dir / name).string()); };
  return indent + "tls {\n" + indent + "  cert_file: " + file("server" + suffix + ".pem") + "\n" +
         indent + "  key_file: " + file("server" + suffix + ".key") + "\n" + indent +
         "  ca_file: " + file("ca.pem") + "\n" + indent +
         "  verify: " + (verify ? "true" : "false") + "\n" + indent + "  timeout: 5\n" + indent +
         "}\n";
}

// The routes between the servers of a JetStream cluster: TLS both ways.
std::string cluster_section(const checked_options& c, int server) {
  std::ostringstream out;
  out << "\n# Routes between the servers: TLS both ways, each side proven by the fleet's CA.\n"
      << "cluster {\n"
      << "  name: \"cubridge\"\n"
      << "  listen: \"" << route_host << ":" << c.cluster_port + server - 1 << "\"\n"
      << "  routes: [\n";
  for (int other = 1; other <= c.servers; ++other)
    if (other != server)
      out << "    \"nats-route://" << route_host << ":" << c.cluster_port + other - 1 << "\"\n";
  out << "  ]\n" << tls_block(c, server, true, "  ") << "}\n";
  return out.str();
}

// The two accounts of `--node-account`: the fleet's streams and bucket in FLEET, the nodes in
// NODES, which reaches FLEET only through exports.
std::string accounts_section(const user_entry& op, const std::vector<user_entry>& nodes) {
  const std::vector<std::string> everything = {">"};
  std::ostringstream out;
  out << "\n# Two accounts: FLEET holds the streams and the bucket and its one user, the\n"
      << "# operator, may do everything; the nodes live in NODES, which reaches FLEET only\n"
      << "# through the exports below (a node's JetStream API prefix: " << node_api_prefix
      << "). A reply\n# subject a node gives can so never name a subject of FLEET.\n"
      << "accounts {\n"
      << "  FLEET: {\n"
      << "    jetstream: enabled\n"
      << "    users: [\n"
      << user_block(op, everything, everything, "      ") << "    ]\n"
      << "    exports: [\n"
      << "      { service: \"cubridge.result.>\", accounts: [NODES] }\n"
      << "      { service: \"cubridge.heartbeat.>\", accounts: [NODES] }\n";
  for (const auto& api : node_api_subjects())
    out << "      { service: \"$JS.API." << api << "\", accounts: [NODES] }\n";
  out << "      { service: \"" << flow_control_subject() << "\", accounts: [NODES] }\n"
      << "      # the watch's consumer delivers to the node's inbox\n"
      << "      { stream: \"_INBOX.>\", accounts: [NODES] }\n"
      << "    ]\n"
      << "  }\n"
      << "  NODES: {\n"
      << "    users: [\n";
  for (const auto& node : nodes)
    out << user_block(node, node_publish_permissions(node.name, true), node_subscribe_permissions(),
                      "      ");
  out << "    ]\n"
      << "    imports: [\n"
      << "      { service: { account: FLEET, subject: \"cubridge.result.>\" } }\n"
      << "      { service: { account: FLEET, subject: \"cubridge.heartbeat.>\" } }\n";
  for (const auto& api : node_api_subjects())
    out << "      { service: { account: FLEET, subject: \"$JS.API." << api << "\" }, to: \""
        << node_api_prefix << "." << api << "\" }\n";
  out << "      { service: { account: FLEET, subject: \"" << flow_control_subject() << "\" } }\n"
      << "      { stream: { account: FLEET, subject: \"_INBOX.>\" } }\n"
      << "    ]\n"
      << "  }\n"
      << "}\n";
  return out.str();
}

std::string server_config(const checked_options& c, int server, const user_entry& op,
                          const std::vector<user_entry>& nodes) {
  const std::string suffix = file_suffix(c, server);
  const auto file = [&](const std::string& name) { return quoted((c.dir / name).string()); };
  const bool loopback_only =
      std::all_of(c.hosts.begin(), c.hosts.end(), [](const auto& h) { return is_loopback(h); });
  std::ostringstream out;
  out << "# nats-server configuration of a cubridge fleet, written by `cubridge fleet init`\n"
      << "# (docs/fleet-security.md). "
      << (c.servers == 1 ? std::string("One server.")
                         : "Server " + std::to_string(server) + " of " + std::to_string(c.servers) +
                               " of one JetStream cluster.")
      << "\n# Start: nats-server -c " << (c.dir / ("server" + suffix + ".conf")).string()
      << "\n\nserver_name: \"cubridge-" << server << "\"\n"
      << "host: \"" << (loopback_only ? "127.0.0.1" : "0.0.0.0") << "\"\n"
      << "port: " << c.port + server - 1 << "\n"
      << "# A bundle travels as one message (docs/fleet.md, Payload limits).\n"
      << "max_payload: 16MB\n\n"
      << "# Clients: TLS required, the server proven by the fleet's CA; clients prove who they\n"
      << "# are by user and password (no client certificates).\n"
      << tls_block(c, server, false, "") << "\n"
      << "jetstream {\n"
      << "  store_dir: " << file("store" + suffix) << "\n"
      << "  max_memory_store: 256MB\n"
      << "  max_file_store: 16GB\n"
      << "}\n";
  if (c.servers > 1) out << cluster_section(c, server);
  const std::vector<std::string> everything = {">"};
  if (!c.node_account) {
    out << "\n# One account: the operator may do everything; a node may publish only its own\n"
        << "# results and heartbeats and call only the JetStream API the agent needs.\n"
        << "authorization {\n"
        << "  users = [\n"
        << user_block(op, everything, everything, "    ");
    for (const auto& node : nodes)
      out << user_block(node, node_publish_permissions(node.name, false),
                        node_subscribe_permissions(), "    ");
    out << "  ]\n}\n";
    return out.str();
  }
  out << accounts_section(op, nodes);
  return out.str();
}

// The servers' client URLs, comma-separated.
std::string server_urls(const checked_options& c) {
  std::string urls = "tls://" + c.hosts.front() + ":" + std::to_string(c.port);
  for (int i = 2; i <= c.servers; ++i)
    urls += ",tls://" + c.hosts.front() + ":" + std::to_string(c.port + i - 1);
  return urls;
}

// The operator's profile: the commands take the server, credentials and CA from it (--profile,
// CUBRIDGE_FLEET_PROFILE), paths relative to the directory.
void write_operator_profile(const checked_options& c) {
  fleet::bus_options profile;
  profile.servers = server_urls(c);
  profile.credentials = "operator.creds";
  profile.ca_file = "ca.pem";
  profile.replicas = c.servers > 1 ? 3 : 1;
  fleet::write_bus_profile(c.dir / "operator.profile", profile,
                           "the operator's bus (cubridge fleet init): --profile " +
                               (c.dir / "operator.profile").string());
}

std::string readme(const checked_options& c) {
  const std::string d = c.dir.string();
  const std::string urls = server_urls(c);
  const std::string& node = c.nodes.front();
  std::ostringstream out;
  out << "A cubridge fleet's bus, written by `cubridge fleet init` (docs/fleet-security.md).\n\n"
      << "Start the server" << (c.servers == 1 ? "" : "s, each in its own terminal") << ":\n";
  for (int i = 1; i <= c.servers; ++i)
    out << "  nats-server -c " << d << "/server" << file_suffix(c, i) << ".conf\n";
  out << "\nThe operator (cubridge fleet publish | status | rollback | watch | enroll):\n"
      << "  --profile " << d << "/operator.profile   (or export CUBRIDGE_FLEET_PROFILE=" << d
      << "/operator.profile)\n"
      << "  which names --server " << urls << " --credentials " << d << "/operator.creds --ca " << d
      << "/ca.pem";
  if (c.servers > 1) out << " --replicas 3";
  out << "\n  signing with --key " << c.operator_secret
      << (c.operator_public ? " (the key given to --operator-key; operator.pub is its public half)"
                            : "")
      << "\n\nEnrol each node once:\n"
      << "  cubridge fleet enroll " << node << " --node-key " << d << "/nodes/" << node
      << ".pub --key " << c.operator_secret << " --server " << urls << " --credentials " << d
      << "/operator.creds --ca " << d << "/ca.pem\n\n"
      << "A node (e.g. examples/online_service):\n"
      << "  --fleet-server " << urls << " --node " << node << " --node-key " << d << "/nodes/"
      << node << ".key --fleet-credentials " << d << "/nodes/" << node << ".creds --fleet-ca " << d
      << "/ca.pem --trusted-key " << d << "/operator.pub\n";
  if (c.node_account)
    out << "  The nodes are in an account of their own: their JetStream API prefix is "
        << node_api_prefix << ",\n  named in each node's credentials file.\n";
  out << "\nFiles (secrets are mode 0600, this directory 0700):\n"
      << "  ca.pem, ca.key            the fleet's CA (keep ca.key offline once the servers run)\n"
      << "  server" << (c.servers == 1 ? "" : "-N") << ".pem/.key, server"
      << (c.servers == 1 ? "" : "-N") << ".conf  each server's certificate and configuration\n"
      << "  operator.creds, operator.key/.pub   the operator's bus identity and signing key\n"
      << "  operator.profile          the operator's server, credentials and CA, for --profile\n"
      << "  nodes/<node>.creds, nodes/<node>.key/.pub   each node's bus identity and key\n"
      << "The configuration holds bcrypt hashes of the passwords, never the passwords.\n";
  return out.str();
}

// Removes what a failed init wrote.
class cleanup {
 public:
  cleanup(fs::path dir, bool made) : dir_(std::move(dir)), made_(made) {}
  cleanup(const cleanup&) = delete;
  cleanup& operator=(const cleanup&) = delete;
  ~cleanup() {
    if (done_) return;
    std::error_code ignored;
    if (made_) {
      fs::remove_all(dir_, ignored);
      return;
    }
    for (const auto& entry : fs::directory_iterator(dir_, ignored))
      fs::remove_all(entry.path(), ignored);
  }
  void keep() noexcept { done_ = true; }

 private:
  fs::path dir_;
  bool made_;
  bool done_ = false;
};

}  // namespace

std::vector<std::string> node_publish_permissions(std::string_view node, bool node_account) {
  std::vector<std::string> subjects = {"cubridge.result.*." + std::string(node),
                                       fleet::heartbeat_subject(node)};
  const std::string prefix = (node_account ? std::string(node_api_prefix) : "$JS.API") + ".";
  for (const auto& api : node_api_subjects()) subjects.push_back(prefix + api);
  subjects.push_back(flow_control_subject());
  return subjects;
}

std::vector<std::string> node_subscribe_permissions() {
  return {"_INBOX.>"};
}

void write_fleet_init(const fleet_init_options& options) {
  const auto c = check(options);
  std::error_code ec;
  const bool made = !fs::exists(c.dir, ec);
  if (made) {
    fs::create_directories(c.dir.parent_path(), ec);
    if (ec) fail_io("create_directories", c.dir.parent_path().string() + ": " + ec.message());
  }
  make_private_directory(c.dir);
  cleanup undo(c.dir, made);
  make_private_directory(c.dir / "nodes");

  // The CA, and a certificate per server for every --host (and the route address of a cluster).
  const auto ca_key = make_ec_key("the CA's key");
  const auto ca = make_certificate(ca_key.get(), "cubridge fleet CA", nullptr, ca_key.get(),
                                   {{NID_basic_constraints, "critical,CA:TRUE,pathlen:0"},
                                    {NID_key_usage, "critical,keyCertSign,cRLSign"},
                                    {NID_subject_key_identifier, "hash"}});
  write_new_file(c.dir / "ca.key", pem_of(ca_key).text, 0600);
  write_new_file(c.dir / "ca.pem", pem_of(ca), 0644);
  auto names = c.hosts;
  if (c.servers > 1 && std::find(names.begin(), names.end(), route_host) == names.end())
    names.emplace_back(route_host);
  std::string alt_names;
  for (const auto& name : names)
    alt_names +=
        (alt_names.empty() ? "" : ",") + std::string(is_ip_address(name) ? "IP:" : "DNS:") + name;
  for (int server = 1; server <= c.servers; ++server) {
    const auto key = make_ec_key("server " + std::to_string(server) + "'s key");
    const auto cert = make_certificate(key.get(), "cubridge fleet server " + std::to_string(server),
                                       ca.get(), ca_key.get(),
                                       {{NID_basic_constraints, "critical,CA:FALSE"},
                                        {NID_key_usage, "critical,digitalSignature"},
                                        {NID_ext_key_usage, "serverAuth,clientAuth"},
                                        {NID_subject_alt_name, alt_names},
                                        {NID_subject_key_identifier, "hash"},
                                        {NID_authority_key_identifier, "keyid:always"}});
    const std::string suffix = file_suffix(c, server);
    write_new_file(c.dir / ("server" + suffix + ".key"), pem_of(key).text, 0600);
    write_new_file(c.dir / ("server" + suffix + ".pem"), pem_of(cert), 0644);
    make_private_directory(c.dir / ("store" + suffix));
  }

  // Identities: a password each (only its hash goes into the configuration) and a key pair.
  const auto identity = [&](const std::string& user, const fs::path& creds,
                            std::string api_prefix) {
    const auto password = random_password();
    fleet::write_credentials_file(creds, {user, password.text, std::move(api_prefix)},
                                  "the bus identity of " + user + " (cubridge fleet init)");
    return user_entry{user, bcrypt_hash(password)};
  };
  const auto op = identity(std::string(operator_user), c.dir / "operator.creds", {});
  if (c.operator_public) {
    write_key_file(c.dir / "operator.pub", *c.operator_public);
  } else {
    const auto pair = generate_keypair();
    write_key_file(c.dir / "operator.key", pair.secret_key);
    write_key_file(c.dir / "operator.pub", pair.public_key);
  }
  std::vector<user_entry> nodes;
  for (const auto& node : c.nodes) {
    const auto base = c.dir / "nodes" / node;
    nodes.push_back(identity(node, base.string() + ".creds",
                             c.node_account ? std::string(node_api_prefix) : std::string()));
    const auto pair = generate_keypair();
    write_key_file(base.string() + ".key", pair.secret_key);
    write_key_file(base.string() + ".pub", pair.public_key);
  }

  for (int server = 1; server <= c.servers; ++server)
    write_new_file(c.dir / ("server" + file_suffix(c, server) + ".conf"),
                   server_config(c, server, op, nodes), 0600);
  write_operator_profile(c);
  write_new_file(c.dir / "README.txt", readme(c), 0644);
  undo.keep();
}

CLI::App* add_fleet_init_command(CLI::App& fleet, fleet_init_options& options) {
  auto* init = fleet.add_subcommand(
      "init", "Write a fleet's CA, server configuration(s), users and keys into a new directory");
  init->add_option("--dir", options.dir, "The directory to write into (new or empty)")->required();
  init->add_option("--node", options.nodes, "A node id, one bus user and key each (repeatable)")
      ->required()
      ->delimiter(',');
  init->add_option("--host", options.hosts,
                   "A name clients reach the servers by, IP or DNS (repeatable)")
      ->delimiter(',')
      ->capture_default_str();
  init->add_option("--cluster", options.servers,
                   "Servers of one JetStream cluster on loopback (3 or 5; default 1)");
  init->add_option("--port", options.port, "Client port of the first server")
      ->capture_default_str();
  init->add_option("--cluster-port", options.cluster_port, "Route port of the first server")
      ->capture_default_str();
  init->add_option("--operator-key", options.operator_key,
                   "An existing operator key file (public or secret): no operator.key is made");
  auto* node_account = init->add_flag(
      "--node-account", options.node_account,
      "The nodes in an account of their own, reaching JetStream through the prefix " +
          std::string(node_api_prefix) + " their credentials files name (the default)");
  init->add_flag("--one-account{false}", options.node_account,
                 "The nodes and the operator in one account, permissions the only boundary "
                 "(a node's JetStream request may name any reply subject)")
      ->excludes(node_account);
  return init;
}

int run_fleet_init(const fleet_init_options& options) noexcept {
  try {
    write_fleet_init(options);
    const auto dir = fs::absolute(options.dir).lexically_normal().string();
    std::cout << "wrote " << dir << ": a CA, " << options.servers << " server configuration"
              << (options.servers == 1 ? "" : "s") << ", the operator and " << options.nodes.size()
              << " node" << (options.nodes.size() == 1 ? "" : "s") << "\nstart: nats-server -c "
              << dir << "/server" << (options.servers == 1 ? "" : "-1") << ".conf (" << dir
              << "/README.txt says the rest)\n";
    return exit_ok;
  } catch (const usage_error& e) {
    std::cerr << "cubridge: " << e.what() << "\n";
    return exit_usage;
  } catch (const std::exception& e) {
    std::cerr << "cubridge: " << e.what() << "\n";
    return exit_failure;
  }
}

}  // namespace cubridge::tool
