// The update endpoint: cpp-httplib for HTTP parsing and routing, with connection handling of our
// own (bounded workers, per-request deadlines, TLS through OpenSSL); see update_endpoint.hpp.
#include <cubridge/image.hpp>
#include <cubridge/rollback_request.hpp>
#include <cubridge/update_endpoint.hpp>

#include <httplib.h>
#include <nlohmann/json.hpp>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

namespace cubridge {
namespace {

using json = nlohmann::json;
using steady = std::chrono::steady_clock;
constexpr std::string_view modules_prefix = "/v1/modules/";
constexpr std::string_view rollback_suffix = "/rollback";

// --- connections ------------------------------------------------------------------------------

// Set by the accepting thread when a connection must be refused (see bounded_pool::enqueue).
thread_local bool refuse_this_connection = false;

// Per-connection state a handler can reach: connections are served on one worker thread.
struct connection_state {
  bool close_after_response = false;
};
thread_local connection_state* current_connection = nullptr;

void close_after_response() {
  if (current_connection) current_connection->close_after_response = true;
}

// Workers for accepted connections. httplib's own pool queues without limit; this one lets
// `max_queued` connections wait and has the accepting thread refuse the rest at once.
class bounded_pool final : public httplib::TaskQueue {
 public:
  bounded_pool(std::size_t threads, std::size_t max_queued, std::atomic<std::uint64_t>& refused)
      : capacity_(threads + max_queued), refused_(refused) {
    for (std::size_t i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }
  ~bounded_pool() override { shutdown(); }

  void enqueue(std::function<void()> job) override {
    {
      std::lock_guard lock(mutex_);
      // Counted from jobs taken, not from idle workers: a worker not started yet is not busy.
      if (!stopping_ && busy_ + jobs_.size() < capacity_) {
        jobs_.push_back(std::move(job));
        wake_.notify_one();
        return;
      }
    }
    ++refused_;
    refuse_this_connection = true;  // the job answers 503 and closes, reading nothing
    job();
    refuse_this_connection = false;
  }

  void shutdown() override {
    {
      std::lock_guard lock(mutex_);
      if (stopping_ && workers_.empty()) return;
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
  }

 private:
  void work() {
    // OpenSSL writes to sockets with write(); a client that went away must give EPIPE here,
    // not a SIGPIPE that ends the service.
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, and every accepted connection served
        job = std::move(jobs_.front());
        jobs_.pop_front();
        ++busy_;
      }
      job();
      std::lock_guard lock(mutex_);
      --busy_;
    }
  }

  std::size_t capacity_;  // connections served plus connections waiting
  std::atomic<std::uint64_t>& refused_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_;
  std::size_t busy_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

// A connection as httplib reads and writes it: a non-blocking socket (optionally TLS) where every
// wait is bounded by its own timeout and by the deadline of the request in progress.
class connection_stream final : public httplib::Stream {
 public:
  connection_stream(int fd, SSL* ssl, std::chrono::milliseconds read_timeout,
                    std::chrono::milliseconds write_timeout)
      : fd_(fd), ssl_(ssl), read_timeout_(read_timeout), write_timeout_(write_timeout) {}

  void set_deadline(steady::time_point deadline) { deadline_ = deadline; }
  void set_ssl(SSL* ssl) { ssl_ = ssl; }

  // Waits until the socket is ready for `events`, at most `timeout` and never past the deadline.
  bool wait(short events, std::chrono::milliseconds timeout) const {
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - steady::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, events, 0};
      const int r = ::poll(&p, 1, static_cast<int>(std::min(left, timeout).count()) + 1);
      if (r > 0) return true;
      if (r == 0) return false;
      if (errno != EINTR) return false;
    }
  }

  bool is_readable() const override {
    if (ssl_ && SSL_pending(ssl_) > 0) return true;
    return wait(POLLIN, read_timeout_);
  }
  bool is_writable() const override { return wait(POLLOUT, write_timeout_); }

