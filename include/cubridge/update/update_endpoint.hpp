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
//   GET  /metrics                      -> Prometheus text (metrics_text.hpp), only with
//                                         serve_metrics; unauthenticated, as the status
//   GET  /healthz                      -> 200 {"status":"live"} while the process answers
//                                         (liveness: a poisoned process is still live)
//   GET  /readyz                       -> 200 {"status":"ready"}; 503 {"status":"poisoned",
//                                         "error", "call", "since", "running"} from the first
//                                         request after a sticky CUDA error (process_health.hpp;
//                                         the sink's contexts are asked each time). Both always
//                                         served, unauthenticated, bodiless
//
// Every refusal answers JSON {"error": "<reason>", "detail": "<what exactly>"} with a status:
//
//   400  bad_name (before anything else: '/', '\', "..", control characters, empty, > 128
//        bytes), bad_magic, unsupported_version, malformed, malformed_manifest,
//        invalid_manifest, name_mismatch (URL name differs from the signed name), bad_request
//        (also: a malformed request line or header line, several or non-decimal Content-Length)
//   401  unsigned_bundle (all-zero signature)
//   403  unknown_key, bad_signature (tampered manifest or request), payload_mismatch (tampered
//        payload: size or SHA-256 differ from the signed manifest), expired_bundle (past its
//        signed expiry, older than max_bundle_age, or none where require_expiry), expired_request
//        (a rollback request created outside the accepted clock window)
//   404  unknown_module (the sink has no such module), not_found (no such route)
//   409  replayed_version (the version serves or served already), older_version, replayed_request
//        (a rollback nonce seen before), version_mismatch (a rollback from a version that no
//        longer serves), no_previous_version
//   408  timeout (a request not complete within request_timeout, or silent for read_timeout)
//   411  length_required (Transfer-Encoding, e.g. chunked; a push or rollback without
//        Content-Length)
//   413  too_large (body over max_body_bytes; a rollback request over 4 KiB; any body on a route
//        that takes none), decided from the Content-Length before the body is read
//   415  unsupported_encoding (a Content-Encoding other than identity), unsupported_media_type
//        (a multipart Content-Type; any other type is taken as the raw bundle)
//   431  headers_too_large (request line and headers over max_header_bytes or max_header_count)
//   422  payload_kind_mismatch, target_mismatch (no code for the signed target), wrong_device (no
//        code for this service's GPU), stage_refused (the sink refused it: validation, compile),
//        faulted_in_probation, mismatch_in_probation, probation_incomplete (the candidate failed
//        its probation; its payload is recorded as bad), known_bad (the payload is recorded as bad
//        on this node: refused before the sink sees it), sticky_error (a sink's answer: the
//        version served when the process was poisoned)
//   500  apply_failed (the sink failed otherwise; the serving version is unchanged),
//        state_failed (the replay state file could not be written; nothing was applied)
//   503  busy (max_connections connections open: a new one is answered and closed at once,
//        without reading its request; all workers busy and max_queued_connections requests
//        waiting; the body does not fit in max_buffered_body_bytes)
//
// Checks run in this order: name, size, bundle verification (verify_bundle: format, signature,
// expiry, payload hash, kind, signed target), URL name = signed name, device, then, under the
// module's lock, the payload not recorded as bad, version > every version applied, current or
// floor (so a push is applied at most
// once, also when the same bundle arrives twice at once, and, the state persisted, also across
// restarts), the new version recorded in the replay state, then the sink. These checks are an
// update_gate's (update_gate.hpp): the endpoint makes its own, or shares a node's with the fleet
// agent (the constructor taking a gate), so both doors hold one lock per module and one replay
// record. A refused request
// changes nothing. Every `detail` is at most 4 KiB; a module's `last_refusal` in the status is
// kept only for requests that passed verification, escaped to printable ASCII, at most 256 bytes.
//
// Connections: one reception thread accepts up to max_connections and reads each request (TLS
// handshake, headers, body) into a bounded buffer, with the framing decided from the headers
// before any body byte is taken; only complete requests go to the `threads` workers, so a slow
// client costs a connection slot, never a worker. A request must be complete within
// request_timeout of accept (later ones on the connection: of the previous answer). See
// docs/update-endpoint.md, "Connections", for every limit.

