// The update endpoint: cpp-httplib for HTTP parsing and routing, with connection handling of our
// own (one reception thread that reads whole requests under strict framing, bounded workers that
// handle complete ones, TLS through OpenSSL); see update_endpoint.hpp.
#include <cubridge/core/image.hpp>
#include <cubridge/update/detail/signing.hpp>
#include <cubridge/update/rollback_request.hpp>
#include <cubridge/update/update_endpoint.hpp>
#include <cubridge/update/update_state.hpp>

#include <httplib.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

namespace cubridge {
namespace {

using json = nlohmann::json;
using steady = std::chrono::steady_clock;
constexpr std::string_view modules_prefix = "/v1/modules/";
constexpr std::string_view rollback_suffix = "/rollback";

// --- connections ------------------------------------------------------------------------------
//
// One reception thread accepts every connection and reads each request into that connection's
// buffer (TLS handshake, request line, headers, body), deciding the framing from the headers
// before it takes a body byte; only complete requests go to the workers, where httplib parses,
// routes and answers them over a stream that reads the buffered request and writes to the
// socket. Then the connection, with any pipelined bytes, goes back to the reception thread. So a
// slow client costs a connection slot and a bounded buffer, never a worker.

using milliseconds = std::chrono::milliseconds;

// Per-request state a handler can reach: a request is handled on one worker thread.
struct connection_state {
  bool close_after_response = false;
};
thread_local connection_state* current_connection = nullptr;

void close_after_response() {
  if (current_connection) current_connection->close_after_response = true;
}

// OpenSSL writes to sockets with write(); a client that went away must give EPIPE on the thread
// that wrote, not a SIGPIPE that ends the service.
void block_sigpipe() {
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
}

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
  // No renegotiation: the reception thread's non-blocking reads and writes never have to wait
  // for the other direction mid-request.
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_RENEGOTIATION);
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

// A refusal the reception thread writes itself, before httplib sees the request: JSON like
// every other refusal, and the connection closes after it.
struct transport_refusal {
  int status;
  std::string error;
  std::string detail;
};

std::string_view reason_phrase(int status) {
  switch (status) {
    case 400:
      return "Bad Request";
    case 408:
      return "Request Timeout";
    case 411:
      return "Length Required";
    case 413:
      return "Payload Too Large";
    case 415:
      return "Unsupported Media Type";
    case 431:
      return "Request Header Fields Too Large";
    case 503:
      return "Service Unavailable";
  }
  return "Error";
}

std::string refusal_text(const transport_refusal& r) {
  const std::string body = json{{"error", r.error}, {"detail", r.detail}}.dump(
                               -1, ' ', false, json::error_handler_t::replace) +
                           "\n";
  std::string out = "HTTP/1.1 " + std::to_string(r.status) + " " +
                    std::string(reason_phrase(r.status)) +
                    "\r\nContent-Type: application/json\r\nConnection: close\r\n";
  if (r.status == 503) out += "Retry-After: 1\r\n";
  return out + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

constexpr std::string_view continue_line = "HTTP/1.1 100 Continue\r\n\r\n";

// --- framing: what a request may carry, decided from its head alone ---------------------------

struct request_framing {
  std::size_t head_size = 0;  // request line and headers, through the empty line
  std::size_t body_size = 0;  // the Content-Length; 0 without one
  bool expect_continue = false;
};

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

bool istarts_with(std::string_view text, std::string_view prefix) {
  return text.size() >= prefix.size() && iequals(text.substr(0, prefix.size()), prefix);
}

// RFC 9110 token characters: what a method or a header name is made of.
bool is_token_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

std::string_view trim_whitespace(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// A piece of the request for a refusal's detail: bounded (JSON escapes the rest).
std::string excerpt(std::string_view text) {
  return text.size() <= 64 ? std::string(text) : std::string(text.substr(0, 64)) + "...";
}

// The largest body of a request to `path` (percent-decoded, as httplib routes it): what the
// route reads, 0 for the routes that take none.
std::size_t body_limit(std::string_view method, std::string_view path, std::size_t max_body) {
  if (!path.starts_with(modules_prefix)) return 0;
  if (method == "PUT") return max_body;
  if (method == "POST" && path.ends_with(rollback_suffix)) return max_rollback_request_bytes;
  return 0;
}

// Checks a complete head strictly, so that httplib, which parses it again, sees the same
// request, and decides the framing: a Content-Length within the route's limit or no body; no
// Transfer-Encoding (chunked bodies cannot be bounded up front), no Content-Encoding (httplib
// would inflate a small body into a huge one), no multipart (httplib would parse a form).
// httplib percent-decodes header values, so the values it acts on are checked decoded.
std::variant<request_framing, transport_refusal> decide_framing(
    std::string_view head, const update_endpoint_options& options) {
  const auto bad = [](std::string detail) {
    return transport_refusal{400, "bad_request", std::move(detail)};
  };
  for (std::size_t i = 0; i < head.size(); ++i) {
    if (head[i] == '\0') return bad("NUL byte in the request head");
    if (head[i] == '\n' && (i == 0 || head[i - 1] != '\r'))
      return bad("a line of the request head ends in LF without CR");
    if (head[i] == '\r' && (i + 1 == head.size() || head[i + 1] != '\n'))
      return bad("CR without LF in the request head");
  }
  std::vector<std::string_view> lines;
  for (std::size_t at = 0; at < head.size();) {
    const auto end = head.find("\r\n", at);
    lines.push_back(head.substr(at, end - at));
    at = end + 2;
  }
  lines.pop_back();  // the empty line that ends the head
  if (lines.size() - 1 > options.max_header_count)
    return transport_refusal{431, "headers_too_large",
                             std::to_string(lines.size() - 1) + " header lines, limit " +
                                 std::to_string(options.max_header_count)};

  // Request line: METHOD SP /path[?query] SP HTTP/1.x, nothing else.
  const std::string_view line = lines.front();
  const auto first = line.find(' ');
  const auto second = first == std::string_view::npos ? first : line.find(' ', first + 1);
  if (second == std::string_view::npos || line.find(' ', second + 1) != std::string_view::npos)
    return bad("malformed request line '" + excerpt(line) + "'");
  const auto method = line.substr(0, first);
  const auto target = line.substr(first + 1, second - first - 1);
  const auto version = line.substr(second + 1);
  if (method.empty() || !std::all_of(method.begin(), method.end(), is_token_char) ||
      (version != "HTTP/1.1" && version != "HTTP/1.0"))
    return bad("malformed request line '" + excerpt(line) + "'");
  if (!target.starts_with('/') || !std::all_of(target.begin(), target.end(), [](char c) {
        const auto u = static_cast<unsigned char>(c);
        return u > 0x20 && u < 0x7f;
      }))
    return bad("request target '" + excerpt(target) + "' is not a path");
  const std::string path =
      httplib::detail::decode_url(std::string(target.substr(0, target.find_first_of("?#"))), false);

  std::size_t lengths = 0;
  std::string_view length;
  bool transfer_encoding = false;
  std::vector<std::string> encodings, types;
  std::string expect;
  for (std::size_t i = 1; i < lines.size(); ++i) {
    const auto colon = lines[i].find(':');
    const auto name = lines[i].substr(0, colon);
    if (colon == std::string_view::npos || name.empty() ||
        !std::all_of(name.begin(), name.end(), is_token_char))
      return bad("malformed header line '" + excerpt(lines[i]) + "'");
    const auto value = trim_whitespace(lines[i].substr(colon + 1));
    if (std::any_of(value.begin(), value.end(), [](char c) {
          const auto u = static_cast<unsigned char>(c);
          return (u < 0x20 && u != '\t') || u == 0x7f;
        }))
      return bad("control character in header '" + excerpt(name) + "'");
    const auto decoded = [&] { return httplib::detail::decode_url(std::string(value), false); };
    if (iequals(name, "Content-Length")) {
      ++lengths;
      length = value;
    } else if (iequals(name, "Transfer-Encoding")) {
      transfer_encoding = true;
    } else if (iequals(name, "Content-Encoding")) {
      encodings.push_back(decoded());
    } else if (iequals(name, "Content-Type")) {
      types.push_back(decoded());
    } else if (iequals(name, "Expect") && expect.empty()) {
      expect = decoded();
    }
  }

  if (transfer_encoding)
    return transport_refusal{411, "length_required",
                             "Transfer-Encoding is not accepted (no chunked bodies): send the "
                             "body with a Content-Length"};
  const std::size_t limit = body_limit(method, path, options.max_body_bytes);
  const std::string route = std::string(method) + " " + excerpt(path);
  request_framing framing;
  if (lengths == 0 && limit > 0)
    return transport_refusal{411, "length_required",
                             route + " takes a body: send it with a Content-Length"};
  if (lengths > 1) return bad(std::to_string(lengths) + " Content-Length headers");
  if (lengths == 1) {
    if (length.empty() ||
        !std::all_of(length.begin(), length.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return bad("Content-Length '" + excerpt(length) + "' is not a decimal number");
    // Up to 19 significant digits fit 64 bits; more is over any limit.
    const auto digits = length.substr(std::min(length.find_first_not_of('0'), length.size()));
    std::uint64_t size = 0;
    const bool over =
        digits.size() > 19 ||
        (std::from_chars(digits.data(), digits.data() + digits.size(), size), size > limit);
    if (over)
      return transport_refusal{413, "too_large",
                               "body of " + excerpt(length) + " bytes, limit " +
                                   std::to_string(limit) + " for " + route +
                                   (limit == 0 ? " (it takes no body)" : "")};
    framing.body_size = static_cast<std::size_t>(size);
  }
  for (const auto& e : encodings)
    if (!iequals(trim_whitespace(e), "identity"))
      return transport_refusal{
          415, "unsupported_encoding",
          "Content-Encoding '" + excerpt(e) + "' is not accepted: send the body as it is"};
  for (const auto& t : types)
    if (istarts_with(trim_whitespace(t), "multipart/"))
      return transport_refusal{415, "unsupported_media_type",
                               "Content-Type '" + excerpt(t) +
                                   "': multipart bodies are not accepted, send the bundle itself "
                                   "as the body (any other Content-Type)"};
  framing.head_size = head.size();
  framing.expect_continue =
      version == "HTTP/1.1" && iequals(trim_whitespace(expect), "100-continue");
  return framing;
}

// --- the reception thread and the workers -----------------------------------------------------

// httplib::Server for parsing, routing and answering one request (process_request, protected),
// and for binding the listening socket; its own accept loop never runs.
class guarded_server final : public httplib::Server {
 public:
  // httplib listens with a backlog of 5; a busy service needs more (Linux takes a second listen).
  bool set_backlog(int backlog) { return ::listen(svr_sock_, backlog) == 0; }
  // The bound socket, handed over to the reception thread.
  int release_listener() { return svr_sock_.exchange(INVALID_SOCKET); }
  bool serve(httplib::Stream& stream, bool close_connection, bool& connection_closed) {
    return process_request(stream, close_connection, connection_closed, nullptr);
  }
};

// One accepted connection. The reception thread owns it, except while a worker handles its
// request (phase with_worker); the hand-over goes through the job queue's mutex.
struct connection {
  enum class phase { handshake, receiving, with_worker, answering, draining, closed };

  connection(int socket, SSL* tls) : fd(socket), ssl(tls) {}
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;
  ~connection() {
    if (ssl) SSL_free(ssl);
    ::close(fd);
  }

  const int fd;
  SSL* const ssl;
  phase at = phase::receiving;
  std::string in;                          // received, not yet answered: the request, then more
  std::size_t scanned = 0;                 // bytes of `in` searched for the end of the head
  std::size_t lines = 0;                   // line ends among them
  std::optional<request_framing> framing;  // once the head is complete and accepted
  std::size_t reserved = 0;                // body bytes reserved in the buffer budget
  std::string out;                         // to write: 100 Continue, or a refusal
  std::size_t served = 0;                  // requests answered
  bool peer_closed = false;                // the client sent its end of stream
  bool tls_failed = false;                 // no close_notify after a TLS error
  bool want_write = false;                 // TLS must write before it can read on
  bool more = false;                       // stopped reading at the round's cap: go on at once
  bool keep = false;                       // set by the worker: serve the next request
  steady::time_point request_deadline;     // the whole request, from accept / previous answer
  steady::time_point silence_deadline;     // no byte for this long; in answering / draining:
                                           // the end of that phase
  std::size_t drained = 0;
};

// The stream httplib reads one request from and writes its answer to: reads are served from the
// buffered request and end with it, so httplib can never read past the framing decided from
// the headers; writes go to the socket (SSL_write with TLS), each wait bounded.
class request_stream final : public httplib::Stream {
 public:
  request_stream(const connection& c, std::string_view request, milliseconds write_timeout,
                 milliseconds answer_timeout)
      : fd_(c.fd),
        ssl_(c.ssl),
        request_(request),
        write_timeout_(write_timeout),
        answer_timeout_(answer_timeout) {}

  std::size_t consumed() const { return consumed_; }

  bool is_readable() const override { return consumed_ < request_.size(); }
  bool is_writable() const override { return wait(POLLOUT, write_timeout_); }

  ssize_t read(char* ptr, std::size_t size) override {
    size = std::min(size, request_.size() - consumed_);
    std::memcpy(ptr, request_.data() + consumed_, size);
    consumed_ += size;
    return static_cast<ssize_t>(size);
  }

  ssize_t write(const char* ptr, std::size_t size) override {
    // The reception thread answered Expect: 100-continue when the headers passed; httplib's own
    // would be a second one.
    if (!wrote_ && std::string_view(ptr, size) == continue_line) return static_cast<ssize_t>(size);
    wrote_ = true;
    size = std::min<std::size_t>(size, 1 << 20);
    for (;;) {
      if (ssl_) {
        ERR_clear_error();
        const int n = SSL_write(ssl_, ptr, static_cast<int>(size));
        if (n > 0) return n;
        const int e = SSL_get_error(ssl_, n);
        if (e == SSL_ERROR_WANT_WRITE && wait(POLLOUT, write_timeout_)) continue;
        if (e == SSL_ERROR_WANT_READ && wait(POLLIN, write_timeout_)) continue;
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
  // Waits until the socket is ready for `events`, at most `timeout`, and never past the answer's
  // deadline (answer_timeout from its first byte).
  bool wait(short events, milliseconds timeout) const {
    if (deadline_ == steady::time_point{}) deadline_ = steady::now() + answer_timeout_;
    for (;;) {
      const auto left = std::chrono::duration_cast<milliseconds>(deadline_ - steady::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, events, 0};
      const int r = ::poll(&p, 1, static_cast<int>(std::min(left, timeout).count()) + 1);
      if (r > 0) return (p.revents & (POLLERR | POLLNVAL)) == 0;
      if (r == 0 || errno != EINTR) return false;
    }
  }

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
  std::string_view request_;
  std::size_t consumed_ = 0;
  bool wrote_ = false;
  milliseconds write_timeout_;
  milliseconds answer_timeout_;
  mutable steady::time_point deadline_{};
};

// The endpoint's counters that the transport moves.
struct transport_counters {
  std::atomic<std::uint64_t>& refused;              // 4xx answered before httplib saw the request
  std::atomic<std::uint64_t>& connections_refused;  // 503 busy
  std::atomic<std::uint64_t>& open_connections;
};

// The reception thread, the workers, and every connection. Constructed running; the destructor
// stops it: closes every connection (a request being handled finishes; its socket is shut down
// if its answer is not out within stop_grace) and joins every thread.
class connection_service {
 public:
  connection_service(guarded_server& server, int listener, const update_endpoint_options& options,
                     SSL_CTX* tls, transport_counters counters)
      : server_(server), listener_(listener), options_(options), tls_(tls), counters_(counters) {
    try {
      wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
      if (wake_fd_ < 0)
        detail::throw_errc(errc::io, "update_endpoint::start",
                           std::string("eventfd: ") + std::strerror(errno));
      ::fcntl(listener_, F_SETFL, ::fcntl(listener_, F_GETFL) | O_NONBLOCK);
      for (std::size_t i = 0; i < options_.threads; ++i) workers_.emplace_back([this] { work(); });
      reception_ = std::thread([this] { receive_loop(); });
    } catch (...) {
      stop_workers();
      if (wake_fd_ >= 0) ::close(wake_fd_);
      ::close(listener_);
      throw;
    }
  }
  connection_service(const connection_service&) = delete;
  connection_service& operator=(const connection_service&) = delete;

  ~connection_service() {
    stopping_ = true;
    wake();
    reception_.join();
    stop_workers();
    ::close(wake_fd_);
  }

 private:
  using phase = connection::phase;
  static constexpr milliseconds drain_time{500};
  static constexpr std::size_t drain_limit = std::size_t{64} << 20;
  static constexpr std::size_t round_limit = std::size_t{1} << 20;  // per connection and poll
  static constexpr milliseconds stop_grace{300};

  void wake() {
    const std::uint64_t one = 1;
    [[maybe_unused]] const auto n = ::write(wake_fd_, &one, sizeof one);
  }

  void stop_workers() {
    {
      std::lock_guard lock(jobs_mutex_);
      workers_stopping_ = true;
    }
    jobs_ready_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
  }

  // --- workers ---

  void work() {
    block_sigpipe();
    for (;;) {
      connection* c = nullptr;
      {
        std::unique_lock lock(jobs_mutex_);
        jobs_ready_.wait(lock, [&] { return workers_stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        c = jobs_.front();
        jobs_.pop_front();
        ++busy_;
      }
      serve(*c);
      {
        std::lock_guard lock(jobs_mutex_);
        --busy_;
        returned_.push_back(c);
      }
      wake();
    }
  }

  // httplib parses, routes and answers the buffered request. The connection serves another only
  // if httplib consumed exactly this request (nothing it did not read can be taken for the next
  // one) and neither side asked to close.
  void serve(connection& c) {
    const std::size_t size = c.framing->head_size + c.framing->body_size;
    request_stream stream(c, std::string_view(c.in).substr(0, size), options_.write_timeout,
                          options_.request_timeout);
    connection_state state;
    current_connection = &state;
    const bool last =
        c.served + 1 >= options_.keep_alive_max_requests || c.peer_closed || stopping_;
    bool closed = false;
    bool ok = false;
    try {
      ok = server_.serve(stream, last, closed);
    } catch (...) {
      ok = false;  // e.g. out of memory; httplib answers routing exceptions itself
    }
    current_connection = nullptr;
    c.keep = ok && !last && !closed && !state.close_after_response && stream.consumed() == size;
    c.in = std::string(std::string_view(c.in).substr(size));  // frees a large body's buffer
    ++c.served;
  }

  // Hands a complete request to a worker: an idle one, or the queue of max_queued_connections.
  bool submit(connection& c) {
    {
      std::lock_guard lock(jobs_mutex_);
      if (jobs_.size() >= options_.threads - busy_ + options_.max_queued_connections) return false;
      c.at = phase::with_worker;
      jobs_.push_back(&c);
    }
    jobs_ready_.notify_one();
    return true;
  }

  // --- reception ---

  void receive_loop() {
    block_sigpipe();
    std::vector<pollfd> polled;
    std::vector<connection*> polled_connections;
    while (!stopping_) {
      const auto now = steady::now();
      const bool accepting = now >= accept_paused_until_;
      polled.assign({{wake_fd_, POLLIN, 0}, {accepting ? listener_ : -1, POLLIN, 0}});
      polled_connections.clear();
      auto next = accepting ? steady::time_point::max() : accept_paused_until_;
      bool at_once = false;
      for (auto& [id, c] : connections_) {
        if (c->at == phase::with_worker) continue;
        at_once = at_once || c->more;
        polled.push_back({c->fd, events_of(*c), 0});
        polled_connections.push_back(c.get());
        next = std::min(next, deadline_of(*c));
      }
      int timeout = -1;
      if (at_once) {
        timeout = 0;
      } else if (next != steady::time_point::max()) {
        const auto left = std::chrono::ceil<milliseconds>(next - now).count();
        timeout = static_cast<int>(std::clamp<long long>(left, 0, 3'600'000));
      }
      if (::poll(polled.data(), polled.size(), timeout) < 0 && errno != EINTR) {
        std::this_thread::sleep_for(milliseconds(1));  // not expected; never spin
        continue;
      }
      if (stopping_) break;
      if (polled[0].revents) {
        std::uint64_t count;
        [[maybe_unused]] const auto n = ::read(wake_fd_, &count, sizeof count);
      }
      take_returned();
      // Connections before new ones: a connection that closed frees its slot for the next.
      for (std::size_t i = 0; i < polled_connections.size(); ++i) {
        auto& c = *polled_connections[i];
        if ((polled[i + 2].revents || c.more) && c.at != phase::with_worker) progress(c);
      }
      expire(steady::now());
      reap();
      if (polled[1].revents) accept_all();
      counters_.open_connections = held_;
    }
    shut_down();
  }

  short events_of(const connection& c) const {
    switch (c.at) {
      case phase::handshake:
        return c.want_write ? POLLOUT : POLLIN;
      case phase::receiving: {
        const bool complete =
            c.framing && c.in.size() >= c.framing->head_size + c.framing->body_size;
        short events = complete ? 0 : POLLIN;
        if (!c.out.empty() || c.want_write) events |= POLLOUT;
        return events;
      }
      case phase::answering:
        return POLLOUT;
      case phase::draining:
        return POLLIN;
      default:
        return 0;
    }
  }

  static steady::time_point deadline_of(const connection& c) {
    if (c.at == phase::handshake || c.at == phase::receiving)
      return std::min(c.request_deadline, c.silence_deadline);
    return c.silence_deadline;
  }

  void accept_all() {
    for (int i = 0; i < 64; ++i) {
      const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
          accept_paused_until_ = steady::now() + milliseconds(100);  // try again then
        return;  // EAGAIN: nothing more to accept
      }
      if (held_ >= options_.max_connections) {
        // Never blocks. A client that sent its request already may see a reset instead.
        static const std::string busy =
            refusal_text({503, "busy", "the endpoint holds max_connections connections already"});
        ++counters_.connections_refused;  // counted before the client can see the answer
        ::send(fd, busy.data(), busy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        ::shutdown(fd, SHUT_RDWR);
        ::close(fd);
        continue;
      }
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      SSL* ssl = nullptr;
      if (tls_) {
        ssl = SSL_new(tls_);
        if (!ssl || SSL_set_fd(ssl, fd) != 1) {
          if (ssl) SSL_free(ssl);
          ::close(fd);
          continue;
        }
        SSL_set_accept_state(ssl);
      }
      auto c = std::make_unique<connection>(fd, ssl);
      const auto now = steady::now();
      c->at = ssl ? phase::handshake : phase::receiving;
      c->request_deadline = now + options_.request_timeout;  // the handshake counts
      c->silence_deadline = now + options_.read_timeout;
      ++held_;
      connections_.emplace(next_id_++, std::move(c));
    }
  }

  void progress(connection& c) {
    c.more = false;
    switch (c.at) {
      case phase::handshake:
        return handshake(c);
      case phase::receiving:
        return receive(c);
      case phase::answering:
        if (!flush(c)) return close_now(c);
        if (c.out.empty()) begin_drain(c);
        return;
      case phase::draining:
        return drain(c);
      default:
        return;
    }
  }

  void handshake(connection& c) {
    ERR_clear_error();
    const int r = SSL_accept(c.ssl);
    if (r == 1) {
      c.at = phase::receiving;
      c.want_write = false;
      return receive(c);
    }
    const int e = SSL_get_error(c.ssl, r);
    c.want_write = e == SSL_ERROR_WANT_WRITE;
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) return;
    c.tls_failed = true;  // e.g. plain HTTP to the TLS port: nothing to answer
    close_now(c);
  }

  enum class io { again, again_write, end, failed };
  struct io_result {
    std::size_t n = 0;
    io status = io::again;
  };

  static io_result receive_some(connection& c, char* p, std::size_t size) {
    for (;;) {
      if (c.ssl) {
        ERR_clear_error();
        const int n = SSL_read(c.ssl, p, static_cast<int>(std::min<std::size_t>(size, 1 << 30)));
        if (n > 0) return {static_cast<std::size_t>(n), io::again};
        const int e = SSL_get_error(c.ssl, n);
        if (e == SSL_ERROR_WANT_READ) return {0, io::again};
        if (e == SSL_ERROR_WANT_WRITE) return {0, io::again_write};
        if (e == SSL_ERROR_ZERO_RETURN) return {0, io::end};
        c.tls_failed = true;
        return {0, io::failed};
      }
      const ssize_t n = ::recv(c.fd, p, size, 0);
      if (n > 0) return {static_cast<std::size_t>(n), io::again};
      if (n == 0) return {0, io::end};
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return {0, io::again};
      return {0, io::failed};
    }
  }

  static io_result send_some(connection& c, const char* p, std::size_t size) {
    for (;;) {
      if (c.ssl) {
        ERR_clear_error();
        const int n = SSL_write(c.ssl, p, static_cast<int>(std::min<std::size_t>(size, 1 << 30)));
        if (n > 0) return {static_cast<std::size_t>(n), io::again};
        const int e = SSL_get_error(c.ssl, n);
        if (e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ) return {0, io::again};
        c.tls_failed = true;
        return {0, io::failed};
      }
      const ssize_t n = ::send(c.fd, p, size, MSG_NOSIGNAL);
      if (n >= 0) return {static_cast<std::size_t>(n), io::again};
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return {0, io::again};
      return {0, io::failed};
    }
  }

  // Writes what `out` holds as far as the socket takes it; false when the client is gone.
  static bool flush(connection& c) {
    while (!c.out.empty()) {
      const auto r = send_some(c, c.out.data(), c.out.size());
      if (r.status == io::failed) return false;
      if (r.n == 0) return true;  // the rest when the socket is writable
      c.out.erase(0, r.n);
    }
    return true;
  }

  // Reads the request as far as its framing allows: the head up to max_header_bytes, then the
  // body up to its Content-Length, never more; hands it to a worker when complete.
  void receive(connection& c) {
    if (!flush(c)) return close_now(c);
    if (!c.framing && c.scanned < c.in.size() && !scan_head(c)) return;
    std::size_t round = 0;
    for (;;) {
      const std::size_t goal =
          c.framing ? c.framing->head_size + c.framing->body_size : options_.max_header_bytes;
      if (c.in.size() >= goal || c.peer_closed) break;
      if (round >= round_limit) {
        c.more = true;  // let the other connections have their turn
        break;
      }
      const std::size_t old = c.in.size();
      c.in.resize(old + std::min({goal - old, round_limit - round, std::size_t{64} << 10}));
      const auto r = receive_some(c, c.in.data() + old, c.in.size() - old);
      c.in.resize(old + r.n);
      if (r.n > 0) {
        round += r.n;
        c.silence_deadline = steady::now() + options_.read_timeout;
        if (!c.framing && !scan_head(c)) return;
        continue;
      }
      c.want_write = r.status == io::again_write;
      if (r.status == io::end) c.peer_closed = true;
      if (r.status == io::failed) return close_now(c);
      break;
    }
    if (!c.framing) {
      if (c.in.size() >= options_.max_header_bytes)
        return refuse(c, {431, "headers_too_large",
                          "request line and headers over " +
                              std::to_string(options_.max_header_bytes) + " bytes"});
      if (c.peer_closed) close_now(c);  // an unfinished request: nothing to answer
      return;
    }
    if (c.in.size() < c.framing->head_size + c.framing->body_size) {
      if (c.peer_closed) close_now(c);
      return;
    }
    if (!c.out.empty()) return;  // the 100 Continue first
    if (!submit(c))
      refuse(c,
             {503, "busy", "all workers busy and the wait queue (max_queued_connections) is full"});
  }

  // Looks for the end of the head in what arrived; once there, decides the framing, reserves
  // the body's room and answers Expect: 100-continue. False when the request was refused.
  bool scan_head(connection& c) {
    // httplib ends the head at the first empty line: "\n\r\n" (a bare LF is refused below).
    const std::size_t from = c.scanned >= 2 ? c.scanned - 2 : 0;
    const auto end = c.in.find("\n\r\n", from);
    const std::size_t upto = end == std::string::npos ? c.in.size() : end + 1;
    c.lines += static_cast<std::size_t>(
        std::count(c.in.begin() + static_cast<std::ptrdiff_t>(std::max(c.scanned, from)),
                   c.in.begin() + static_cast<std::ptrdiff_t>(std::max(upto, c.scanned)), '\n'));
    c.scanned = std::max(upto, c.scanned);
    if (end == std::string::npos) {
      if (c.lines > options_.max_header_count + 1)
        refuse(c, {431, "headers_too_large",
                   "more than " + std::to_string(options_.max_header_count) + " header lines"});
      return c.lines <= options_.max_header_count + 1;
    }
    auto decided = decide_framing(std::string_view(c.in).substr(0, end + 3), options_);
    if (auto* r = std::get_if<transport_refusal>(&decided)) {
      refuse(c, std::move(*r));
      return false;
    }
    const auto framing = std::get<request_framing>(decided);
    if (framing.body_size > 0) {
      if (framing.body_size > options_.max_buffered_body_bytes - buffered_) {
        refuse(c, {503, "busy",
                   "bodies being received fill max_buffered_body_bytes (" +
                       std::to_string(options_.max_buffered_body_bytes) + " bytes)"});
        return false;
      }
      buffered_ += framing.body_size;
      c.reserved = framing.body_size;
      c.in.reserve(framing.head_size + framing.body_size);
    }
    c.framing = framing;
    if (framing.expect_continue && c.in.size() < framing.head_size + framing.body_size) {
      c.out += continue_line;
      if (!flush(c)) {
        close_now(c);
        return false;
      }
    }
    return true;
  }

  void release(connection& c) {
    buffered_ -= c.reserved;
    c.reserved = 0;
  }

  // Answers `r` (then closes): a refusal the transport decides.
  void refuse(connection& c, transport_refusal r) {
    ++(r.status == 503 ? counters_.connections_refused : counters_.refused);
    release(c);
    c.out += refusal_text(r);
    c.at = phase::answering;
    c.silence_deadline = steady::now() + options_.write_timeout;
    if (!flush(c)) return close_now(c);
    if (c.out.empty()) begin_drain(c);
  }

  // Closing with unread request bytes makes the kernel send a reset, which can destroy the
  // answer before the client read it (e.g. a 413 sent from the headers while the body comes).
  // So: half-close, then read and drop what the client still sends, briefly and boundedly.
  void begin_drain(connection& c) {
    if (c.peer_closed || draining_ >= options_.max_connections) return close_now(c);
    if (c.ssl && !c.tls_failed && c.at != phase::handshake) {
      ERR_clear_error();
      SSL_shutdown(c.ssl);  // one non-blocking attempt at close_notify
    }
    ::shutdown(c.fd, SHUT_WR);
    --held_;
    ++draining_;
    c.at = phase::draining;
    c.silence_deadline = steady::now() + drain_time;
    c.in = std::string();
    c.out = std::string();
    drain(c);
  }

  void drain(connection& c) {
    char buffer[16384];
    for (;;) {
      const ssize_t n = ::recv(c.fd, buffer, sizeof buffer, 0);
      if (n > 0) {
        c.drained += static_cast<std::size_t>(n);
        if (c.drained < drain_limit) continue;
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return;
      }
      return close_now(c);
    }
  }

  void close_now(connection& c) {
    if (c.at == phase::closed) return;
    if (c.at == phase::draining) {
      --draining_;
    } else {
      --held_;
      if (c.ssl && !c.tls_failed && c.at != phase::handshake) {
        ERR_clear_error();
        SSL_shutdown(c.ssl);
      }
    }
    release(c);
    c.at = phase::closed;  // reap() destroys it
  }

  void expire(steady::time_point now) {
    for (auto& [id, c] : connections_) {
      if (c->at == phase::with_worker || c->at == phase::closed || now < deadline_of(*c)) continue;
      if (c->at != phase::receiving || (c->in.empty() && !c->framing)) {
        close_now(*c);  // idle between requests, handshake, or an answer nobody reads
        continue;
      }
      const bool whole = now >= c->request_deadline;
      refuse(*c, {408, "timeout",
                  whole ? "request not complete within request_timeout (" +
                              std::to_string(options_.request_timeout.count()) + " ms) of " +
                              (c->served == 0 ? "accepting the connection" : "the previous answer")
                        : "nothing received for read_timeout (" +
                              std::to_string(options_.read_timeout.count()) + " ms)"});
    }
  }

  // Connections whose worker is done: next request, or close.
  void take_returned() {
    std::vector<connection*> done;
    {
      std::lock_guard lock(jobs_mutex_);
      done.swap(returned_);
    }
    for (connection* c : done) {
      release(*c);
      c->framing.reset();
      c->scanned = 0;
      c->lines = 0;
      if (stopping_) {
        c->at = phase::receiving;
        close_now(*c);
        continue;
      }
      if (!c->keep) {
        c->at = phase::answering;  // the answer is out: drain and close
        begin_drain(*c);
        continue;
      }
      const auto now = steady::now();
      c->at = phase::receiving;
      c->request_deadline = now + options_.request_timeout;
      c->silence_deadline =
          now + (c->in.empty() ? options_.keep_alive_timeout : options_.read_timeout);
      // Pipelined bytes may hold the next request already, and TLS may hold decrypted bytes
      // that poll cannot see.
      receive(*c);
    }
  }

  void reap() {
    std::erase_if(connections_, [](const auto& e) { return e.second->at == phase::closed; });
  }

  // Stopping: every connection closes now, except those a worker is answering, which get
  // stop_grace to finish before their sockets are shut down (so their writes fail at once).
  void shut_down() {
    ::close(listener_);
    {
      std::lock_guard lock(jobs_mutex_);
      for (connection* c : jobs_) c->at = phase::receiving;  // taken back, never started
      jobs_.clear();
    }
    for (auto& [id, c] : connections_)
      if (c->at != phase::with_worker) close_now(*c);
    reap();
    const auto cut_at = steady::now() + stop_grace;
    bool cut = false;
    for (;;) {
      take_returned();
      reap();
      const bool serving = std::any_of(connections_.begin(), connections_.end(), [](const auto& e) {
        return e.second->at == phase::with_worker;
      });
      if (!serving) break;
      if (!cut && steady::now() >= cut_at) {
        for (auto& [id, c] : connections_) ::shutdown(c->fd, SHUT_RDWR);
        cut = true;
      }
      pollfd p{wake_fd_, POLLIN, 0};
      const auto left = std::chrono::ceil<milliseconds>(cut_at - steady::now()).count();
      ::poll(&p, 1, cut ? 100 : static_cast<int>(std::max<long long>(left, 0)));
      std::uint64_t count;
      [[maybe_unused]] const auto n = ::read(wake_fd_, &count, sizeof count);
    }
    counters_.open_connections = 0;
  }

  guarded_server& server_;
  const int listener_;
  const update_endpoint_options& options_;
  SSL_CTX* tls_;
  transport_counters counters_;
  int wake_fd_ = -1;
  std::atomic<bool> stopping_{false};

  // The reception thread's own.
  std::map<std::uint64_t, std::unique_ptr<connection>> connections_;  // in accept order
  std::uint64_t next_id_ = 0;
  std::size_t held_ = 0;  // connections counted against max_connections (not draining)
  std::size_t draining_ = 0;
  std::size_t buffered_ = 0;  // body bytes reserved, all connections
  steady::time_point accept_paused_until_{};

  // Shared with the workers.
  std::mutex jobs_mutex_;
  std::condition_variable jobs_ready_;
  std::deque<connection*> jobs_;
  std::vector<connection*> returned_;
  std::size_t busy_ = 0;
  bool workers_stopping_ = false;

  std::vector<std::thread> workers_;
  std::thread reception_;
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
    case bundle_reason::expired:
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
  // "expired_bundle", beside the endpoint's own "expired_request" for rollbacks.
  const std::string error =
      e.reason() == bundle_reason::expired ? "expired_bundle" : std::string(to_string(e.reason()));
  return {status_of(e.reason()), error, e.involved()};
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

std::string gpu_name(const std::optional<compute_capability>& device) {
  return device ? to_string(*device) : "";
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
  impl(module_sink& s, update_endpoint_options o)
      : sink(s), options(std::move(o)), state(options.state_file) {}

  // Per-module bookkeeping of the endpoint: the apply lock and the last refusal (the replay
  // check's memory is `state`). Created only for modules the sink knows or that got a verified
  // bundle, so unauthenticated requests cannot grow it.
  struct module_entry {
    std::mutex apply;  // serialises apply/rollback of this module: a version is applied once
    std::mutex text;
    std::string last_refusal;  // status_summary() of the last refusal of a verified request
  };

  module_sink& sink;
  update_endpoint_options options;
  ssl_ctx_ptr tls;
  std::unique_ptr<guarded_server> server;       // parses, routes and answers requests
  std::unique_ptr<connection_service> service;  // accepts, receives, hands requests to workers
  std::atomic<bool> is_running{false};
  std::atomic<std::uint16_t> bound_port{0};

  std::atomic<std::uint64_t> applied{0}, refused{0}, rolled_back{0}, connections_refused{0},
      open_connections{0};

  std::mutex entries_mutex;
  std::map<std::string, std::unique_ptr<module_entry>, std::less<>> entries;

  // Highest versions and rollback nonces, in memory or persisted (options.state_file).
  update_state state;
  static constexpr std::size_t max_nonces = 100000;
  // What a client is told and what the status keeps of a refusal (see refuse()).
  static constexpr std::size_t max_detail_bytes = 4096;
  static constexpr std::size_t max_summary_bytes = 256;

  std::chrono::system_clock::time_point now() const {
    return options.clock ? options.clock() : std::chrono::system_clock::now();
  }

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

  // `detail` cut to max_detail_bytes (at a UTF-8 character boundary), saying how much was cut.
  // JSON escaping takes care of control characters.
  static std::string bounded_detail(std::string detail) {
    if (detail.size() <= max_detail_bytes) return detail;
    std::size_t cut = max_detail_bytes - 32;
    while (cut > 0 && (static_cast<unsigned char>(detail[cut]) & 0xC0) == 0x80) --cut;
    const auto more = detail.size() - cut;
    detail.resize(cut);
    return detail + " ... (" + std::to_string(more) + " more bytes)";
  }

  // What the status keeps of a refusal: printable ASCII, with '\' as "\\" and every other
  // byte (control characters, terminal escapes, UTF-8) as "\xNN", at most max_summary_bytes.
  static std::string status_summary(std::string_view text) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string out;
    for (const char c : text) {
      const auto u = static_cast<unsigned char>(c);
      std::string piece;
      if (c == '\\')
        piece = "\\\\";
      else if (u >= 0x20 && u < 0x7F)
        piece = std::string(1, c);
      else
        piece = {'\\', 'x', digits[u >> 4], digits[u & 0xF]};
      if (out.size() + piece.size() > max_summary_bytes - 3) return out + "...";
      out += piece;
    }
    return out;
  }

  // Answers a refusal, its detail bounded. With `e`, also the module's last_refusal: pass it only
  // for requests that passed signature verification (else anyone could write there).
  void refuse(httplib::Response& res, refusal r, module_entry* e = nullptr) {
    ++refused;
    r.detail = bounded_detail(std::move(r.detail));
    if (e) {
      auto summary = status_summary(std::to_string(r.status) + " " + r.error + ": " + r.detail);
      std::lock_guard lock(e->text);
      e->last_refusal = std::move(summary);
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
    const auto device = sink.device_capability();
    if (!device) return std::nullopt;
    const auto& m = bundle.manifest;
    bool runs = false;
    if (m.kind == payload_kind::cuda_source) {
      // Compiled here for exactly this device.
      runs = m.target_capability.numbers() == device->numbers();
    } else if (bundle.image) {  // as verify_bundle inspected it: not parsed again
      try {
        runs = can_run_on(*bundle.image, *device);
      } catch (const std::exception&) {
        runs = false;
      }
    }
    if (runs) return std::nullopt;
    return refusal{422,
                   "wrong_device",
                   "module '" + m.name + "' v" + std::to_string(m.version) + " targets " +
                       m.target + ", this service's GPU is " + gpu_name(device),
                   {{"gpu", gpu_name(device)}}};
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
      verify_limits limits;
      limits.max_bundle_bytes = options.max_body_bytes;
      limits.now = now();
      limits.require_expiry = options.require_expiry;
      limits.max_age = options.max_bundle_age;
      bundle = verify_bundle(std::as_bytes(std::span(req.body.data(), req.body.size())),
                             options.keys, limits);
    } catch (const bundle_error& e) {
      // Not stored under the module's name: the request is not (wholly) verified.
      return refuse(res, refusal_of(e));
    } catch (const std::exception& e) {
      return refuse(res, {400, "bad_request", e.what()});
    }
    const auto& m = bundle.manifest;
    if (m.name != name)
      return refuse(res,
                    {400, "name_mismatch",
                     "URL names module '" + name + "', the signed manifest '" + m.name + "'"},
                    find_entry(name));
    auto& e = entry(name);  // the bundle is signed by a trusted key: worth remembering
    if (auto r = check_device(bundle)) return refuse(res, *r, &e);

    std::lock_guard serial(e.apply);
    // The serving version is the module's (the sink reads it from the module's chain, whoever
    // promoted); the replay state is the floor: the highest version ever seen applied.
    const std::uint64_t current = sink.current_version(name);
    const std::uint64_t highest = state.highest_version(name);  // applied before, or a floor
    const std::uint64_t seen = std::max(current, highest);
    if (m.version <= seen) {
      // A version promoted past the endpoint (a hot_reloader, a direct promote) is a floor too:
      // kept even after a rollback below it. Best effort here; the refusal stands either way.
      if (current > highest) {
        try {
          state.store_highest_version(name, current);
        } catch (const std::exception&) {
        }
      }
      return refuse(res,
                    {409,
                     m.version == seen ? "replayed_version" : "older_version",
                     "module '" + name + "' v" + std::to_string(m.version) + " is not above v" +
                         std::to_string(seen) +
                         (seen == current ? " (serving)" : " (applied before, or the floor)"),
                     {{"current_version", current}, {"highest_version", seen}}},
                    &e);
    }
    // Recorded (and with a state file written) before the sink sees it: a version that may
    // have been applied is never accepted again, even after a crash between apply and answer.
    try {
      state.store_highest_version(name, m.version);
    } catch (const std::exception& x) {
      return refuse(res, {500, "state_failed", x.what()}, &e);
    }
    sink_result result;
    try {
      result = sink.apply(bundle);
    } catch (const std::exception& x) {
      result = {sink_outcome::failed, current, std::string("sink threw: ") + x.what()};
    } catch (...) {
      result = {sink_outcome::failed, current, "sink threw a non-standard exception"};
    }
    if (result.outcome != sink_outcome::done) {
      // Not applied: the same version may come again, so the record goes back (to the serving
      // version if that was higher). Should that write fail, the version stays refused (the safe
      // side), and the detail says so.
      try {
        state.store_highest_version(name, seen);
      } catch (const std::exception& x) {
        result.detail +=
            std::string(" (v") + std::to_string(m.version) + " stays refused: " + x.what() + ")";
      }
    }
    switch (result.outcome) {
      case sink_outcome::done:
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
      return refuse(res, refusal_of(e));  // not verified: not stored under the module's name
    } catch (const std::exception& e) {
      return refuse(res, {400, "bad_request", e.what()});
    }
    if (request.module != name)
      return refuse(
          res,
          {400, "name_mismatch",
           "URL names module '" + name + "', the signed request '" + request.module + "'"},
          find_entry(name));
    const auto now = std::chrono::floor<std::chrono::seconds>(this->now());
    const auto skew = request.created > now ? request.created - now : now - request.created;
    if (skew > options.rollback_window)
      return refuse(res,
                    {403, "expired_request",
                     "request created " + detail::format_time(request.created) +
                         ", endpoint time " + detail::format_time(now) + ", window " +
                         std::to_string(options.rollback_window.count()) + " s"},
                    find_entry(name));
    // A nonce is remembered (and with a state file written, before anything is done) while its
    // request could still be fresh; older ones are dropped.
    nonce_outcome fresh = nonce_outcome::full;
    try {
      fresh = state.remember_nonce(request.nonce, request.created,
                                   now - 2 * options.rollback_window, max_nonces);
    } catch (const std::exception& x) {
      return refuse(res, {500, "state_failed", x.what()}, find_entry(name));
    }
    if (fresh == nonce_outcome::replayed)
      return refuse(res, {409, "replayed_request", "nonce " + request.nonce + " was used before"},
                    find_entry(name));
    if (fresh == nonce_outcome::full)
      return refuse(res, {503, "busy", "too many rollback requests in the window"});
    const std::uint64_t known = sink.current_version(name);
    module_entry* e = find_entry(name);
    if (!e && known == 0) return refuse(res, {404, "unknown_module", "no module '" + name + "'"});
    if (!e) e = &entry(name);
    std::lock_guard serial(e->apply);
    const std::uint64_t current = sink.current_version(name);
    if (request.from_version != current)
      return refuse(res,
                    {409,
                     "version_mismatch",
                     "request rolls back from v" + std::to_string(request.from_version) + ", v" +
                         std::to_string(current) + " serves",
                     {{"current_version", current}}},
                    e);
    // The version rolled back from was applied, by the endpoint or past it: it is the floor
    // from now on (recorded before the sink is called, as for a push).
    if (current > state.highest_version(name)) {
      try {
        state.store_highest_version(name, current);
      } catch (const std::exception& x) {
        return refuse(res, {500, "state_failed", x.what()}, e);
      }
    }
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
      return answer(res, {500, "status_failed", bounded_detail(x.what())});
    }
    json modules = json::array();
    for (const auto& r : reports) {
      json m{{"name", r.name},
             {"current_version", r.current_version},
             {"versions_held", r.versions_held},
             {"in_flight", r.in_flight},
             {"last_error", r.last_error.empty() ? json(nullptr) : json(r.last_error)}};
      m["highest_version"] = std::max(state.highest_version(r.name), r.current_version);
      if (auto* e = find_entry(r.name)) {
        std::lock_guard lock(e->text);
        m["last_refusal"] = e->last_refusal.empty() ? json(nullptr) : json(e->last_refusal);
      } else {
        m["last_refusal"] = nullptr;
      }
      modules.push_back(std::move(m));
    }
    const auto device = sink.device_capability();
    answer(res, 200,
           {{"gpu", device ? json(gpu_name(device)) : json(nullptr)},
            {"modules", std::move(modules)},
            {"endpoint",
             {{"applied", applied.load()},
              {"refused", refused.load()},
              {"rolled_back", rolled_back.load()},
              {"connections_refused", connections_refused.load()}}}});
  }

  // Reads the body through httplib's content reader, counting it against `limit` (the
  // reception thread checked its Content-Length already; this is a second wall), into the
  // request's body: httplib hands handlers its own request (a local of process_request) as const.
  // Through the content reader, httplib never parses a body as a form (which it refused over
  // 8 KiB with a false 413) whatever the Content-Type.
  bool read_body(const httplib::Request& req, httplib::Response& res,
                 const httplib::ContentReader& content, std::size_t limit) {
    auto& body = const_cast<httplib::Request&>(req).body;
    bool over = false;
    const bool read = content([&](const char* data, std::size_t size) {
      over = size > limit - body.size();
      if (!over) body.append(data, size);
      return !over;
    });
    if (read) return true;
    close_after_response();
    refuse(res, over ? refusal{413, "too_large", "body over " + std::to_string(limit) + " bytes"}
                     : refusal{400, "bad_request", "the body could not be read"});
    return false;
  }

  void configure(guarded_server& s) {
    // httplib's default sets SO_REUSEPORT, which would let another process bind the same port
    // and take part of the connections; SO_REUSEADDR alone only allows a quick restart.
    s.set_socket_options([](socket_t sock) {
      const int yes = 1;
      ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    });
    s.set_payload_max_length(options.max_body_bytes);
    // What httplib announces in Keep-Alive headers; the reception thread enforces them.
    s.set_keep_alive_max_count(options.keep_alive_max_requests);
    s.set_keep_alive_timeout(std::max<time_t>(
        1, std::chrono::ceil<std::chrono::seconds>(options.keep_alive_timeout).count()));
    s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      return pre_route(req, res);
    });
    s.Get("/v1/modules",
          [this](const httplib::Request&, httplib::Response& res) { list_modules(res); });
    s.Put("/v1/modules/(.+)", httplib::Server::HandlerWithContentReader(
                                  [this](const httplib::Request& req, httplib::Response& res,
                                         const httplib::ContentReader& content) {
                                    if (read_body(req, res, content, options.max_body_bytes))
                                      put_module(req, res);
                                  }));
    s.Post("/v1/modules/(.+)/rollback",
           httplib::Server::HandlerWithContentReader([this](const httplib::Request& req,
                                                            httplib::Response& res,
                                                            const httplib::ContentReader& content) {
             if (read_body(req, res, content, max_rollback_request_bytes))
               rollback_module(req, res);
           }));
    // Answers httplib produces itself (404, 400 unparsable, 414; 413 cannot happen behind the
    // reception thread's checks) get a JSON body like ours; answers that have one keep it.
    s.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request&,
                                                                    httplib::Response& res) {
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
          answer(res, {500, "internal_error", bounded_detail(std::move(what))});
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
                       d.options.write_timeout.count() > 0 &&
                       d.options.keep_alive_timeout.count() > 0,
                   "update_endpoint_options timeouts must be positive");
  CUBRIDGE_EXPECTS(d.options.max_connections > 0, "update_endpoint_options::max_connections is 0");
  CUBRIDGE_EXPECTS(d.options.max_header_bytes > 0 && d.options.max_header_count > 0,
                   "update_endpoint_options::max_header_bytes and max_header_count must be "
                   "positive");
  CUBRIDGE_EXPECTS(d.options.max_buffered_body_bytes >=
                       std::max(d.options.max_body_bytes, max_rollback_request_bytes),
                   "update_endpoint_options::max_buffered_body_bytes (" +
                       std::to_string(d.options.max_buffered_body_bytes) +
                       ") is below max_body_bytes (" + std::to_string(d.options.max_body_bytes) +
                       ") or a rollback request's 4096: such a body could never be received");
  for (const auto& [name, floor] : d.options.version_floor)
    CUBRIDGE_EXPECTS(
        check_module_name(name).empty() && detail::check_signed_text(name).empty(),
        "update_endpoint_options::version_floor names no module: " + detail::printable(name));
  // The replay state, before anything listens: a file that cannot be read stops the start
  // (ignoring it would accept every old bundle again).
  d.state.load();
  for (const auto& [name, floor] : d.options.version_floor)
    d.state.raise_highest_version(name, floor);
  const bool want_tls = !d.options.tls_certificate.empty() || !d.options.tls_private_key.empty();
  if (want_tls) {
    CUBRIDGE_EXPECTS(!d.options.tls_certificate.empty() && !d.options.tls_private_key.empty(),
                     "TLS needs both tls_certificate and tls_private_key");
    d.tls = make_tls_context(d.options.tls_certificate, d.options.tls_private_key);
  }
  d.server = std::make_unique<guarded_server>();
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
  try {
    d.service = std::make_unique<connection_service>(
        *d.server, d.server->release_listener(), d.options, d.tls.get(),
        transport_counters{d.refused, d.connections_refused, d.open_connections});
  } catch (...) {
    d.server.reset();
    d.tls.reset();
    throw;
  }
  d.bound_port = static_cast<std::uint16_t>(port);
  d.is_running = true;
}

void update_endpoint::stop() noexcept {
  auto& d = *impl_;
  if (!d.server) return;
  d.service.reset();  // closes every connection and joins every thread
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
  return {impl_->applied, impl_->refused, impl_->rolled_back, impl_->connections_refused,
          impl_->open_connections};
}

}  // namespace cubridge
