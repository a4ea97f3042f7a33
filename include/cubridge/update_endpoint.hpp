#pragma once
// An HTTP endpoint, embeddable in any service, that takes signed module bundles (bundle.hpp) and
// hands them to a module_sink (module_sink.hpp), which stages and promotes them. Nothing listens
// until start(); it binds 127.0.0.1 unless told otherwise. The protocol is specified in
// docs/update-endpoint.md:
//
//   PUT  /v1/modules/{name}            body: a bundle            -> {"promoted":true, ...}
//   POST /v1/modules/{name}/rollback   body: rollback_request.hpp -> {"rolled_back":true, ...}
//   GET  /v1/modules                   -> every module: current version, versions held,
//                                         in-flight counts, last error; the device's SM
//
// Every refusal answers JSON {"error": "<reason>", "detail": "<what exactly>"} with a status:
//
//   400  bad_name (before anything else: '/', '\', "..", control characters, empty, > 128
//        bytes), bad_magic, unsupported_version, malformed, malformed_manifest,
//        invalid_manifest, name_mismatch (URL name differs from the signed name), bad_request
//   401  unsigned_bundle (all-zero signature)
//   403  unknown_key, bad_signature (tampered manifest or request), payload_mismatch (tampered
//        payload: size or SHA-256 differ from the signed manifest), expired_request (a rollback
//        request created outside the accepted clock window)
//   404  unknown_module (the sink has no such module), not_found (no such route)
//   409  replayed_version (the version serves or served already), older_version, replayed_request
//        (a rollback nonce seen before), version_mismatch (a rollback from a version that no
//        longer serves), no_previous_version
//   413  too_large (body over max_body_bytes; a rollback request over 4 KiB)
//   422  payload_kind_mismatch, target_mismatch (no code for the signed target), wrong_device (no
//        code for this service's GPU), stage_refused (the sink refused it: validation, compile)
//   500  apply_failed (the sink failed otherwise; the serving version is unchanged)
//   503  busy (all workers busy and the wait queue full: the connection is answered and closed at
//        once, without reading the request)
//
// Checks run in this order: name, size, bundle verification (verify_bundle: format, signature,
// payload hash, kind, signed target), URL name = signed name, device, then, under the module's
// lock, version > every version applied or current (so a push is applied at most once, also
// when the same bundle arrives twice at once), then the sink. A refused request changes nothing.
//
// Connections are bounded: `threads` workers serve connections, `max_queued_connections` wait,
// any more are answered 503 by the accepting thread. Each request must arrive and be answered
// within request_timeout (headers and body together, so a client sending one byte at a time
// cannot hold a worker), each read and write within read_timeout / write_timeout.

#include <cubridge/bundle.hpp>
#include <cubridge/module_sink.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

namespace cubridge {

/// How an update_endpoint listens and what it accepts.
struct update_endpoint_options {
  /// Address to bind; loopback unless a service decides otherwise.
  std::string bind_address = "127.0.0.1";
  /// Port to bind; 0 picks a free one (update_endpoint::port() tells which).
  std::uint16_t port = 0;
  /// Keys whose bundles and rollback requests are accepted. Empty: everything is refused.
  trusted_keys keys;
  /// Largest request body, in bytes (a bundle with its payload).
  std::size_t max_body_bytes = std::size_t{64} << 20;
  /// Worker threads, i.e. connections served at once.
  std::size_t threads = 4;
  /// Accepted connections that may wait for a worker; beyond, 503 at once.
  std::size_t max_queued_connections = 16;
  /// Longest wait for each read from / write to a client.
  std::chrono::milliseconds read_timeout{5000};
  std::chrono::milliseconds write_timeout{5000};
  /// Longest time for one whole request (TLS handshake, headers, body) and its answer.
  std::chrono::milliseconds request_timeout{30000};
  /// How long an idle keep-alive connection keeps its worker, and how many requests it may make.
  std::chrono::milliseconds keep_alive_timeout{2000};
  std::size_t keep_alive_max_requests = 100;
  /// Pending connections the kernel queues before accept.
  int listen_backlog = 128;
  /// HTTPS when both are set: PEM certificate chain and private key files (OpenSSL).
  std::filesystem::path tls_certificate;
  std::filesystem::path tls_private_key;
  /// Rollback requests are accepted when created within this much of the endpoint's clock.
  std::chrono::seconds rollback_window{300};
};

/// Counters, for reports and tests.
struct update_endpoint_stats {
  std::uint64_t applied = 0;              ///< pushes applied
  std::uint64_t refused = 0;              ///< pushes and rollbacks refused (any 4xx/5xx answer)
  std::uint64_t rolled_back = 0;          ///< rollbacks done
  std::uint64_t connections_refused = 0;  ///< connections answered 503 (busy)
};

/// The update endpoint. Not copyable or movable (its threads point into it).
class update_endpoint {
 public:
  /// Prepares an endpoint over `sink`, which must outlive it. Listens on nothing yet.
  update_endpoint(module_sink& sink, update_endpoint_options options);
  update_endpoint(const update_endpoint&) = delete;
  update_endpoint& operator=(const update_endpoint&) = delete;
  /// Stops it (see stop()).
  ~update_endpoint();

  /// Binds and starts serving on a thread of its own.
  /// @throws error (errc::io) when the address cannot be bound or the TLS files cannot be used;
  ///         error (errc::precondition) when already running or an option is out of range.
  void start();
  /// Stops accepting, lets requests in progress finish (each within request_timeout), joins
  /// every thread. Does nothing when not running. Never throws.
  void stop() noexcept;

  [[nodiscard]] bool running() const noexcept;
  /// The bound port; 0 when not running.
  [[nodiscard]] std::uint16_t port() const noexcept;
  /// "http://127.0.0.1:PORT" (https with TLS); empty when not running.
  [[nodiscard]] std::string url() const;
  [[nodiscard]] update_endpoint_stats stats() const noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace cubridge
