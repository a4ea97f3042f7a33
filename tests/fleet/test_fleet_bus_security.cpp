// `cubridge fleet init` and the bus it sets up (docs/fleet-security.md): what it writes (files,
// modes, certificates, hashes, no password in a configuration), what it refuses, and a real
// nats-server started from its configuration, seen through raw libnats: who is refused (no
// credentials, a wrong password, no TLS, a server not proven by the fleet's CA), what the
// operator may do (everything), what a node may do (each call of the agent) and what it may not
// (another node's subjects, the bucket, bundles, stream and consumer administration, any
// subscription but its inbox). Each server test runs for both layouts: one account, and the
// nodes in an account of their own (--node-account).
#include "fleet/raw_nats.hpp"
#include "nats_server.hpp"
#include "temp_dir.hpp"

#include "eventually.hpp"
#include "exit_codes.hpp"
#include "fleet/fleet_init.hpp"
#include "update/arguments.hpp"

#include <cubridge/bundle/bundle.hpp>
#include <cubridge/bundle/detail/signing.hpp>
#include <cubridge/fleet/agent.hpp>
#include <cubridge/fleet/connection.hpp>
#include <cubridge/fleet/controller.hpp>
#include <cubridge/fleet/subjects.hpp>
#include <cubridge/update/module_sink.hpp>
#include <cubridge/update/update_gate.hpp>

#include "bundle/source_bundles.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace {

namespace fs = std::filesystem;
using namespace cubridge;
using namespace cubridge::testing;
using cubridge::tool::fleet_init_options;
using cubridge::tool::write_fleet_init;

// How long a test waits for what must happen (a loaded machine's worst, not a pace).
constexpr std::chrono::seconds patience{20};

std::string read_text(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

unsigned mode_of(const fs::path& path) {
  struct stat s {};
  EXPECT_EQ(::stat(path.c_str(), &s), 0) << path;
  return s.st_mode & 07777;
}

struct x509_free {
  void operator()(X509* p) const noexcept { X509_free(p); }
};
using certificate = std::unique_ptr<X509, x509_free>;

certificate read_certificate(const fs::path& file) {
  FILE* f = std::fopen(file.c_str(), "r");
  EXPECT_NE(f, nullptr) << file;
  if (!f) return nullptr;
  certificate cert(PEM_read_X509(f, nullptr, nullptr, nullptr));
  std::fclose(f);
  return cert;
}

// Whether `cert` was signed by `ca`'s key.
bool signed_by(X509* cert, X509* ca) {
  EVP_PKEY* key = X509_get0_pubkey(ca);
  return key && X509_verify(cert, key) == 1;
}

// Days from now until `cert` expires.
int days_left(X509* cert) {
  int days = 0, seconds = 0;
  EXPECT_EQ(ASN1_TIME_diff(&days, &seconds, nullptr, X509_get0_notAfter(cert)), 1);
  return days;
}

// What a client that skips TLS hears: it reads the server's INFO, sends CONNECT with `who`'s
// user and password in plain text and a PING, and reads until the server closes (or 5 s).
std::string plain_text_session(int port, const fleet::bus_credentials& who) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  std::string heard;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return "connect failed";
  }
  const auto read_some = [&](int timeout_ms) {
    pollfd readable{fd, POLLIN, 0};
    if (::poll(&readable, 1, timeout_ms) != 1) return false;
    char buffer[4096];
    const auto n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) return false;
    heard.append(buffer, static_cast<std::size_t>(n));
    return true;
  };
  (void)read_some(5000);  // INFO
  const std::string hello = R"(CONNECT {"verbose":false,"pedantic":false,"user":")" + who.user +
                            R"(","pass":")" + who.password + "\"}\r\nPING\r\n";
  (void)::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < until && read_some(500)) {
  }
  ::close(fd);
  return heard;
}

fleet_init_options two_nodes(const fs::path& dir) {
  fleet_init_options o;
  o.dir = dir;
  o.nodes = {"node-1", "node-2"};
  return o;
}

// Runs `options` expecting a usage_error that says `part`.
void expect_usage_error(const fleet_init_options& options, const std::string& part) {
  try {
    write_fleet_init(options);
    ADD_FAILURE() << "no usage_error; expected one saying: " << part;
  } catch (const tool::usage_error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
        << "said: " << e.what() << "\nexpected: " << part;
  }
}

// ---------------------------------------------------------------------------------------------
// What fleet init writes.

TEST(fleet_init, writes_the_ca_certificates_configuration_credentials_and_keys) {
  temp_dir tmp;
  const auto d = tmp.path / "fleet";
  write_fleet_init(two_nodes(d));

  EXPECT_EQ(mode_of(d), 0700u);
  EXPECT_EQ(mode_of(d / "nodes"), 0700u);
  for (const auto* secret :
       {"ca.key", "server.key", "server.conf", "operator.creds", "operator.key",
        "nodes/node-1.creds", "nodes/node-1.key", "nodes/node-2.creds", "nodes/node-2.key"})
    EXPECT_EQ(mode_of(d / secret), 0600u) << secret;
  for (const auto* open : {"ca.pem", "server.pem", "operator.pub", "nodes/node-1.pub",
                           "nodes/node-2.pub", "README.txt"})
    EXPECT_EQ(mode_of(d / open) & 0077u, 0044u) << open;

  // The CA signed the server's certificate, which names both hosts; both live ~10 years.
  const auto ca = read_certificate(d / "ca.pem");
  const auto server = read_certificate(d / "server.pem");
  ASSERT_TRUE(ca && server);
  EXPECT_EQ(X509_check_ca(ca.get()), 1);
  EXPECT_EQ(X509_check_ca(server.get()), 0);
  EXPECT_TRUE(signed_by(ca.get(), ca.get()));
  EXPECT_TRUE(signed_by(server.get(), ca.get()));
  EXPECT_EQ(X509_check_ip_asc(server.get(), "127.0.0.1", 0), 1);
  EXPECT_EQ(X509_check_host(server.get(), "localhost", 0, 0, nullptr), 1);
  EXPECT_NE(X509_check_host(server.get(), "example.com", 0, 0, nullptr), 1);
  EXPECT_NEAR(days_left(ca.get()), 3652, 2);
  EXPECT_NEAR(days_left(server.get()), 3652, 2);

  // The credentials read back; the configuration holds their bcrypt hashes, never a password.
  const auto config = read_text(d / "server.conf");
  for (const auto* creds : {"operator.creds", "nodes/node-1.creds", "nodes/node-2.creds"}) {
    const auto c = fleet::read_credentials_file(d / creds);
    EXPECT_EQ(c.password.size(), 64u) << creds;
    EXPECT_EQ(config.find(c.password), std::string::npos) << creds << "'s password is in it";
    EXPECT_NE(config.find("user: \"" + c.user + "\""), std::string::npos) << c.user;
  }
  EXPECT_EQ(fleet::read_credentials_file(d / "nodes/node-1.creds").user, "node-1");
  EXPECT_EQ(fleet::read_credentials_file(d / "operator.creds").user, "operator");
  EXPECT_NE(config.find("password: \"$2b$04$"), std::string::npos);
  // The operator's profile: the commands need no --server, --credentials or --ca with it.
  const auto profile = fleet::read_bus_profile(d / "operator.profile");
  EXPECT_EQ(profile.servers.rfind("tls://", 0), 0u) << profile.servers;
  EXPECT_EQ(profile.credentials, d / "operator.creds");
  EXPECT_EQ(profile.ca_file, d / "ca.pem");
  EXPECT_NE(config.find("max_payload: 16MB"), std::string::npos);
  EXPECT_NE(config.find("verify: false"), std::string::npos);
  EXPECT_EQ(config.find("cluster {"), std::string::npos);

  // Each key file pair belongs together; every key differs.
  const auto node1 = read_secret_key_file(d / "nodes/node-1.key");
  EXPECT_EQ(node1.public_key(), read_public_key_file(d / "nodes/node-1.pub"));
  EXPECT_EQ(read_secret_key_file(d / "operator.key").public_key(),
            read_public_key_file(d / "operator.pub"));
  EXPECT_NE(read_public_key_file(d / "nodes/node-2.pub"), node1.public_key());

  const auto readme = read_text(d / "README.txt");
  EXPECT_NE(readme.find("nats-server -c " + d.string() + "/server.conf"), std::string::npos);
  EXPECT_NE(
      readme.find("--credentials " + d.string() + "/operator.creds --ca " + d.string() + "/ca.pem"),
      std::string::npos)
      << readme;
}