  ssize_t read(char* ptr, std::size_t size) override {
    size = std::min<std::size_t>(size, 1 << 20);
    for (;;) {
      if (ssl_) {
        const int n = SSL_read(ssl_, ptr, static_cast<int>(size));
        if (n > 0) return n;
        const int e = SSL_get_error(ssl_, n);
        if (e == SSL_ERROR_ZERO_RETURN) return 0;
        if (e == SSL_ERROR_WANT_READ && wait(POLLIN, read_timeout_)) continue;
        if (e == SSL_ERROR_WANT_WRITE && wait(POLLOUT, write_timeout_)) continue;
        return -1;
      }
      const ssize_t n = ::recv(fd_, ptr, size, 0);
      if (n >= 0) return n;
      if (errno == EINTR) continue;
      if ((errno == EAGAIN || errno == EWOULDBLOCK) && wait(POLLIN, read_timeout_)) continue;
      return -1;
    }
  }

  ssize_t write(const char* ptr, std::size_t size) override {
    size = std::min<std::size_t>(size, 1 << 20);
    for (;;) {
      if (ssl_) {
        const int n = SSL_write(ssl_, ptr, static_cast<int>(size));
        if (n > 0) return n;
        const int e = SSL_get_error(ssl_, n);
        if (e == SSL_ERROR_WANT_WRITE && wait(POLLOUT, write_timeout_)) continue;
        if (e == SSL_ERROR_WANT_READ && wait(POLLIN, read_timeout_)) continue;
        return -1;
      }
      const ssize_t n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
      if (n >= 0) return n;
      if (errno == EINTR) continue;
      if ((errno == EAGAIN || errno == EWOULDBLOCK) && wait(POLLOUT, write_timeout_)) continue;
      return -1;
    }
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    address(::getpeername, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    address(::getsockname, ip, port);
  }
  socket_t socket() const override { return fd_; }

 private:
  void address(int (*get)(int, sockaddr*, socklen_t*), std::string& ip, int& port) const {
    sockaddr_storage a{};
    socklen_t length = sizeof a;
    ip.clear();
    port = -1;
    if (get(fd_, reinterpret_cast<sockaddr*>(&a), &length) != 0) return;
    char text[INET6_ADDRSTRLEN] = {};
    if (a.ss_family == AF_INET) {
      const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
      ::inet_ntop(AF_INET, &v4->sin_addr, text, sizeof text);
      port = ntohs(v4->sin_port);
    } else if (a.ss_family == AF_INET6) {
      const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
      ::inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof text);
      port = ntohs(v6->sin6_port);
    }
    ip = text;
  }

  int fd_;
  SSL* ssl_;
  std::chrono::milliseconds read_timeout_;
  std::chrono::milliseconds write_timeout_;
  steady::time_point deadline_ = steady::now();
};

std::string openssl_errors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char text[256];
    ERR_error_string_n(e, text, sizeof text);
    out += out.empty() ? "" : "; ";
    out += text;
  }
  return out.empty() ? "no OpenSSL error recorded" : out;
}

struct ssl_ctx_deleter {
  void operator()(SSL_CTX* ctx) const noexcept { SSL_CTX_free(ctx); }
};
using ssl_ctx_ptr = std::unique_ptr<SSL_CTX, ssl_ctx_deleter>;

ssl_ctx_ptr make_tls_context(const std::filesystem::path& certificate,
                             const std::filesystem::path& key) {
  constexpr const char* call = "update_endpoint::start (TLS)";
  ERR_clear_error();
  ssl_ctx_ptr ctx(SSL_CTX_new(TLS_server_method()));
  if (!ctx) detail::throw_errc(errc::io, call, "SSL_CTX_new: " + openssl_errors());
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  SSL_CTX_set_mode(ctx.get(), SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), certificate.c_str()) != 1)
    detail::throw_errc(errc::io, call,
                       "certificate '" + certificate.string() + "': " + openssl_errors());
  if (SSL_CTX_use_PrivateKey_file(ctx.get(), key.c_str(), SSL_FILETYPE_PEM) != 1)
    detail::throw_errc(errc::io, call, "private key '" + key.string() + "': " + openssl_errors());
  if (SSL_CTX_check_private_key(ctx.get()) != 1)
    detail::throw_errc(errc::io, call,
                       "private key '" + key.string() + "' does not match certificate '" +
                           certificate.string() + "'");
  return ctx;
}

// The answer to a connection refused for lack of workers, written without reading anything.
const std::string& busy_response() {
  static const std::string response = [] {
    const std::string body =
        "{\"error\":\"busy\",\"detail\":\"all workers busy and the wait queue is full\"}\n";
    return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
           "Connection: close\r\nRetry-After: 1\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body;
  }();
  return response;
}

