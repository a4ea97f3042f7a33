#include "secured_server.hpp"

#include <cubridge/bundle/detail/signing.hpp>
#include <cubridge/core/detail/hex.hpp>
#include <cubridge/fleet/connection.hpp>
#include <cubridge/fleet/subjects.hpp>

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>

namespace cubridge::bench {
namespace {

std::string random_password() {
  std::array<std::byte, 16> bytes{};
  cubridge::detail::random_bytes(bytes);
  return cubridge::detail::to_hex(bytes);
}

std::string server_program() {
  if (const char* chosen = std::getenv("CUBRIDGE_NATS_SERVER"); chosen && *chosen) return chosen;
  if (::access("/usr/sbin/nats-server", X_OK) == 0) return "/usr/sbin/nats-server";
  return "/usr/bin/nats-server";
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const std::string reason = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    throw std::runtime_error("no free loopback port: " + reason);
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

// A quoted string of the server's configuration language: quoted, '$' is no variable.
std::string config_string(std::string_view text) {
  return "\"" + std::string(text) + "\"";
}

std::string list(const std::vector<std::string>& items) {
  std::string out = "[";
  for (const auto& item : items) out += (out.size() > 1 ? ", " : "") + config_string(item);
  return out + "]";
}

// utime and stime (fields 14 and 15) of a /proc/<pid>/stat line, and the parent (field 4).
struct stat_fields {
  pid_t parent = 0;
  double cpu_seconds = 0;
};
std::optional<stat_fields> read_stat(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string text;
  if (!std::getline(in, text)) return std::nullopt;
  const auto close = text.rfind(')');  // the command may hold spaces and parentheses
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(close + 2));
  std::string state;
  long long parent = 0;
  fields >> state >> parent;
  std::string skip;
  for (int field = 5; field < 14; ++field) fields >> skip;
  unsigned long long user = 0, system = 0;
  fields >> user >> system;
  if (!fields) return std::nullopt;
  const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
  return stat_fields{static_cast<pid_t>(parent), static_cast<double>(user + system) / ticks};
}

}  // namespace

std::string_view to_string(node_permissions permissions) noexcept {
  return permissions == node_permissions::exact ? "exact" : "broad";
}

std::vector<std::string> node_publish_allow(std::string_view node, std::string_view module,
                                            node_permissions permissions) {
  const std::string n(node), m(module);
  std::vector<std::string> allow = {"cubridge.result.*." + n, fleet::heartbeat_subject(n)};
  if (permissions == node_permissions::broad) {
    allow.insert(allow.end(), {"$JS.API.>", "$JS.FC.>", "$JS.ACK.>", "_INBOX.>"});
    return allow;
  }
  const std::string kv(fleet::control_bucket_stream), bucket(fleet::control_bucket);
  allow.insert(allow.end(),
               {
                   // js_KeyValue: binds the bucket.
                   "$JS.API.STREAM.INFO." + kv,
                   // kvStore_Get of desired.<m> (the bucket allows direct gets).
                   "$JS.API.DIRECT.GET." + kv + ".$KV." + bucket + "." + fleet::desired_key(m),
                   // The desired state's history, by sequence (the key in the request's body).
                   "$JS.API.DIRECT.GET." + kv,
                   // kvStore_Watch: an ordered consumer, found by subject.
                   "$JS.API.STREAM.NAMES",
                   "$JS.API.CONSUMER.CREATE." + kv,
                   "$JS.API.CONSUMER.DELETE." + kv + ".*",
                   "$JS.FC." + kv + ".>",
                   // js_DirectGetMsg of the module's bundles.
                   "$JS.API.DIRECT.GET." + fleet::bundle_stream(m) + ".cubridge.bundle.>",
               });
  return allow;
}

secured_server::secured_server(std::filesystem::path dir, node_permissions permissions)
    : dir_(std::move(dir)),
      config_(dir_ / "nats.conf"),
      log_(dir_ / "server.log"),
      operator_credentials_(dir_ / "credentials" / "operator.creds"),
      permissions_(permissions),
      operator_password_(random_password()) {
  std::filesystem::create_directories(dir_ / "credentials");
  fleet::write_credentials_file(operator_credentials_, {operator_user_, operator_password_},
                                "bench_fleet operator");
}

secured_server::~secured_server() {
  (void)process_.kill();
}

std::filesystem::path secured_server::add_node(const std::string& node, const std::string& module) {
  if (configured_) throw std::logic_error("secured_server: node users are added before start()");
  users_.push_back({node, random_password(), module});
  const auto file = dir_ / "credentials" / (node + ".creds");
  fleet::write_credentials_file(file, {node, users_.back().password}, "bench_fleet node " + node);
  return file;
}

const std::filesystem::path& secured_server::operator_credentials() const noexcept {
  return operator_credentials_;
}

void secured_server::write_config() const {
  std::ostringstream c;
  c << "# bench_fleet: authentication on (users and subject permissions), TLS off.\n"
    << "max_payload: 16MB\n"
    << "http: \"127.0.0.1:" << monitor_port_ << "\"\n"
    << "jetstream {\n  store_dir: " << config_string((dir_ / "store").string()) << "\n}\n"
    << "authorization {\n  users = [\n"
    << "    {user: " << config_string(operator_user_)
    << ", password: " << config_string(operator_password_) << "}\n";
  for (const auto& u : users_)
    c << "    {user: " << config_string(u.name) << ", password: " << config_string(u.password)
      << ", permissions: {publish: {allow: "
      << list(node_publish_allow(u.name, u.module, permissions_))
      << "}, subscribe: {allow: [\"_INBOX.>\"]}}}\n";
  c << "  ]\n}\n";
  const auto text = c.str();
  const int fd = ::open(config_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error("cannot write " + config_.string());
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  if (!written) throw std::runtime_error("cannot write " + config_.string());
}

void secured_server::start() {
  if (process_.running()) return;
  if (!configured_) {
    monitor_port_ = free_port();
    write_config();
    configured_ = true;
  }
  // The port is free when picked, but another process may take it first: then another port.
  for (int attempt = 0;; ++attempt) {
    if (port_ == 0 || attempt > 0) port_ = free_port();
    const int log = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    detail::child_spec spec;
    spec.program = server_program();
    spec.args = {"-js", "-c", config_.string(), "-a", "127.0.0.1", "-p", std::to_string(port_)};
    spec.environment = detail::current_environment();
    spec.fds = {{0, null}, {1, log}, {2, log}};
    process_ = detail::child_process::spawn(spec);
    ::close(log);
    ::close(null);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    bool up = false, ended = false;
    while (!(up = answers())) {
      if (process_.try_wait()) {
        ended = true;
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) break;
      ::poll(nullptr, 0, 10);  // between connection attempts, not a synchronisation
    }
    if (up) return;
    (void)process_.kill();
    if (!ended || attempt == 4)
      throw std::runtime_error("nats-server on port " + std::to_string(port_) +
                               " did not start:\n" + log_text());
  }
}

void secured_server::kill() {
  (void)process_.kill();
}

std::string secured_server::url() const {
  return "nats://127.0.0.1:" + std::to_string(port_);
}

double secured_server::cpu_seconds() const {
  return process_.running() ? process_cpu_seconds(process_.pid()) : 0.0;
}

std::string secured_server::log_text() const {
  std::ifstream in(log_);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::size_t secured_server::log_lines_with(std::string_view what) const {
  std::ifstream in(log_);
  std::size_t n = 0;
  for (std::string line; std::getline(in, line);) n += line.find(what) != std::string::npos;
  return n;
}

std::string secured_server::monitor_page(const std::string& path) const {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return {};
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(monitor_port_));
  std::string reply;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) {
    const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
        static_cast<ssize_t>(request.size())) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
      char buffer[16384];
      while (std::chrono::steady_clock::now() < deadline) {
        pollfd readable{fd, POLLIN, 0};
        if (::poll(&readable, 1, 200) != 1) continue;
        const auto n = ::recv(fd, buffer, sizeof buffer, 0);
        if (n <= 0) break;
        reply.append(buffer, static_cast<std::size_t>(n));
      }
    }
  }
  ::close(fd);
  const auto body = reply.find("\r\n\r\n");
  return body == std::string::npos ? std::string() : reply.substr(body + 4);
}