TEST(fleet_init, writes_a_configuration_per_server_of_a_cluster) {
  temp_dir tmp;
  auto o = two_nodes(tmp.path / "fleet");
  o.servers = 3;
  o.port = 14222;
  o.cluster_port = 16222;
  o.hosts = {"nats.example.com", "10.0.0.7"};
  write_fleet_init(o);
  const auto ca = read_certificate(o.dir / "ca.pem");
  for (int i = 1; i <= 3; ++i) {
    const std::string n = std::to_string(i);
    const auto config = read_text(o.dir / ("server-" + n + ".conf"));
    EXPECT_NE(config.find("server_name: \"cubridge-" + n + "\""), std::string::npos);
    EXPECT_NE(config.find("port: " + std::to_string(14221 + i)), std::string::npos);
    EXPECT_NE(config.find("listen: \"127.0.0.1:" + std::to_string(16221 + i) + "\""),
              std::string::npos);
    EXPECT_NE(config.find("host: \"0.0.0.0\""), std::string::npos);  // not only loopback names
    for (int other = 1; other <= 3; ++other)
      EXPECT_EQ(config.find("nats-route://127.0.0.1:" + std::to_string(16221 + other)) !=
                    std::string::npos,
                other != i)
          << "server " << i << ", route to " << other;
    EXPECT_NE(config.find("verify: true"), std::string::npos);  // routes prove both sides
    const auto cert = read_certificate(o.dir / ("server-" + n + ".pem"));
    ASSERT_TRUE(cert);
    EXPECT_TRUE(signed_by(cert.get(), ca.get()));
    EXPECT_EQ(X509_check_host(cert.get(), "nats.example.com", 0, 0, nullptr), 1);
    EXPECT_EQ(X509_check_ip_asc(cert.get(), "10.0.0.7", 0), 1);
    EXPECT_EQ(X509_check_ip_asc(cert.get(), "127.0.0.1", 0), 1);  // the routes' address
    EXPECT_EQ(mode_of(o.dir / ("server-" + n + ".key")), 0600u);
  }
  EXPECT_FALSE(fs::exists(o.dir / "server.conf"));
}

TEST(fleet_init, takes_an_existing_operator_key) {
  temp_dir tmp;
  const auto pair = generate_keypair();
  write_key_file(tmp.path / "release.key", pair.secret_key);
  write_key_file(tmp.path / "release.pub", pair.public_key);
  for (const auto* given : {"release.pub", "release.key"}) {
    auto o = two_nodes(tmp.path / (std::string("fleet-") + given));
    o.operator_key = tmp.path / given;
    write_fleet_init(o);
    EXPECT_EQ(read_public_key_file(o.dir / "operator.pub"), pair.public_key) << given;
    EXPECT_FALSE(fs::exists(o.dir / "operator.key")) << given;
    EXPECT_TRUE(fs::exists(o.dir / "operator.creds")) << given;
  }
}

TEST(fleet_init, refuses_bad_options_and_writes_nothing) {
  temp_dir tmp;
  const auto d = tmp.path / "fleet";
  auto o = two_nodes(d);
  o.nodes = {};
  expect_usage_error(o, "give at least one node");
  o.nodes = {"node 1"};
  expect_usage_error(o, "node id 'node 1' may hold only");
  o.nodes = {"a.b"};
  expect_usage_error(o, "may hold only");
  o.nodes = {std::string(65, 'n')};
  expect_usage_error(o, "is over 64 bytes");
  o.nodes = {"node-1", "node-1"};
  expect_usage_error(o, "--node node-1 is given twice");
  o.nodes = {"operator"};
  expect_usage_error(o, "'operator' is the operator's user");
  o = two_nodes(d);
  o.hosts = {"bad host"};
  expect_usage_error(o, "--host 'bad host' is neither an IP address nor a DNS name");
  o.hosts = {"-a.example"};
  expect_usage_error(o, "is neither");
  o.hosts = {};
  expect_usage_error(o, "give at least one --host");
  o = two_nodes(d);
  o.servers = 2;
  expect_usage_error(o, "--cluster 2: give 3 or 5 servers");
  o = two_nodes(d);
  o.port = 0;
  expect_usage_error(o, "--port 0 is not a port");
  o.port = 65535;
  o.servers = 3;
  expect_usage_error(o, "--port 65535 leaves no room for 3 consecutive ports");
  o.port = 6221;  // 6221..6223 against the cluster's 6222..6224
  expect_usage_error(o, "--port 6221 and --cluster-port 6222 overlap for 3 servers");
  o = two_nodes(d);
  o.dir.clear();
  expect_usage_error(o, "--dir D");
  o = two_nodes(tmp.path / "with\"quote");
  expect_usage_error(o, "holds a quote");
  EXPECT_FALSE(fs::exists(d));

  // A directory that is not empty keeps what it holds.
  write_text(d / "mine.txt", "keep me");
  expect_usage_error(two_nodes(d), "is not empty");
  EXPECT_EQ(read_text(d / "mine.txt"), "keep me");
  write_text(tmp.path / "file", "x");
  expect_usage_error(two_nodes(tmp.path / "file"), "exists and is not a directory");

  // An operator key that is no key: an input error, nothing written.
  o = two_nodes(tmp.path / "fleet-2");
  write_text(tmp.path / "junk.key", "not a key\n");
  o.operator_key = tmp.path / "junk.key";
  EXPECT_THROW(write_fleet_init(o), cubridge::error);
  o.operator_key = tmp.path / "missing.key";
  EXPECT_THROW(write_fleet_init(o), cubridge::error);
  EXPECT_FALSE(fs::exists(tmp.path / "fleet-2"));

  // An empty directory is taken (and made 0700).
  fs::create_directory(tmp.path / "empty");
  write_fleet_init(two_nodes(tmp.path / "empty"));
  EXPECT_EQ(mode_of(tmp.path / "empty"), 0700u);
}