// httplib::Server with our connection handling: overriding process_and_close_socket (private
// virtual, which C++ allows) replaces httplib's keep-alive loop and socket stream; requests are
// still parsed, routed and answered by httplib (process_request).
class guarded_server final : public httplib::Server {
 public:
  guarded_server(const update_endpoint_options& options, SSL_CTX* tls)
      : options_(options), tls_(tls) {}

  // httplib listens with a backlog of 5; a busy service needs more (Linux takes a second listen).
  bool set_backlog(int backlog) { return ::listen(svr_sock_, backlog) == 0; }

 private:
  bool process_and_close_socket(socket_t sock) override {
    if (refuse_this_connection) {
      // On the accepting thread: never block. A client that sends first may see a reset instead.
      ::send(sock, busy_response().data(), busy_response().size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      ::shutdown(sock, SHUT_RDWR);
      ::close(sock);
      return false;
    }
    ::fcntl(sock, F_SETFL, ::fcntl(sock, F_GETFL) | O_NONBLOCK);
    const int one = 1;
    ::setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);

    SSL* ssl = nullptr;
    connection_stream stream(sock, nullptr, options_.read_timeout, options_.write_timeout);
    stream.set_deadline(steady::now() + options_.request_timeout);
    bool ok = true;
    if (tls_) {  // the handshake counts against the first request's deadline
      ssl = SSL_new(tls_);
      ok = ssl && SSL_set_fd(ssl, sock) == 1 && handshake(ssl, stream);
      if (ok) stream.set_ssl(ssl);
    }
    connection_state state;
    current_connection = &state;
    for (std::size_t served = 0; ok && served < options_.keep_alive_max_requests; ++served) {
      if (served > 0) {  // an idle keep-alive connection holds its worker this long at most
        stream.set_deadline(steady::now() + options_.keep_alive_timeout);
        if (!stream.is_readable()) break;
        stream.set_deadline(steady::now() + options_.request_timeout);
      }
      bool closed = false;
      const bool last = served + 1 == options_.keep_alive_max_requests;
      ok = process_request(stream, last, closed, nullptr) && !closed &&
           !state.close_after_response;
    }
    current_connection = nullptr;
    if (ssl) {
      SSL_shutdown(ssl);  // one non-blocking attempt at close_notify
      SSL_free(ssl);
    }
    linger_and_close(sock);
    return true;
  }

  bool handshake(SSL* ssl, const connection_stream& stream) const {
    for (;;) {
      ERR_clear_error();
      const int r = SSL_accept(ssl);
      if (r == 1) return true;
      const int e = SSL_get_error(ssl, r);
      if (e == SSL_ERROR_WANT_READ && stream.wait(POLLIN, options_.read_timeout)) continue;
      if (e == SSL_ERROR_WANT_WRITE && stream.wait(POLLOUT, options_.write_timeout)) continue;
      return false;
    }
  }

  // Closing with unread request bytes makes the kernel send a reset, which can destroy the
  // answer before the client read it (e.g. a 400 for a bad name, sent before the body was read).
  // So: half-close, then read and drop what the client still sends, briefly and boundedly.
  static void linger_and_close(int sock) {
    ::shutdown(sock, SHUT_WR);
    const auto until = steady::now() + std::chrono::milliseconds(500);
    std::size_t drained = 0;
    char buffer[16384];
    while (drained < (std::size_t{64} << 20)) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(until - steady::now());
      if (left.count() <= 0) break;
      pollfd p{sock, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      const ssize_t n = ::recv(sock, buffer, sizeof buffer, 0);
      if (n <= 0) break;
      drained += static_cast<std::size_t>(n);
    }
    ::close(sock);
  }

  update_endpoint_options options_;
  SSL_CTX* tls_;
};

// --- answers ----------------------------------------------------------------------------------

struct refusal {
  int status;
  std::string error;
  std::string detail;
  json extra = json::object();
};

int status_of(bundle_reason reason) {
  switch (reason) {
    case bundle_reason::too_large:
      return 413;
    case bundle_reason::unsigned_bundle:
      return 401;
    case bundle_reason::unknown_key:
    case bundle_reason::bad_signature:
    case bundle_reason::payload_mismatch:
      return 403;
    case bundle_reason::payload_kind_mismatch:
    case bundle_reason::target_mismatch:
      return 422;
    case bundle_reason::bad_magic:
    case bundle_reason::unsupported_version:
    case bundle_reason::malformed:
    case bundle_reason::malformed_manifest:
    case bundle_reason::invalid_manifest:
    case bundle_reason::bad_key:
      return 400;
  }
  return 400;
}