// True when the server accepts a connection and greets it with INFO.
bool secured_server::answers() const {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port_));
  bool greeted = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) {
    pollfd readable{fd, POLLIN, 0};
    char greeting[5] = {};
    if (::poll(&readable, 1, 2000) == 1 && ::recv(fd, greeting, 4, MSG_WAITALL) == 4)
      greeted = std::string_view(greeting, 4) == "INFO";
  }
  ::close(fd);
  return greeted;
}

double process_cpu_seconds(pid_t pid) {
  const auto fields = read_stat("/proc/" + std::to_string(pid) + "/stat");
  return fields ? fields->cpu_seconds : 0.0;
}

double children_cpu_seconds(pid_t except) {
  const pid_t self = ::getpid();
  double total = 0;
  DIR* proc = ::opendir("/proc");
  if (!proc) return 0;
  while (const dirent* entry = ::readdir(proc)) {
    const char* name = entry->d_name;
    if (name[0] < '1' || name[0] > '9') continue;
    const auto pid = static_cast<pid_t>(std::atol(name));
    if (pid == except) continue;
    if (const auto fields = read_stat(std::string("/proc/") + name + "/stat");
        fields && fields->parent == self)
      total += fields->cpu_seconds;
  }
  ::closedir(proc);
  return total;
}

std::size_t process_rss_bytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;  // "... kB"
  return 0;
}

double self_cpu_seconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  const auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
  };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

}  // namespace cubridge::bench