TEST(fleet_init, run_reports_one_line_and_an_exit_status) {
  temp_dir tmp;
  auto o = two_nodes(tmp.path / "fleet");
  o.nodes = {"bad node"};
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(tool::run_fleet_init(o), tool::exit_usage);
  auto said = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(std::count(said.begin(), said.end(), '\n'), 1) << said;
  EXPECT_EQ(said.rfind("cubridge: --node: node id 'bad node'", 0), 0u) << said;

  o = two_nodes(tmp.path / "fleet");
  o.operator_key = tmp.path / "missing.key";
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(tool::run_fleet_init(o), tool::exit_failure);
  said = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(std::count(said.begin(), said.end(), '\n'), 1) << said;

  o.operator_key.clear();
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(tool::run_fleet_init(o), tool::exit_ok);
  said = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(said.find("nats-server -c " + o.dir.string() + "/server.conf"), std::string::npos)
      << said;
  const auto password = fleet::read_credentials_file(o.dir / "operator.creds").password;
  EXPECT_EQ(said.find(password), std::string::npos);
}

TEST(fleet_init, command_line_options) {
  CLI::App app;
  auto* fleet = app.add_subcommand("fleet");
  fleet_init_options o;
  auto* init = tool::add_fleet_init_command(*fleet, o);
  app.parse(
      "fleet init --dir /tmp/x --node a,b --node c --host h1.example --host 10.1.2.3 --cluster 3 "
      "--port 5000 --cluster-port 7000 --operator-key op.pub --node-account",
      false);
  EXPECT_TRUE(init->parsed());
  EXPECT_EQ(o.dir, "/tmp/x");
  EXPECT_EQ(o.nodes, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(o.hosts, (std::vector<std::string>{"h1.example", "10.1.2.3"}));
  EXPECT_EQ(o.servers, 3);
  EXPECT_EQ(o.port, 5000);
  EXPECT_EQ(o.cluster_port, 7000);
  EXPECT_EQ(o.operator_key, "op.pub");
  EXPECT_TRUE(o.node_account);

  CLI::App defaults_app;
  auto* defaults_fleet = defaults_app.add_subcommand("fleet");
  fleet_init_options d;
  (void)tool::add_fleet_init_command(*defaults_fleet, d);
  defaults_app.parse("fleet init --dir y --node a", false);
  EXPECT_EQ(d.hosts, (std::vector<std::string>{"127.0.0.1", "localhost"}));
  EXPECT_EQ(d.servers, 1);
  EXPECT_EQ(d.port, 4222);
  EXPECT_TRUE(d.node_account) << "the nodes' own account is the default layout";

  CLI::App one_app;
  fleet_init_options one;
  (void)tool::add_fleet_init_command(*one_app.add_subcommand("fleet"), one);
  one_app.parse("fleet init --dir y --node a --one-account", false);
  EXPECT_FALSE(one.node_account);
  CLI::App both_app;
  fleet_init_options both;
  (void)tool::add_fleet_init_command(*both_app.add_subcommand("fleet"), both);
  EXPECT_THROW(both_app.parse("fleet init --dir y --node a --one-account --node-account", false),
               CLI::ExcludesError);

  CLI::App missing;
  fleet_init_options m;
  (void)tool::add_fleet_init_command(*missing.add_subcommand("fleet"), m);
  EXPECT_THROW(missing.parse("fleet init --node a", false), CLI::RequiredError);
}

// ---------------------------------------------------------------------------------------------
// The server started from what fleet init wrote.

// A fleet init (operator, node-1, node-2) and a server started from its configuration.
class bus : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    auto o = two_nodes(dir_.path / "fleet");
    o.node_account = node_account();
    write_fleet_init(o);
    d_ = o.dir;
    operator_ = fleet::read_credentials_file(d_ / "operator.creds");
    node1_ = fleet::read_credentials_file(d_ / "nodes/node-1.creds");
    node2_ = fleet::read_credentials_file(d_ / "nodes/node-2.creds");
    // A node's credentials name the prefix its account reaches JetStream through; the
    // operator's none.
    EXPECT_EQ(node1_.api_prefix, node_account() ? tool::node_api_prefix : "");
    EXPECT_EQ(node2_.api_prefix, node1_.api_prefix);
    EXPECT_EQ(operator_.api_prefix, "");
    server_ = std::make_unique<nats_server>(nats_config::from_file(d_ / "server.conf"));
  }

  [[nodiscard]] bool node_account() const { return GetParam(); }
  // The JetStream API prefix of a node, as its credentials file names it: none (the default),
  // or the NODES account's.
  [[nodiscard]] const char* node_prefix() const {
    return node1_.api_prefix.empty() ? nullptr : node1_.api_prefix.c_str();
  }
  [[nodiscard]] std::string node_api() const {
    return node_account() ? std::string(tool::node_api_prefix) : "$JS.API";
  }

  [[nodiscard]] connect_request as(const fleet::bus_credentials& who) const {
    return {{server_->tls_url()}, who.user, who.password, d_ / "ca.pem"};
  }
  // The operator, connected, with the fleet set up.
  nats_client operator_with_fleet() {
    auto op = connect_to(as(operator_));
    EXPECT_TRUE(op.connected()) << op.error;
    if (!op.connected()) return op;
    const auto js = jetstream(op.get());
    set_up_fleet(js.get());
    return op;
  }
  // The control side as the operator runs it: only what fleet init wrote for it.
  [[nodiscard]] fleet::controller_options operator_controller() const {
    fleet::controller_options co;
    co.bus.servers = server_->tls_url();
    co.bus.credentials = d_ / "operator.creds";
    co.bus.ca_file = d_ / "ca.pem";
    co.operator_keys.add(read_public_key_file(d_ / "operator.pub"));
    return co;
  }
  [[nodiscard]] std::size_t violations() const {
    const auto log = server_->log_text();
    std::size_t n = 0;
    for (auto at = log.find("Violation"); at != std::string::npos;
         at = log.find("Violation", at + 1))
      ++n;
    return n;
  }

  temp_dir dir_;
  fs::path d_;
  fleet::bus_credentials operator_, node1_, node2_;
  std::unique_ptr<nats_server> server_;
};

INSTANTIATE_TEST_SUITE_P(layouts, bus, ::testing::Values(false, true), [](const auto& info) {
  return info.param ? "node_account" : "one_account";
});