refusal refusal_of(const bundle_error& e) {
  return {status_of(e.reason()), std::string(to_string(e.reason())), e.involved()};
}

void answer(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace) + "\n",
                  "application/json");
}

void answer(httplib::Response& res, const refusal& r) {
  json body = r.extra;
  body["error"] = r.error;
  body["detail"] = r.detail;
  answer(res, r.status, body);
}

std::string gpu_name(int sm) {
  return sm > 0 ? "sm_" + std::to_string(sm) : "";
}

// The module name of a /v1/modules/... path (already percent-decoded by httplib); `rollback`
// tells whether it ended in /rollback.
struct module_path {
  std::string name;
  bool rollback = false;
};
std::optional<module_path> parse_module_path(const std::string& method, std::string_view path) {
  if (!path.starts_with(modules_prefix)) return std::nullopt;
  module_path out;
  path.remove_prefix(modules_prefix.size());
  if (method == "POST" && path.ends_with(rollback_suffix)) {
    path.remove_suffix(rollback_suffix.size());
    out.rollback = true;
  }
  out.name = std::string(path);
  return out;
}

}  // namespace

// --- the endpoint -----------------------------------------------------------------------------

struct update_endpoint::impl {
  impl(module_sink& s, update_endpoint_options o) : sink(s), options(std::move(o)) {}

  // Per-module bookkeeping of the endpoint: the replay check's memory and the last refusal.
  // Created only for modules the sink knows or that got a verified bundle, so unauthenticated
  // requests cannot grow it.
  struct module_entry {
    std::mutex apply;  // serialises apply/rollback of this module: a version is applied once
    std::atomic<std::uint64_t> highest{0};  // highest version ever applied here
    std::mutex text;
    std::string last_refusal;
  };

  module_sink& sink;
  update_endpoint_options options;
  ssl_ctx_ptr tls;
  std::unique_ptr<guarded_server> server;
  std::thread listener;
  std::atomic<bool> is_running{false};
  std::atomic<bool> listener_exited{false};
  std::atomic<std::uint16_t> bound_port{0};

  std::atomic<std::uint64_t> applied{0}, refused{0}, rolled_back{0}, connections_refused{0};

  std::mutex entries_mutex;
  std::map<std::string, std::unique_ptr<module_entry>, std::less<>> entries;

  std::mutex nonces_mutex;
  std::unordered_map<std::string, std::chrono::sys_seconds> nonces;  // nonce -> request time
  static constexpr std::size_t max_nonces = 100000;

  module_entry& entry(const std::string& name) {
    std::lock_guard lock(entries_mutex);
    auto& slot = entries[name];
    if (!slot) slot = std::make_unique<module_entry>();
    return *slot;
  }
  module_entry* find_entry(std::string_view name) {
    std::lock_guard lock(entries_mutex);
    const auto it = entries.find(name);
    return it == entries.end() ? nullptr : it->second.get();
  }

  void refuse(httplib::Response& res, const refusal& r, module_entry* e = nullptr) {
    ++refused;
    if (e) {
      std::lock_guard lock(e->text);
      e->last_refusal = std::to_string(r.status) + " " + r.error + ": " + r.detail;
    }
    answer(res, r);
  }

