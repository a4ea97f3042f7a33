// A connection's reads and writes, and the stream httplib serves one buffered request over; see
// http_connection.hpp.
#include "http_connection.hpp"

#include <openssl/err.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

namespace cubridge::http_internal {

connection::~connection() {
  if (ssl) SSL_free(ssl);
  ::close(fd);
}

io_result receive_some(connection& c, char* p, std::size_t size) {
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

io_result send_some(connection& c, const char* p, std::size_t size) {
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

bool flush(connection& c) {
  while (!c.out.empty()) {
    const auto r = send_some(c, c.out.data(), c.out.size());
    if (r.status == io::failed) return false;
    if (r.n == 0) return true;  // the rest when the socket is writable
    c.out.erase(0, r.n);
  }
  return true;
}

void block_sigpipe() {
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
}

ssize_t request_stream::read(char* ptr, std::size_t size) {
  size = std::min(size, request_.size() - consumed_);
  std::memcpy(ptr, request_.data() + consumed_, size);
  consumed_ += size;
  return static_cast<ssize_t>(size);
}

ssize_t request_stream::write(const char* ptr, std::size_t size) {
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

bool request_stream::wait(short events, milliseconds timeout) const {
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

void request_stream::address(int (*get)(int, sockaddr*, socklen_t*), std::string& ip,
                             int& port) const {
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

}  // namespace cubridge::http_internal