TEST_P(bus, refuses_strangers_a_wrong_password_and_plain_connections) {
  // No credentials at all.
  auto stranger = connect_to({{server_->tls_url()}, "", "", d_ / "ca.pem"});
  EXPECT_FALSE(stranger.connected());
  EXPECT_NE(stranger.error.find("Authorization Violation"), std::string::npos) << stranger.error;
  // A wrong password; another node's password.
  auto wrong = connect_to({{server_->tls_url()}, "node-1", std::string(64, '0'), d_ / "ca.pem"});
  EXPECT_FALSE(wrong.connected());
  EXPECT_NE(wrong.error.find("Authorization Violation"), std::string::npos) << wrong.error;
  auto swapped = connect_to({{server_->tls_url()}, "node-1", node2_.password, d_ / "ca.pem"});
  EXPECT_FALSE(swapped.connected());
  auto no_user = connect_to({{server_->tls_url()}, "nobody", node1_.password, d_ / "ca.pem"});
  EXPECT_FALSE(no_user.connected());
  // Right credentials without TLS: the server requires it. libnats itself upgrades to TLS
  // when the server asks (and then wants the CA), so the plain client is a raw socket.
  const auto plain = plain_text_session(server_->port(), node1_);
  EXPECT_NE(plain.find("\"tls_required\":true"), std::string::npos) << plain;
  EXPECT_EQ(plain.find("PONG"), std::string::npos) << "a plain-text client was served:\n" << plain;
  auto upgraded = connect_to({{server_->url()}, node1_.user, node1_.password, {}});
  EXPECT_FALSE(upgraded.connected()) << "TLS without the fleet's CA was taken";
  // TLS, but the server's certificate checked against the system's CAs, not the fleet's.
  connect_request system_trust{{server_->tls_url()}, node1_.user, node1_.password, {}};
  system_trust.secure = true;
  auto untrusted = connect_to(system_trust);
  EXPECT_FALSE(untrusted.connected()) << "a server not proven by the fleet's CA was taken";
  // TLS with the fleet's CA and the right password: in, by IP address and by name.
  auto node = connect_to(as(node1_));
  EXPECT_TRUE(node.connected()) << node.error;
  auto op = connect_to(as(operator_));
  EXPECT_TRUE(op.connected()) << op.error;
  auto by_name = connect_to({{"tls://localhost:" + std::to_string(server_->port())},
                             node1_.user,
                             node1_.password,
                             d_ / "ca.pem"});
  EXPECT_TRUE(by_name.connected()) << by_name.error;
}

TEST_P(bus, a_server_certificate_for_other_names_is_refused) {
  // A fleet whose certificate names only another host: the client checks the name it dialled.
  temp_dir other;
  auto o = two_nodes(other.path / "fleet");
  o.hosts = {"nats.example.com"};
  o.node_account = node_account();
  write_fleet_init(o);
  const nats_server elsewhere(nats_config::from_file(o.dir / "server.conf"));
  const auto creds = fleet::read_credentials_file(o.dir / "nodes/node-1.creds");
  auto client = connect_to({{elsewhere.tls_url()}, creds.user, creds.password, o.dir / "ca.pem"});
  EXPECT_FALSE(client.connected()) << "connected to 127.0.0.1 with a certificate for "
                                      "nats.example.com only";
}

TEST_P(bus, the_operator_may_do_everything) {
  auto op = operator_with_fleet();
  ASSERT_TRUE(op.connected());
  const auto js = jetstream(op.get());
  nats_owned<kvStore> kv;
  kvStore* raw = nullptr;
  ASSERT_EQ(js_KeyValue(&raw, js.get(), std::string(fleet::control_bucket).c_str()), NATS_OK);
  kv.reset(raw);
  EXPECT_EQ(kv_text(kv.get(), fleet::desired_key(test_module)), "desired v1");
  EXPECT_EQ(kv_text(kv.get(), std::string(fleet::registry_key)), "registry r1");
  EXPECT_EQ(last_text(js.get(), fleet::bundle_stream(test_module), test_bundle_subject()),
            "bundle v1");
  // It may write any node's subjects (it never does; nothing stops it) and purge and delete.
  jsPubAck* ack = nullptr;
  jsErrCode code = static_cast<jsErrCode>(0);
  EXPECT_EQ(js_Publish(&ack, js.get(), fleet::heartbeat_subject("node-1").c_str(), "x", 1, nullptr,
                       &code),
            NATS_OK);
  jsPubAck_Destroy(ack);
  EXPECT_EQ(js_PurgeStream(js.get(), std::string(fleet::heartbeat_stream).c_str(), nullptr, &code),
            NATS_OK);
  EXPECT_EQ(add_stream(js.get(), "SCRATCH", "scratch.>", 1, 1), NATS_OK);
  EXPECT_EQ(js_DeleteStream(js.get(), "SCRATCH", nullptr, &code), NATS_OK);
  EXPECT_EQ(violations(), 0u) << server_->log_text();
}

TEST_P(bus, a_node_may_make_each_call_of_the_agent) {
  auto op = operator_with_fleet();
  ASSERT_TRUE(op.connected());
  const auto op_js = jetstream(op.get());
  kvStore* raw_op_kv = nullptr;
  ASSERT_EQ(js_KeyValue(&raw_op_kv, op_js.get(), std::string(fleet::control_bucket).c_str()),
            NATS_OK);
  const nats_owned<kvStore> op_kv(raw_op_kv);

  auto node = connect_to(as(node1_));
  ASSERT_TRUE(node.connected()) << node.error;
  const auto js = jetstream(node.get(), 20000, node_prefix());
  // Bind the bucket (its stream's info), get the desired state and the registry.
  kvStore* raw_kv = nullptr;
  ASSERT_EQ(js_KeyValue(&raw_kv, js.get(), std::string(fleet::control_bucket).c_str()), NATS_OK)
      << nats_GetLastError(nullptr);
  const nats_owned<kvStore> kv(raw_kv);
  EXPECT_EQ(kv_text(kv.get(), fleet::desired_key(test_module)), "desired v1");
  EXPECT_EQ(kv_text(kv.get(), std::string(fleet::registry_key)), "registry r1");

  // Watch desired.m: the current value, the end of the initial values, then an update.
  kvWatcher* raw_watcher = nullptr;
  kvWatchOptions watch_options;
  kvWatchOptions_Init(&watch_options);
  ASSERT_EQ(kvStore_Watch(&raw_watcher, kv.get(), fleet::desired_key(test_module).c_str(),
                          &watch_options),
            NATS_OK)
      << nats_GetLastError(nullptr);
  nats_owned<kvWatcher> watcher(raw_watcher);
  kvEntry* entry = nullptr;
  ASSERT_EQ(kvWatcher_Next(&entry, watcher.get(), 20000), NATS_OK);
  ASSERT_NE(entry, nullptr);
  EXPECT_STREQ(kvEntry_ValueString(entry), "desired v1");
  kvEntry_Destroy(entry);
  ASSERT_EQ(kvWatcher_Next(&entry, watcher.get(), 20000), NATS_OK);
  EXPECT_EQ(entry, nullptr);  // the initial values are done
  std::uint64_t revision = 0;
  ASSERT_EQ(kvStore_PutString(&revision, op_kv.get(), fleet::desired_key(test_module).c_str(),
                              "desired v2"),
            NATS_OK);
  ASSERT_EQ(kvWatcher_Next(&entry, watcher.get(), 20000), NATS_OK);
  ASSERT_NE(entry, nullptr);
  EXPECT_STREQ(kvEntry_ValueString(entry), "desired v2");
  kvEntry_Destroy(entry);
  EXPECT_EQ(kvWatcher_Stop(watcher.get()), NATS_OK);  // deletes its consumer
  watcher.reset();

  // The bundle by its subject (a direct get, held to bundle subjects); each stream's info.
  EXPECT_EQ(direct_text(js.get(), fleet::bundle_stream(test_module), test_bundle_subject()),
            "bundle v1");

  for (const auto& stream :
       {std::string(fleet::control_bucket_stream), fleet::bundle_stream(test_module),
        std::string(fleet::result_stream), std::string(fleet::heartbeat_stream)}) {
    jsStreamInfo* info = nullptr;
    jsOptions options;
    jsOptions_Init(&options);
    options.Stream.Info.SubjectsFilter = ">";
    jsErrCode code = static_cast<jsErrCode>(0);
    EXPECT_EQ(js_GetStreamInfo(&info, js.get(), stream.c_str(), &options, &code), NATS_OK)
        << stream << ": JetStream error " << code;
    jsStreamInfo_Destroy(info);
  }

  // Its own result and heartbeat, acknowledged by their streams.
  for (const auto& [subject, stream] :
       {std::pair{fleet::result_subject(test_module, "node-1"), fleet::result_stream},
        std::pair{fleet::heartbeat_subject("node-1"), fleet::heartbeat_stream}}) {
    jsPubAck* ack = nullptr;
    jsErrCode code = static_cast<jsErrCode>(0);
    ASSERT_EQ(js_Publish(&ack, js.get(), subject.c_str(), "signed", 6, nullptr, &code), NATS_OK)
        << subject << ": JetStream error " << code;
    EXPECT_EQ(std::string(ack->Stream), stream);
    jsPubAck_Destroy(ack);
    EXPECT_EQ(last_text(op_js.get(), std::string(stream), subject), "signed");
  }
  EXPECT_EQ(violations(), 0u) << server_->log_text();
  EXPECT_EQ(node.errors->all(), "");
}