  // Refuses what may not name a module before anything else looks at the request.
  httplib::Server::HandlerResponse pre_route(const httplib::Request& req, httplib::Response& res) {
    const auto path = parse_module_path(req.method, req.path);
    if (!path) return httplib::Server::HandlerResponse::Unhandled;
    if (auto problem = check_module_name(path->name); !problem.empty()) {
      close_after_response();  // the body is not read
      refuse(res, {400, "bad_name", "module name refused: " + problem});
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  }

  // Whether `bundle`'s payload runs on the sink's device.
  std::optional<refusal> check_device(const verified_bundle& bundle) const {
    const int sm = sink.device_sm();
    if (sm <= 0) return std::nullopt;
    const auto& m = bundle.manifest;
    bool runs = false;
    if (m.kind == payload_kind::cuda_source) {
      runs = m.target_sm == sm;  // compiled here for exactly this device
    } else {
      try {
        runs = can_run_on(inspect_image(bundle.payload), sm / 10, sm % 10);
      } catch (const std::exception&) {
        runs = false;
      }
    }
    if (runs) return std::nullopt;
    return refusal{422, "wrong_device",
                   "module '" + m.name + "' v" + std::to_string(m.version) + " targets " +
                       m.target + ", this service's GPU is " + gpu_name(sm),
                   {{"gpu", gpu_name(sm)}}};
  }

  void put_module(const httplib::Request& req, httplib::Response& res) {
    const auto path = parse_module_path(req.method, req.path);
    const std::string& name = path->name;
    if (req.body.size() > options.max_body_bytes)
      return refuse(res, {413, "too_large",
                          std::to_string(req.body.size()) + " bytes, limit " +
                              std::to_string(options.max_body_bytes)});
    verified_bundle bundle;
    try {
      bundle = verify_bundle(std::as_bytes(std::span(req.body.data(), req.body.size())),
                             options.keys, {.max_bundle_bytes = options.max_body_bytes});
    } catch (const bundle_error& e) {
      return refuse(res, refusal_of(e), find_entry(name));
    } catch (const std::exception& e) {
      return refuse(res, {400, "bad_request", e.what()}, find_entry(name));
    }
    const auto& m = bundle.manifest;
    if (m.name != name)
      return refuse(res, {400, "name_mismatch",
                          "URL names module '" + name + "', the signed manifest '" + m.name + "'"},
                    find_entry(name));
    auto& e = entry(name);  // the bundle is signed by a trusted key: worth remembering
    if (auto r = check_device(bundle)) return refuse(res, *r, &e);

    std::lock_guard serial(e.apply);
    const std::uint64_t current = sink.current_version(name);
    const std::uint64_t seen = std::max(current, e.highest.load());
    if (m.version <= seen)
      return refuse(res,
                    {409, m.version == seen ? "replayed_version" : "older_version",
                     "module '" + name + "' v" + std::to_string(m.version) +
                         " is not above v" + std::to_string(seen) +
                         (seen == current ? " (serving)" : " (applied before)"),
                     {{"current_version", current}, {"highest_version", seen}}},
                    &e);
    sink_result result;
    try {
      result = sink.apply(bundle);
    } catch (const std::exception& x) {
      result = {sink_outcome::failed, current, std::string("sink threw: ") + x.what()};
    } catch (...) {
      result = {sink_outcome::failed, current, "sink threw a non-standard exception"};
    }
    switch (result.outcome) {
      case sink_outcome::done:
        e.highest = m.version;
        ++applied;
        return answer(res, 200,
                      {{"promoted", true},
                       {"module", name},
                       {"version", m.version},
                       {"previous_version", current},
                       {"kind", std::string(to_string(m.kind))},
                       {"target", m.target}});
      case sink_outcome::unknown_module:
        return refuse(res, {404, "unknown_module", result.detail}, &e);
      case sink_outcome::rejected:
        return refuse(res, {422, "stage_refused", result.detail}, &e);
      case sink_outcome::no_previous_version:
      case sink_outcome::failed:
        break;
    }
    refuse(res, {500, "apply_failed", result.detail}, &e);
  }

  void rollback_module(const httplib::Request& req, httplib::Response& res) {
    const auto path = parse_module_path(req.method, req.path);
    const std::string& name = path->name;
    rollback_request request;
    try {
      request = verify_rollback_request(req.body, options.keys);
    } catch (const bundle_error& e) {
      return refuse(res, refusal_of(e), find_entry(name));
    } catch (const std::exception& e) {
      return refuse(res, {400, "bad_request", e.what()}, find_entry(name));
    }
    if (request.module != name)
      return refuse(res, {400, "name_mismatch",
                          "URL names module '" + name + "', the signed request '" +
                              request.module + "'"},
                    find_entry(name));
    const auto now = std::chrono::floor<std::chrono::seconds>(std::chrono::system_clock::now());
    const auto skew = request.created > now ? request.created - now : now - request.created;
    if (skew > options.rollback_window)
      return refuse(res, {403, "expired_request",
                          "request created " + detail::format_time(request.created) +
                              ", endpoint time " + detail::format_time(now) + ", window " +
                              std::to_string(options.rollback_window.count()) + " s"},
                    find_entry(name));
    {
      // A nonce is remembered while its request could still be fresh; older ones are dropped.
      std::lock_guard lock(nonces_mutex);
      std::erase_if(nonces, [&](const auto& n) {
        return n.second + 2 * options.rollback_window < now;
      });
      if (nonces.contains(request.nonce))
        return refuse(res, {409, "replayed_request", "nonce " + request.nonce + " was used before"},
                      find_entry(name));
      if (nonces.size() >= max_nonces)
        return refuse(res, {503, "busy", "too many rollback requests in the window"});
      nonces.emplace(request.nonce, request.created);
    }
    const std::uint64_t known = sink.current_version(name);
    module_entry* e = find_entry(name);
    if (!e && known == 0)
      return refuse(res, {404, "unknown_module", "no module '" + name + "'"});
    if (!e) e = &entry(name);
    std::lock_guard serial(e->apply);
    const std::uint64_t current = sink.current_version(name);
    if (request.from_version != current)
      return refuse(res, {409, "version_mismatch",
                          "request rolls back from v" + std::to_string(request.from_version) +
                              ", v" + std::to_string(current) + " serves",
                          {{"current_version", current}}},
                    e);
    sink_result result;
    try {
      result = sink.rollback(name);
    } catch (const std::exception& x) {
      result = {sink_outcome::failed, current, std::string("sink threw: ") + x.what()};
    }
    switch (result.outcome) {
      case sink_outcome::done:
        ++rolled_back;
        return answer(res, 200,
                      {{"rolled_back", true},
                       {"module", name},
                       {"version", result.version},
                       {"from_version", current}});
      case sink_outcome::unknown_module:
        return refuse(res, {404, "unknown_module", result.detail}, e);
      case sink_outcome::no_previous_version:
        return refuse(res, {409, "no_previous_version", result.detail}, e);
      case sink_outcome::rejected:
        return refuse(res, {422, "stage_refused", result.detail}, e);
      case sink_outcome::failed:
        break;
    }
    refuse(res, {500, "apply_failed", result.detail}, e);
  }

  void list_modules(httplib::Response& res) {
    std::vector<module_report> reports;
    try {
      reports = sink.status();
    } catch (const std::exception& x) {
      return answer(res, {500, "status_failed", x.what()});
    }
    json modules = json::array();
    for (const auto& r : reports) {
      json m{{"name", r.name},
             {"current_version", r.current_version},
             {"versions_held", r.versions_held},
             {"in_flight", r.in_flight},
             {"last_error", r.last_error.empty() ? json(nullptr) : json(r.last_error)}};
      if (auto* e = find_entry(r.name)) {
        m["highest_version"] = std::max(e->highest.load(), r.current_version);
        std::lock_guard lock(e->text);
        m["last_refusal"] = e->last_refusal.empty() ? json(nullptr) : json(e->last_refusal);
      } else {
        m["highest_version"] = r.current_version;
        m["last_refusal"] = nullptr;
      }
      modules.push_back(std::move(m));
    }
    const int sm = sink.device_sm();
    answer(res, 200,
           {{"gpu", sm > 0 ? json(gpu_name(sm)) : json(nullptr)},
            {"modules", std::move(modules)},
            {"endpoint",
             {{"applied", applied.load()},
              {"refused", refused.load()},
              {"rolled_back", rolled_back.load()},
              {"connections_refused", connections_refused.load()}}}});
  }

  void configure(guarded_server& s) {
    s.new_task_queue = [this] {
      return new bounded_pool(options.threads, options.max_queued_connections,
                              connections_refused);
    };
    // httplib's default sets SO_REUSEPORT, which would let another process bind the same port
    // and take part of the connections; SO_REUSEADDR alone only allows a quick restart.
    s.set_socket_options([](socket_t sock) {
      const int yes = 1;
      ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    });
    s.set_payload_max_length(options.max_body_bytes);
    s.set_read_timeout(options.read_timeout);
    s.set_write_timeout(options.write_timeout);
    s.set_pre_routing_handler(
        [this](const httplib::Request& req, httplib::Response& res) { return pre_route(req, res); });
    s.Get("/v1/modules", [this](const httplib::Request&, httplib::Response& res) {
      list_modules(res);
    });
    s.Put("/v1/modules/(.+)", [this](const httplib::Request& req, httplib::Response& res) {
      put_module(req, res);
    });
    s.Post("/v1/modules/(.+)/rollback", [this](const httplib::Request& req,
                                               httplib::Response& res) {
      rollback_module(req, res);
    });
    // Answers httplib produces itself (404, 413 over the payload limit, 400 unparsable) get a
    // JSON body like ours; answers that have one keep it.
    s.set_error_handler(httplib::Server::HandlerWithResponse(
        [this](const httplib::Request&, httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      std::string error = "bad_request";
      if (res.status == 404) error = "not_found";
      if (res.status == 413) error = "too_large";
      if (res.status == 414) error = "uri_too_long";
      if (res.status == 413) close_after_response();
      answer(res, {res.status, error, "HTTP " + std::to_string(res.status) + " for this request"});
      if (res.status != 404) ++refused;
      return httplib::Server::HandlerResponse::Handled;
    }));
    s.set_exception_handler(
        [this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
          std::string what = "unknown exception";
          try {
            if (ep) std::rethrow_exception(ep);
          } catch (const std::exception& x) {
            what = x.what();
          } catch (...) {
          }
          ++refused;
          answer(res, {500, "internal_error", what});
        });
  }
};

update_endpoint::update_endpoint(module_sink& sink, update_endpoint_options options)
    : impl_(std::make_unique<impl>(sink, std::move(options))) {}

update_endpoint::~update_endpoint() {
  stop();
}

void update_endpoint::start() {
  auto& d = *impl_;
  CUBRIDGE_EXPECTS(!d.is_running, "update endpoint already running");
  CUBRIDGE_EXPECTS(d.options.threads > 0, "update_endpoint_options::threads is 0");
  CUBRIDGE_EXPECTS(d.options.keep_alive_max_requests > 0,
                   "update_endpoint_options::keep_alive_max_requests is 0");
  CUBRIDGE_EXPECTS(d.options.request_timeout.count() > 0 && d.options.read_timeout.count() > 0 &&
                       d.options.write_timeout.count() > 0,
                   "update_endpoint_options timeouts must be positive");
  const bool want_tls = !d.options.tls_certificate.empty() || !d.options.tls_private_key.empty();
  if (want_tls) {
    CUBRIDGE_EXPECTS(!d.options.tls_certificate.empty() && !d.options.tls_private_key.empty(),
                     "TLS needs both tls_certificate and tls_private_key");
    d.tls = make_tls_context(d.options.tls_certificate, d.options.tls_private_key);
  }
  d.server = std::make_unique<guarded_server>(d.options, d.tls.get());
  d.configure(*d.server);
  const std::string where = d.options.bind_address + ":" + std::to_string(d.options.port);
  int port = d.options.port;
  if (port == 0) {
    port = d.server->bind_to_any_port(d.options.bind_address);
    if (port <= 0) port = 0;
  } else if (!d.server->bind_to_port(d.options.bind_address, port)) {
    port = 0;
  }
  if (port == 0) {
    d.server.reset();
    detail::throw_errc(errc::io, "update_endpoint::start",
                       "cannot bind " + where + " (address in use, not local, or not permitted)");
  }
  d.server->set_backlog(d.options.listen_backlog);
  d.bound_port = static_cast<std::uint16_t>(port);
  d.is_running = true;
  d.listener_exited = false;
  d.listener = std::thread([&d] {
    d.server->listen_after_bind();
    d.listener_exited = true;
  });
  // httplib's stop() does nothing before its loop has begun; wait for it so that stop() works.
  while (!d.server->is_running() && !d.listener_exited)
    std::this_thread::sleep_for(std::chrono::microseconds(100));
}

void update_endpoint::stop() noexcept {
  auto& d = *impl_;
  if (!d.server) return;
  d.server->stop();
  if (d.listener.joinable()) d.listener.join();
  d.server.reset();
  d.tls.reset();
  d.is_running = false;
  d.bound_port = 0;
}

bool update_endpoint::running() const noexcept {
  return impl_->is_running;
}

std::uint16_t update_endpoint::port() const noexcept {
  return impl_->bound_port;
}

std::string update_endpoint::url() const {
  if (!impl_->is_running) return {};
  std::string host = impl_->options.bind_address;
  if (host == "0.0.0.0") host = "127.0.0.1";
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  return (impl_->tls ? "https://" : "http://") + host + ":" + std::to_string(port());
}

update_endpoint_stats update_endpoint::stats() const noexcept {
  return {impl_->applied, impl_->refused, impl_->rolled_back, impl_->connections_refused};
}

}  // namespace cubridge
