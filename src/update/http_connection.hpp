#pragma once
// One connection of the update endpoint's transport (http_reception.hpp), the non-blocking reads
// and writes the reception thread makes on it (TLS or not), the stream a worker hands httplib
// for one buffered request, and the httplib server that parses, routes and answers it. Internal
// to cubridge_update; not installed.
#include "http_framing.hpp"

#include <httplib.h>
#include <openssl/ssl.h>

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <poll.h>
#include <sys/socket.h>

namespace cubridge::http_internal {

using steady = std::chrono::steady_clock;
using milliseconds = std::chrono::milliseconds;

/// httplib::Server for parsing, routing and answering one request (process_request, protected),
/// and for binding the listening socket; its own accept loop never runs.
class guarded_server final : public httplib::Server {
 public:
  /// httplib listens with a backlog of 5; a busy service needs more (Linux takes a second
  /// listen).
  bool set_backlog(int backlog) { return ::listen(svr_sock_, backlog) == 0; }
  /// The bound socket, handed over to the reception thread.
  int release_listener() { return svr_sock_.exchange(INVALID_SOCKET); }
  bool serve(httplib::Stream& stream, bool close_connection, bool& connection_closed) {
    return process_request(stream, close_connection, connection_closed, nullptr);
  }
};

/// One accepted connection. The reception thread owns it, except while a worker handles its
/// request (phase with_worker); the hand-over goes through the job queue's mutex.
struct connection {
  enum class phase { handshake, receiving, with_worker, answering, draining, closed };

  /// Takes `socket` and `tls` (may be null) over: the destructor frees and closes them.
  connection(int socket, SSL* tls) : fd(socket), ssl(tls) {}
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;
  ~connection();

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

/// What a non-blocking read or write on a connection came to.
enum class io { again, again_write, end, failed };
struct io_result {
  std::size_t n = 0;
  io status = io::again;
};

/// Reads at most `size` bytes into `p` without blocking (SSL_read with TLS).
io_result receive_some(connection& c, char* p, std::size_t size);
/// Writes at most `size` bytes of `p` without blocking (SSL_write with TLS).
io_result send_some(connection& c, const char* p, std::size_t size);
/// Writes what `c.out` holds as far as the socket takes it; false when the client is gone.
bool flush(connection& c);

/// OpenSSL writes to sockets with write(); a client that went away must give EPIPE on the
/// thread that wrote, not a SIGPIPE that ends the service. Blocks SIGPIPE on the calling thread.
void block_sigpipe();

/// The stream httplib reads one request from and writes its answer to: reads are served from
/// the buffered request and end with it, so httplib can never read past the framing decided
/// from the headers; writes go to the socket (SSL_write with TLS), each wait bounded.
class request_stream final : public httplib::Stream {
 public:
  request_stream(const connection& c, std::string_view request, milliseconds write_timeout,
                 milliseconds answer_timeout)
      : fd_(c.fd),
        ssl_(c.ssl),
        request_(request),
        write_timeout_(write_timeout),
        answer_timeout_(answer_timeout) {}

  /// Bytes of the request httplib has read.
  std::size_t consumed() const { return consumed_; }

  bool is_readable() const override { return consumed_ < request_.size(); }
  bool is_writable() const override { return wait(POLLOUT, write_timeout_); }
  ssize_t read(char* ptr, std::size_t size) override;
  ssize_t write(const char* ptr, std::size_t size) override;
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
  bool wait(short events, milliseconds timeout) const;
  void address(int (*get)(int, sockaddr*, socklen_t*), std::string& ip, int& port) const;

  int fd_;
  SSL* ssl_;
  std::string_view request_;
  std::size_t consumed_ = 0;
  bool wrote_ = false;
  milliseconds write_timeout_;
  milliseconds answer_timeout_;
  mutable steady::time_point deadline_{};
};

}  // namespace cubridge::http_internal