// A sink that serves what it is given, for the agent below.
class serving_sink final : public module_sink {
 public:
  std::optional<compute_capability> device_capability() const override {
    return compute_capability{9, 0};
  }
  std::uint64_t current_version(std::string_view) const override { return version_; }
  sink_result apply(const verified_bundle& bundle, apply_rule rule) override {
    // Applied from one thread (the agent's): the compare and the store need no lock here.
    if (rule == apply_rule::above_serving && bundle.version() <= version_)
      return not_newer_result(bundle.manifest.name, bundle.version(), version_);
    version_ = bundle.version();
    return {gate_reason::none, version_, {}};
  }
  sink_result rollback(std::string_view) override {
    return {gate_reason::no_previous_version, version_, "none"};
  }
  std::vector<module_report> status() const override { return {}; }

 private:
  std::atomic<std::uint64_t> version_{0};
};

// The operator's controller and a real agent, each given only what fleet init wrote for it (a
// node: its credentials file, which names its account's JetStream prefix, and the CA): a
// published bundle is applied and answered, and the server logs no violation.
TEST_P(bus, an_agent_given_only_its_credentials_file_applies_a_publish) {
  const std::string m(test_module);
  fleet::controller control(operator_controller());
  const auto operator_key = read_secret_key_file(d_ / "operator.key");
  control.enroll("node-1", read_public_key_file(d_ / "nodes/node-1.pub"), {}, operator_key);

  const auto sink = std::make_shared<serving_sink>();
  update_gate_options gate_options;
  gate_options.keys.add(read_public_key_file(d_ / "operator.pub"));
  gate_options.persist_state = false;
  const auto gate = update_gate::create(sink, gate_options);
  fleet_agent_options ao;
  ao.bus.servers = server_->tls_url();
  ao.bus.credentials = d_ / "nodes/node-1.creds";
  ao.bus.ca_file = d_ / "ca.pem";
  ao.node = "node-1";
  ao.node_key_file = d_ / "nodes/node-1.key";
  ao.modules = {m};
  fleet_agent agent(gate, ao);
  agent.start();
  ASSERT_TRUE(eventually([&] { return agent.connected(); }, std::chrono::seconds(20)))
      << agent.last_problem();

  const auto bundle = source_bundle(m, 1, operator_key);
  const auto report = control.publish(bundle, operator_key);
  const std::vector<std::string> node{"node-1"};
  const auto results =
      control.wait_for_results(m, report.desired.revision, cubridge::detail::sha256_hex(bundle),
                               node, std::chrono::seconds(30));
  ASSERT_EQ(results.size(), 1u) << agent.last_problem();
  EXPECT_EQ(results.front().outcome, gate_outcome::applied) << results.front().detail;
  EXPECT_EQ(sink->current_version(m), 1u);
  agent.stop();
  EXPECT_EQ(violations(), 0u) << server_->log_text();
}

// Issue 33: one node's key cannot make the results stream evict another node's results. The
// stream stores only modules with a desired state, so a node's share is results_kept per module.
TEST_P(bus, a_node_cannot_evict_another_nodes_results) {
  const std::string m(test_module);
  fleet::controller control(operator_controller());
  const auto operator_key = read_secret_key_file(d_ / "operator.key");
  (void)control.publish(source_bundle(m, 1, operator_key), operator_key);
  auto op = connect_to(as(operator_));
  ASSERT_TRUE(op.connected()) << op.error;
  const auto op_js = jetstream(op.get());

  // node-2's result, then node-1 (compromised) floods: 200 module tokens, 64 results each of the
  // largest size on the module that exists.
  auto node2 = connect_to(as(node2_));
  ASSERT_TRUE(node2.connected()) << node2.error;
  const auto js2 = jetstream(node2.get(), 5000, node_prefix());
  const auto honest = fleet::result_subject(m, "node-2");
  jsPubAck* ack = nullptr;
  jsErrCode code = static_cast<jsErrCode>(0);
  ASSERT_EQ(js_Publish(&ack, js2.get(), honest.c_str(), "node-2 result", 13, nullptr, &code),
            NATS_OK)
      << "JetStream error " << code;
  jsPubAck_Destroy(ack);

  auto node1 = connect_to(as(node1_));
  ASSERT_TRUE(node1.connected()) << node1.error;
  const auto js1 = jetstream(node1.get(), 500, node_prefix());
  const char one_byte[] = "x";
  // Plain publishes (no ack to wait for: 2.9's service imports carry no "no responders").
  for (int token = 0; token < 200; ++token) {
    const auto subject = fleet::result_subject("forged-" + std::to_string(token), "node-1");
    ASSERT_EQ(natsConnection_Publish(node1.get(), subject.c_str(), one_byte, 1), NATS_OK);
  }
  ASSERT_EQ(natsConnection_FlushTimeout(node1.get(), 5000), NATS_OK);
  ack = nullptr;
  const auto forged = fleet::result_subject("forged-0", "node-1");
  EXPECT_NE(js_Publish(&ack, js1.get(), forged.c_str(), "x", 1, nullptr, &code), NATS_OK)
      << "a result of a module with no desired state is stored nowhere";
  jsPubAck_Destroy(ack);
  const std::string big(200 << 10, 'r');
  const auto own = fleet::result_subject(m, "node-1");
  for (int i = 0; i < 64; ++i) {
    ack = nullptr;
    ASSERT_EQ(js_Publish(&ack, js1.get(), own.c_str(), big.data(), static_cast<int>(big.size()),
                         nullptr, &code),
              NATS_OK)
        << "JetStream error " << code;
    jsPubAck_Destroy(ack);
  }

  jsStreamInfo* raw_info = nullptr;
  ASSERT_EQ(js_GetStreamInfo(&raw_info, op_js.get(), std::string(fleet::result_stream).c_str(),
                             nullptr, &code),
            NATS_OK);
  const nats_owned<jsStreamInfo> info(raw_info);
  ASSERT_EQ(info->Config->SubjectsLen, 1);
  EXPECT_EQ(std::string(info->Config->Subjects[0]), fleet::result_subjects(m));
  EXPECT_EQ(info->State.Msgs, 5u) << "node-1 keeps its last 4, node-2 its one";
  EXPECT_LT(info->State.Bytes, std::uint64_t{1} << 20);
  EXPECT_EQ(last_text(op_js.get(), std::string(fleet::result_stream), honest), "node-2 result");
}