#include <cubridge/bundle/bundle.hpp>
#include <cubridge/update/module_sink.hpp>
#include <cubridge/update/update_gate.hpp>
#include <cubridge/update/update_state.hpp>  // update_state_error, raised by start()

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace cubridge {

/// How an update_endpoint listens and what it accepts. The policy fields (keys, state_file,
/// persist_state, version_floor, require_expiry, max_bundle_age, rollback_window, clock) make the
/// endpoint's own gate; an endpoint over a shared gate uses that gate's policy instead, and
/// refuses at start() options naming keys, a state_file or a version_floor (they would be
/// ignored).
struct update_endpoint_options {
  /// Address to bind; loopback unless a service decides otherwise.
  std::string bind_address = "127.0.0.1";
  /// Port to bind; 0 picks a free one (update_endpoint::port() tells which).
  std::uint16_t port = 0;
  /// Keys whose bundles and rollback requests are accepted. Empty: everything is refused.
  trusted_keys keys{};
  /// Largest body of a push, in bytes (a bundle with its payload), checked against the
  /// Content-Length before the body is read.
  std::size_t max_body_bytes = std::size_t{64} << 20;
  /// Worker threads, i.e. complete requests handled (verified, applied, answered) at once.
  std::size_t threads = 4;
  /// Complete requests that may wait for a worker; beyond, 503 at once.
  std::size_t max_queued_connections = 16;
  /// Connections held at once, whatever they are doing (TLS handshake, sending a request, being
  /// answered, idle between requests); beyond, a new connection is answered 503 at once.
  std::size_t max_connections = 256;
  /// Request bodies held in memory at once, all connections together: a request reserves its
  /// Content-Length when its headers are complete, and is answered 503 when that does not fit.
  /// At least max_body_bytes.
  std::size_t max_buffered_body_bytes = std::size_t{256} << 20;
  /// Largest request line and headers together, in bytes, and most header lines; beyond, 431.
  std::size_t max_header_bytes = std::size_t{16} << 10;
  std::size_t max_header_count = 100;
  /// Longest silence while a client sends a request, and longest wait for each write to it.
  std::chrono::milliseconds read_timeout{5000};
  std::chrono::milliseconds write_timeout{5000};
  /// Longest time from accepting a connection (for later requests on it: from the previous
  /// answer) to the end of a request's body, TLS handshake included; beyond, 408 and closed.
  std::chrono::milliseconds request_timeout{30000};
  /// How long a keep-alive connection may stay idle between requests, and how many it may make.
  std::chrono::milliseconds keep_alive_timeout{2000};
  std::size_t keep_alive_max_requests = 100;
  /// Pending connections the kernel queues before accept.
  int listen_backlog = 128;
  /// HTTPS when both are set: PEM certificate chain and private key files (OpenSSL).
  std::filesystem::path tls_certificate{};
  std::filesystem::path tls_private_key{};
  /// Rollback requests are accepted when created within this much of the endpoint's clock.
  std::chrono::seconds rollback_window{300};

  /// The replay state file (update_state.hpp): the highest version applied per module and the
  /// rollback nonces in their window, read at start() and written before each answer that
  /// changes them; locked (`<state_file>.lock`) while the endpoint's gate lives. Empty: the
  /// default file, default_state_directory() / "update-state.json" (state_location.hpp), while
  /// persist_state.
  std::filesystem::path state_file{};
  /// Keep the replay state in the default file when state_file is empty. false (tests, demos):
  /// in memory only, so after a restart the endpoint accepts captured old bundles and rollback
  /// requests again (as far as version_floor and expiry do not stop them).
  bool persist_state = true;
  /// Per module, a version at or below which every bundle is refused as a replay (409), e.g.
  /// from the service's own configuration; merged into the replay state at start().
  std::map<std::string, std::uint64_t, std::less<>> version_floor{};
  /// Refuse (403 expired_bundle) bundles that carry no `expires` field.
  bool require_expiry = false;
  /// Refuse (403 expired_bundle) bundles whose signed `created` is older than this.
  std::optional<std::chrono::seconds> max_bundle_age{};
  /// The clock for bundle expiry and the rollback window; empty: the system clock.
  std::function<std::chrono::system_clock::time_point()> clock{};
  /// Answer GET /metrics (Prometheus text format 0.0.4, docs/update-endpoint.md "Metrics"):
  /// the sink's modules, the endpoint's counters and cubridge_process_poisoned. Off by default:
  /// like GET /v1/modules it asks for no key, and a service decides whether its address may
  /// show them. (GET /healthz and /readyz are always served.)
  bool serve_metrics = false;

  /// The policy half of these options, as the endpoint hands it to its own update_gate
  /// (max_body_bytes is the gate's max_bundle_bytes).
  [[nodiscard]] update_gate_options gate_options() const;
};

/// Counters, for reports and tests.
struct update_endpoint_stats {
  std::uint64_t applied = 0;              ///< pushes applied
  std::uint64_t refused = 0;              ///< requests refused (4xx/5xx; no such route and the
                                          ///< transport's 503 busy are not counted here)
  std::uint64_t rolled_back = 0;          ///< rollbacks done
  std::uint64_t connections_refused = 0;  ///< answered 503 busy by the transport (connections,
                                          ///< workers and queue, or body buffer full)
  std::uint64_t open_connections = 0;     ///< connections held now (see max_connections)
};

/// The update endpoint. Not copyable or movable (its threads point into it).
class update_endpoint {
 public:
  /// Prepares an endpoint over `sink`, which its gate holds, with a gate of its own made from
  /// options.gate_options() (update_gate::create). Listens on nothing yet.
  update_endpoint(std::shared_ptr<module_sink> sink, update_endpoint_options options);
  /// Prepares an endpoint over a node's shared gate (the fleet agent may hold the same one):
  /// the gate's sink and policy serve; of `options` only the transport fields and
  /// serve_metrics count (max_body_bytes still bounds a body before the gate sees it). Listens
  /// on nothing yet. @throws error (errc::precondition) when `gate` is null.
  update_endpoint(std::shared_ptr<update_gate> gate, update_endpoint_options options);
  update_endpoint(const update_endpoint&) = delete;
  update_endpoint& operator=(const update_endpoint&) = delete;
  /// Stops it (see stop()).
  ~update_endpoint();

  /// Starts the gate (update_gate::start: the state file's lock, the replay state,
  /// version_floor; nothing when a shared gate was started already), binds and starts serving on
  /// threads of its own (one receiving, `threads` workers).
  /// @throws update_state_error (errc::io) when the state file is another gate's (locked),
  ///         unreadable, too large or corrupt (nothing listens then); error (errc::io) when the
  ///         address cannot be bound or the TLS files cannot be used; error
  ///         (errc::precondition) when already running or an option is out of range (a
  ///         version_floor name that is no module name; a zero limit or timeout;
  ///         max_buffered_body_bytes below max_body_bytes; no state_file and no default
  ///         directory while persist_state; over a shared gate: keys, a state_file or a
  ///         version_floor set in the options).
  void start();
  /// Stops accepting and closes every connection; a request a worker is handling finishes (its
  /// answer gets a moment to go out, then its socket is shut down); joins every thread. Returns
  /// at once whatever clients do (only a sink call in progress is waited for). Does nothing when
  /// not running. Never throws.
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
