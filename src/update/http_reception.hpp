#pragma once
// The update endpoint's HTTP transport. One reception thread accepts every connection and reads
// each request into that connection's buffer (TLS handshake, request line, headers, body),
// deciding the framing from the headers before it takes a body byte (http_framing.hpp); only
// complete requests go to the workers, where httplib parses, routes and answers them over a
// stream that reads the buffered request and writes to the socket. Then the connection, with any
// pipelined bytes, goes back to the reception thread. So a slow client costs a connection slot
// and a bounded buffer, never a worker. What a request means (routes, answers) is the endpoint's
// (update_endpoint.cpp). Internal to cubridge_update; not installed.
#include "http_framing.hpp"
#include "http_reception_options.hpp"

#include <httplib.h>
#include <openssl/ssl.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace cubridge::http_internal {

/// From a handler: closes the connection after this request's answer (e.g. when its body was
/// not read). Does nothing outside a worker.
void close_after_response();

class guarded_server;
class connection_service;

struct ssl_ctx_deleter {
  void operator()(SSL_CTX* ctx) const noexcept { SSL_CTX_free(ctx); }
};
using ssl_ctx_ptr = std::unique_ptr<SSL_CTX, ssl_ctx_deleter>;

/// The transport, running from construction to destruction.
class http_reception {
 public:
  /// Makes the TLS context when the files are set, lets `set_up` add the routes and handlers of
  /// the httplib::Server that parses, routes and answers every complete request, binds, and
  /// starts the reception thread and `options.threads` workers.
  /// @throws error (errc::io) when the TLS files cannot be used or the address cannot be bound.
  http_reception(reception_options options, const std::function<void(httplib::Server&)>& set_up,
                 reception_counters counters);
  http_reception(const http_reception&) = delete;
  http_reception& operator=(const http_reception&) = delete;
  /// Stops accepting and closes every connection; a request a worker is handling finishes (its
  /// answer gets a moment to go out, then its socket is shut down); joins every thread.
  ~http_reception();

  /// The bound port.
  [[nodiscard]] std::uint16_t port() const noexcept { return port_; }
  /// Whether it speaks HTTPS.
  [[nodiscard]] bool tls() const noexcept { return tls_ != nullptr; }

 private:
  reception_options options_;
  ssl_ctx_ptr tls_;
  std::unique_ptr<guarded_server> server_;       // parses, routes and answers requests
  std::unique_ptr<connection_service> service_;  // accepts, receives, hands requests to workers
  std::uint16_t port_ = 0;
};

}  // namespace cubridge::http_internal