TEST_P(bus, a_node_watch_gets_its_flow_control_through) {
  // 16 revisions of 1 MiB: the ordered consumer asks for flow control on the way.
  auto op = operator_with_fleet();
  ASSERT_TRUE(op.connected());
  const auto op_js = jetstream(op.get());
  kvStore* raw_op_kv = nullptr;
  ASSERT_EQ(js_KeyValue(&raw_op_kv, op_js.get(), std::string(fleet::control_bucket).c_str()),
            NATS_OK);
  const nats_owned<kvStore> op_kv(raw_op_kv);
  const std::string big(1 << 20, 'x');
  for (int i = 0; i < 16; ++i) {
    std::uint64_t revision = 0;
    ASSERT_EQ(kvStore_Put(&revision, op_kv.get(), fleet::desired_key(test_module).c_str(),
                          big.data(), static_cast<int>(big.size())),
              NATS_OK);
  }
  auto node = connect_to(as(node1_));
  ASSERT_TRUE(node.connected()) << node.error;
  const auto js = jetstream(node.get(), 20000, node_prefix());
  kvStore* raw_kv = nullptr;
  ASSERT_EQ(js_KeyValue(&raw_kv, js.get(), std::string(fleet::control_bucket).c_str()), NATS_OK);
  const nats_owned<kvStore> kv(raw_kv);
  kvWatcher* raw_watcher = nullptr;
  kvWatchOptions options;
  kvWatchOptions_Init(&options);
  options.IncludeHistory = true;
  ASSERT_EQ(
      kvStore_Watch(&raw_watcher, kv.get(), fleet::desired_key(test_module).c_str(), &options),
      NATS_OK);
  const nats_owned<kvWatcher> watcher(raw_watcher);
  int values = 0;
  for (kvEntry* entry = nullptr; kvWatcher_Next(&entry, watcher.get(), 20000) == NATS_OK;) {
    if (!entry) break;  // the initial values are done
    ++values;
    kvEntry_Destroy(entry);
  }
  EXPECT_EQ(values, 16);
  EXPECT_EQ(violations(), 0u) << server_->log_text();
}

// A JetStream call a node may not make: refused (the server drops the request, so the
// call gets no answer) and named in the server's log.
class refusals : public bus {
 protected:
  void expect_violation(const std::string& subject, const nats_client& node) {
    EXPECT_TRUE(eventually([&] { return node.errors->has("\"" + subject + "\""); }, patience))
        << "no permissions violation for " << subject << "; the client heard:\n"
        << node.errors->all();
  }
};

INSTANTIATE_TEST_SUITE_P(layouts, refusals, ::testing::Values(false, true), [](const auto& info) {
  return info.param ? "node_account" : "one_account";
});

TEST_P(refusals, a_node_cannot_publish_another_nodes_result_or_heartbeat) {
  auto op = operator_with_fleet();
  ASSERT_TRUE(op.connected());
  const auto op_js = jetstream(op.get());
  auto node = connect_to(as(node1_));
  ASSERT_TRUE(node.connected()) << node.error;
  const auto js = jetstream(node.get(), 500, node_prefix());
  for (const auto& [subject, stream] :
       {std::pair{fleet::result_subject(test_module, "node-2"), fleet::result_stream},
        std::pair{fleet::heartbeat_subject("node-2"), fleet::heartbeat_stream},
        std::pair{std::string("cubridge.heartbeat.node-1.x"), fleet::heartbeat_stream}}) {
    jsPubAck* ack = nullptr;
    jsErrCode code = static_cast<jsErrCode>(0);
    EXPECT_NE(js_Publish(&ack, js.get(), subject.c_str(), "forged", 6, nullptr, &code), NATS_OK)
        << subject;
    jsPubAck_Destroy(ack);
    expect_violation(subject, node);
    EXPECT_EQ(last_text(op_js.get(), std::string(stream), subject), "") << subject;
  }
}

TEST_P(refusals, a_node_cannot_write_the_bucket_or_a_bundle) {
  auto op = operator_with_fleet();
  ASSERT_TRUE(op.connected());
  const auto op_js = jetstream(op.get());
  auto node = connect_to(as(node1_));
  ASSERT_TRUE(node.connected()) << node.error;
  const auto js = jetstream(node.get(), 500, node_prefix());
  kvStore* raw_kv = nullptr;
  ASSERT_EQ(js_KeyValue(&raw_kv, js.get(), std::string(fleet::control_bucket).c_str()), NATS_OK);
  const nats_owned<kvStore> kv(raw_kv);
  std::uint64_t revision = 0;
  const auto desired = fleet::desired_key(test_module);
  const std::string registry(fleet::registry_key);
  EXPECT_NE(kvStore_PutString(&revision, kv.get(), desired.c_str(), "forged"), NATS_OK);
  EXPECT_NE(kvStore_UpdateString(&revision, kv.get(), registry.c_str(), "forged", 2), NATS_OK);
  EXPECT_NE(kvStore_CreateString(&revision, kv.get(), "desired.other", "forged"), NATS_OK);
  EXPECT_NE(kvStore_Delete(kv.get(), desired.c_str()), NATS_OK);
  EXPECT_NE(kvStore_Purge(kv.get(), registry.c_str(), nullptr), NATS_OK);
  // The bucket's subjects published directly, as a raw client would.
  const std::string kv_subject = "$KV." + std::string(fleet::control_bucket) + "." + registry;
  EXPECT_EQ(natsConnection_PublishString(node.get(), kv_subject.c_str(), "forged"), NATS_OK);
  expect_violation(kv_subject, node);
  // A bundle of another version.
  const auto bundle = fleet::bundle_subject(test_module, 2, std::string(64, 'b'));
  jsPubAck* ack = nullptr;
  jsErrCode code = static_cast<jsErrCode>(0);
  EXPECT_NE(js_Publish(&ack, js.get(), bundle.c_str(), "forged", 6, nullptr, &code), NATS_OK);
  jsPubAck_Destroy(ack);
  expect_violation(bundle, node);
  EXPECT_NE(js_Publish(&ack, js.get(), test_bundle_subject().c_str(), "forged", 6, nullptr, &code),
            NATS_OK);
  jsPubAck_Destroy(ack);

  // What the operator wrote is all there is.
  kvStore* raw_op_kv = nullptr;
  ASSERT_EQ(js_KeyValue(&raw_op_kv, op_js.get(), std::string(fleet::control_bucket).c_str()),
            NATS_OK);
  const nats_owned<kvStore> op_kv(raw_op_kv);
  EXPECT_EQ(kv_text(op_kv.get(), desired), "desired v1");
  EXPECT_EQ(kv_text(op_kv.get(), registry), "registry r1");
  EXPECT_EQ(kv_text(op_kv.get(), "desired.other"), "");
  EXPECT_EQ(last_text(op_js.get(), fleet::bundle_stream(test_module), bundle), "");
  EXPECT_EQ(last_text(op_js.get(), fleet::bundle_stream(test_module), test_bundle_subject()),
            "bundle v1");
}

