#pragma once
// What the update endpoint's HTTP transport is set up with and the counters it moves: read by
// the reception (http_reception.hpp) and by the connection service it runs
// (http_connection_service.hpp), each of which includes this, not the other. Internal to
// cubridge_update.
#include "http_framing.hpp"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

namespace cubridge::http_internal {

/// How the transport listens and what it takes in; update_endpoint_options tells what each
/// means.
struct reception_options {
  std::string bind_address;
  std::uint16_t port = 0;  // 0: a free one
  int listen_backlog = 128;
  std::filesystem::path tls_certificate;  // HTTPS when set (both must be)
  std::filesystem::path tls_private_key;
  std::size_t threads = 4;
  std::size_t max_queued_connections = 16;
  std::size_t max_connections = 256;
  std::size_t max_buffered_body_bytes = 0;
  std::size_t max_header_bytes = 0;
  std::size_t max_header_count = 0;
  std::chrono::milliseconds read_timeout{0};
  std::chrono::milliseconds write_timeout{0};
  std::chrono::milliseconds request_timeout{0};
  std::chrono::milliseconds keep_alive_timeout{0};
  std::size_t keep_alive_max_requests = 0;
  /// The largest body each route takes, checked against the Content-Length before the body is
  /// read.
  body_limit_function body_limit;
};

/// The endpoint's counters that the transport moves; they outlive it (a restart keeps them).
struct reception_counters {
  std::atomic<std::uint64_t>& refused;              // 4xx answered before httplib saw the request
  std::atomic<std::uint64_t>& connections_refused;  // 503 busy
  std::atomic<std::uint64_t>& open_connections;
  /// Told the reason ("timeout", "headers_too_large", ...) of each refusal counted in
  /// `refused`; may be empty. Must not throw.
  std::function<void(std::string_view reason)> refused_because;
};

}  // namespace cubridge::http_internal
