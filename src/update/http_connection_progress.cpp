// What the reception thread does with one connection when it is ready: the TLS handshake,
// receiving a request under its framing, refusing it, draining and closing; see
// http_connection_service.hpp.
#include "http_connection_service.hpp"

#include <openssl/err.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <variant>

#include <sys/socket.h>

namespace cubridge::http_internal {

void connection_service::progress(connection& c) {
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

void connection_service::handshake(connection& c) {
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

// Reads the request as far as its framing allows: the head up to max_header_bytes, then the
// body up to its Content-Length, never more; hands it to a worker when complete.
void connection_service::receive(connection& c) {
  if (!flush(c)) return close_now(c);
  if (!c.framing && c.scanned < c.in.size() && !scan_head(c)) return;
  if (!read_request(c)) return;
  if (!c.framing) {
    if (c.in.size() >= options_.max_header_bytes)
      return refuse(c, {transport_reason::headers_too_large,
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
    refuse(c, {transport_reason::busy,
               "all workers busy and the wait queue (max_queued_connections) is full"});
}

// Reads what the socket has, up to the head's limit or the framing's end, at most round_limit
// bytes this round; scans for the head as it comes. False when the request was refused or the
// connection closed.
bool connection_service::read_request(connection& c) {
  std::size_t round = 0;
  for (;;) {
    const std::size_t goal =
        c.framing ? c.framing->head_size + c.framing->body_size : options_.max_header_bytes;
    if (c.in.size() >= goal || c.peer_closed) return true;
    if (round >= round_limit) {
      c.more = true;  // let the other connections have their turn
      return true;
    }
    const std::size_t old = c.in.size();
    c.in.resize(old + std::min({goal - old, round_limit - round, std::size_t{64} << 10}));
    const auto r = receive_some(c, c.in.data() + old, c.in.size() - old);
    c.in.resize(old + r.n);
    if (r.n > 0) {
      round += r.n;
      c.silence_deadline = steady::now() + options_.read_timeout;
      if (!c.framing && !scan_head(c)) return false;
      continue;
    }
    c.want_write = r.status == io::again_write;
    if (r.status == io::end) c.peer_closed = true;
    if (r.status == io::failed) {
      close_now(c);
      return false;
    }
    return true;
  }
}

// Looks for the end of the head in what arrived, counting its lines. False when the request
// was refused.
bool connection_service::scan_head(connection& c) {
  // httplib ends the head at the first empty line: "\n\r\n" (a bare LF is refused later).
  const std::size_t from = c.scanned >= 2 ? c.scanned - 2 : 0;
  const auto end = c.in.find("\n\r\n", from);
  const std::size_t upto = end == std::string::npos ? c.in.size() : end + 1;
  c.lines += static_cast<std::size_t>(
      std::count(c.in.begin() + static_cast<std::ptrdiff_t>(std::max(c.scanned, from)),
                 c.in.begin() + static_cast<std::ptrdiff_t>(std::max(upto, c.scanned)), '\n'));
  c.scanned = std::max(upto, c.scanned);
  if (end == std::string::npos) {
    if (c.lines > options_.max_header_count + 1)
      refuse(c, {transport_reason::headers_too_large,
                 "more than " + std::to_string(options_.max_header_count) + " header lines"});
    return c.lines <= options_.max_header_count + 1;
  }
  return take_head(c, end + 3);
}

// The head (its first `head_size` bytes) is complete: decides the framing, reserves the body's
// room and answers Expect: 100-continue. False when the request was refused.
bool connection_service::take_head(connection& c, std::size_t head_size) {
  auto decided = decide_framing(std::string_view(c.in).substr(0, head_size),
                                options_.max_header_count, options_.body_limit);
  if (auto* r = std::get_if<transport_refusal>(&decided)) {
    refuse(c, *r);
    return false;
  }
  const auto framing = std::get<request_framing>(decided);
  if (framing.body_size > 0) {
    if (framing.body_size > options_.max_buffered_body_bytes - buffered_) {
      refuse(c, {transport_reason::busy, "bodies being received fill max_buffered_body_bytes (" +
                                             std::to_string(options_.max_buffered_body_bytes) +
                                             " bytes)"});
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

void connection_service::release(connection& c) {
  buffered_ -= c.reserved;
  c.reserved = 0;
}

// Answers `r` (then closes): a refusal the transport decides.
void connection_service::refuse(connection& c, const transport_refusal& r) {
  if (r.reason == transport_reason::busy) {
    ++counters_.connections_refused;
  } else {
    ++counters_.refused;
    if (counters_.refused_because) counters_.refused_because(to_string(r.reason));
  }
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
void connection_service::begin_drain(connection& c) {
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

void connection_service::drain(connection& c) {
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

void connection_service::close_now(connection& c) {
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

}  // namespace cubridge::http_internal