TEST_P(refusals, a_node_cannot_administer_streams_or_durable_consumers) {
  auto op = operator_with_fleet();
  ASSERT_TRUE(op.connected());
  const auto op_js = jetstream(op.get());
  auto node = connect_to(as(node1_));
  ASSERT_TRUE(node.connected()) << node.error;
  const auto js = jetstream(node.get(), 500, node_prefix());
  const std::string heartbeats(fleet::heartbeat_stream);
  const std::string api = node_api();
  jsErrCode code = static_cast<jsErrCode>(0);

  EXPECT_NE(add_stream(js.get(), "EVIL", "cubridge.heartbeat.>", 1, 1), NATS_OK);
  expect_violation(api + ".STREAM.CREATE.EVIL", node);
  jsStreamConfig config;
  jsStreamConfig_Init(&config);
  config.Name = heartbeats.c_str();
  jsStreamInfo* info = nullptr;
  EXPECT_NE(js_UpdateStream(&info, js.get(), &config, nullptr, &code), NATS_OK);
  jsStreamInfo_Destroy(info);
  expect_violation(api + ".STREAM.UPDATE." + heartbeats, node);
  EXPECT_NE(js_PurgeStream(js.get(), heartbeats.c_str(), nullptr, &code), NATS_OK);
  expect_violation(api + ".STREAM.PURGE." + heartbeats, node);
  EXPECT_NE(js_DeleteStream(js.get(), heartbeats.c_str(), nullptr, &code), NATS_OK);
  expect_violation(api + ".STREAM.DELETE." + heartbeats, node);
  EXPECT_NE(js_DeleteMsg(js.get(), fleet::bundle_stream(test_module).c_str(), 1, nullptr, &code),
            NATS_OK);
  expect_violation(api + ".STREAM.MSG.DELETE." + fleet::bundle_stream(test_module), node);
  // Its direct gets are held to bundle subjects; the old message get is not allowed at all.
  const auto others = fleet::result_subject(test_module, "node-2");
  EXPECT_EQ(direct_text(js.get(), std::string(fleet::result_stream), others), "");
  expect_violation(api + ".DIRECT.GET." + std::string(fleet::result_stream) + "." + others, node);
  EXPECT_EQ(last_text(js.get(), fleet::bundle_stream(test_module), test_bundle_subject()), "");
  expect_violation(api + ".STREAM.MSG.GET." + fleet::bundle_stream(test_module), node);
  EXPECT_NE(js_DeleteKeyValue(js.get(), std::string(fleet::control_bucket).c_str()), NATS_OK);
  EXPECT_NE(add_bucket(js.get(), 1), NATS_OK);
  // A durable consumer (it would outlive the node's session) on the bucket's stream.
  jsConsumerConfig consumer;
  jsConsumerConfig_Init(&consumer);
  consumer.Durable = "evil";
  consumer.AckPolicy = js_AckExplicit;
  jsConsumerInfo* consumer_info = nullptr;
  EXPECT_NE(
      js_AddConsumer(&consumer_info, js.get(), std::string(fleet::control_bucket_stream).c_str(),
                     &consumer, nullptr, &code),
      NATS_OK);
  jsConsumerInfo_Destroy(consumer_info);
  expect_violation(
      api + ".CONSUMER.DURABLE.CREATE." + std::string(fleet::control_bucket_stream) + ".evil",
      node);
  // Account information, not among the agent's calls.
  jsAccountInfo* account = nullptr;
  EXPECT_NE(js_GetAccountInfo(&account, js.get(), nullptr, &code), NATS_OK);
  jsAccountInfo_Destroy(account);

  // Everything is as the operator left it.
  EXPECT_EQ(last_text(op_js.get(), fleet::bundle_stream(test_module), test_bundle_subject()),
            "bundle v1");
  jsStreamInfo* there = nullptr;
  EXPECT_EQ(js_GetStreamInfo(&there, op_js.get(), heartbeats.c_str(), nullptr, &code), NATS_OK);
  jsStreamInfo_Destroy(there);
  there = nullptr;
  EXPECT_NE(js_GetStreamInfo(&there, op_js.get(), "EVIL", nullptr, &code), NATS_OK);
  jsStreamInfo_Destroy(there);
}

TEST_P(refusals, a_node_may_subscribe_only_to_its_inbox) {
  auto op = operator_with_fleet();
  ASSERT_TRUE(op.connected());
  auto node = connect_to(as(node1_));
  ASSERT_TRUE(node.connected()) << node.error;
  for (const auto* subject :
       {"cubridge.heartbeat.>", "cubridge.result.m.node-2", ">", "$KV.cubridge_fleet.>"}) {
    natsSubscription* raw = nullptr;
    ASSERT_EQ(natsConnection_SubscribeSync(&raw, node.get(), subject), NATS_OK);
    const nats_owned<natsSubscription> subscription(raw);
    EXPECT_TRUE(eventually(
        [&] {
          return node.errors->has("ubscription") &&
                 node.errors->has(std::string("\"") + subject + "\"");
        },
        patience))
        << subject << "; the client heard:\n"
        << node.errors->all();
  }
}

TEST_P(refusals, a_consumer_delivering_into_a_fleet_subject_stores_nothing) {
  // CONSUMER.CREATE is the node's (its watch); a push consumer's deliver subject is chosen by
  // who creates it, and JetStream delivers with its own rights. Streams do not store what a
  // consumer delivers, so another node's heartbeat cannot be written that way.
  auto op = operator_with_fleet();
  ASSERT_TRUE(op.connected());
  const auto op_js = jetstream(op.get());
  natsSubscription* raw = nullptr;  // interest in the deliver subject, so that it delivers
  ASSERT_EQ(natsConnection_SubscribeSync(&raw, op.get(), "cubridge.heartbeat.node-2"), NATS_OK);
  const nats_owned<natsSubscription> watching(raw);
  auto node = connect_to(as(node1_));
  ASSERT_TRUE(node.connected()) << node.error;
  const std::string request =
      R"({"stream_name":"KV_cubridge_fleet","config":{"deliver_subject":"cubridge.heartbeat.node-2",)"
      R"("deliver_policy":"all","ack_policy":"none"}})";
  natsMsg* reply = nullptr;
  ASSERT_EQ(
      natsConnection_RequestString(
          &reply, node.get(),
          (node_api() + ".CONSUMER.CREATE." + std::string(fleet::control_bucket_stream)).c_str(),
          request.c_str(), 20000),
      NATS_OK);
  natsMsg_Destroy(reply);
  natsMsg* delivered = nullptr;
  ASSERT_EQ(natsSubscription_NextMsg(&delivered, watching.get(), 20000), NATS_OK);  // it delivers
  natsMsg_Destroy(delivered);
  EXPECT_EQ(last_text(op_js.get(), std::string(fleet::heartbeat_stream),
                      fleet::heartbeat_subject("node-2")),
            "");
}

TEST_P(refusals, a_reply_subject_writes_a_fleet_subject_only_in_one_account) {
  // Known: in one account, a request's reply subject is where JetStream sends its answer, with
  // JetStream's rights; permissions check what a client publishes to, never its reply subject.
  // A node may so make the server write an answer (JSON, signed by nobody) onto another node's
  // heartbeat or into the bucket. Readers refuse it (it is no signed record), but it displaces
  // the last good one. With the nodes in an account of their own the answer stays in NODES.
  auto op = operator_with_fleet();
  ASSERT_TRUE(op.connected());
  const auto op_js = jetstream(op.get());
  auto node = connect_to(as(node1_));
  ASSERT_TRUE(node.connected()) << node.error;
  const std::string own_heartbeat = fleet::heartbeat_subject("node-1");
  const std::string desired_subject =
      "$KV." + std::string(fleet::control_bucket) + "." + fleet::desired_key(test_module);
  const auto request = [&](const std::string& subject, const std::string& reply) {
    natsMsg* message = nullptr;
    ASSERT_EQ(natsMsg_Create(&message, subject.c_str(), reply.c_str(), "{}", 2), NATS_OK);
    EXPECT_EQ(natsConnection_PublishMsg(node.get(), message), NATS_OK);
    natsMsg_Destroy(message);
  };
  request(node_api() + ".STREAM.INFO." + std::string(fleet::heartbeat_stream),
          fleet::heartbeat_subject("node-2"));
  request(node_api() + ".STREAM.INFO." + std::string(fleet::heartbeat_stream), desired_subject);
  request(own_heartbeat, fleet::result_subject(test_module, "node-2"));  // the ack goes there
  ASSERT_EQ(natsConnection_FlushTimeout(node.get(), 20000), NATS_OK);

  // Written (or not) by the time the node's own heartbeat, published last, is stored.
  ASSERT_TRUE(eventually(
      [&] {
        return !last_text(op_js.get(), std::string(fleet::heartbeat_stream), own_heartbeat).empty();
      },
      patience));
  kvStore* raw_kv = nullptr;
  ASSERT_EQ(js_KeyValue(&raw_kv, op_js.get(), std::string(fleet::control_bucket).c_str()), NATS_OK);
  const nats_owned<kvStore> kv(raw_kv);
  const bool one_account = !node_account();
  EXPECT_EQ(last_text(op_js.get(), std::string(fleet::heartbeat_stream),
                      fleet::heartbeat_subject("node-2"))
                .empty(),
            !one_account);
  EXPECT_EQ(kv_text(kv.get(), fleet::desired_key(test_module)) == "desired v1", !one_account);
  EXPECT_EQ(last_text(op_js.get(), std::string(fleet::result_stream),
                      fleet::result_subject(test_module, "node-2"))
                .empty(),
            !one_account);
}

// ---------------------------------------------------------------------------------------------
// The cluster fleet init writes.

TEST(fleet_init_cluster, its_three_configurations_form_a_tls_cluster_with_its_users) {
  temp_dir tmp;
  auto o = two_nodes(tmp.path / "fleet");
  o.servers = 3;
  write_fleet_init(o);
  const auto op = fleet::read_credentials_file(o.dir / "operator.creds");
  const auto node = fleet::read_credentials_file(o.dir / "nodes/node-1.creds");
  // The fixture's ports replace the files' (4222..., 6222...); routes verify both sides by the
  // fleet's CA.
  nats_cluster cluster({o.dir / "server-1.conf", o.dir / "server-2.conf", o.dir / "server-3.conf"},
                       {op.user, op.password, o.dir / "ca.pem"});
  connect_request as_operator{fleet::parse_server_list(cluster.urls("tls")), op.user, op.password,
                              o.dir / "ca.pem"};
  auto operator_client = connect_to(as_operator);
  ASSERT_TRUE(operator_client.connected()) << operator_client.error;
  const auto js = jetstream(operator_client.get());
  // Peers may still be registering with the meta leader: the first R3 stream is retried.
  const std::string m(test_module);
  ASSERT_TRUE(eventually(
      [&] {
        return add_stream(js.get(), fleet::bundle_stream(m), fleet::bundle_subjects(m), 1, 3) ==
               NATS_OK;
      },
      std::chrono::seconds(30)))
      << cluster.log_text();
  ASSERT_EQ(js_DeleteStream(js.get(), fleet::bundle_stream(m).c_str(), nullptr, nullptr), NATS_OK);
  set_up_fleet(js.get(), 3);

  connect_request as_node{fleet::parse_server_list(cluster.urls("tls")), node.user, node.password,
                          o.dir / "ca.pem"};
  auto node_client = connect_to(as_node);
  ASSERT_TRUE(node_client.connected()) << node_client.error;
  // The node reaches JetStream through the prefix of its credentials (the NODES account).
  ASSERT_EQ(node.api_prefix, tool::node_api_prefix);
  const auto node_js = jetstream(node_client.get(), 5000, node.api_prefix.c_str());
  kvStore* raw_kv = nullptr;
  ASSERT_EQ(js_KeyValue(&raw_kv, node_js.get(), std::string(fleet::control_bucket).c_str()),
            NATS_OK);
  const nats_owned<kvStore> kv(raw_kv);
  EXPECT_EQ(kv_text(kv.get(), fleet::desired_key(m)), "desired v1");
  // A direct get is answered by any replica, one that may not hold the bundle yet.
  EXPECT_TRUE(eventually(
      [&] {
        return direct_text(node_js.get(), fleet::bundle_stream(m), test_bundle_subject()) ==
               "bundle v1";
      },
      std::chrono::seconds(10)));
  jsPubAck* ack = nullptr;
  jsErrCode code = static_cast<jsErrCode>(0);
  EXPECT_EQ(js_Publish(&ack, node_js.get(), fleet::heartbeat_subject("node-1").c_str(), "beat", 4,
                       nullptr, &code),
            NATS_OK)
      << "JetStream error " << code;
  jsPubAck_Destroy(ack);
  EXPECT_EQ(cluster.log_text().find("Violation"), std::string::npos) << cluster.log_text();
}

}  // namespace
