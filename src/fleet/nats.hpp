#pragma once
// The NATS C client (libnats) as cubridge::fleet uses it, private to the fleet target: owners of
// its handles, one check that turns a natsStatus (and a JetStream error code) into a
// cubridge::error, connecting with the fleet's reconnect policy, and the streams and bucket of
// docs/fleet.md made or checked idempotently.

#include <cubridge/fleet/connection.hpp>
#include <cubridge/fleet/error.hpp>

#include <nats/nats.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cubridge::fleet::detail {

/// Destroys a libnats object with its own destroy function.
template <class T, auto Destroy>
struct nats_deleter {
  void operator()(T* object) const noexcept { Destroy(object); }
};
template <class T, auto Destroy>
using nats_ptr = std::unique_ptr<T, nats_deleter<T, Destroy>>;

using connection_ptr = nats_ptr<natsConnection, natsConnection_Destroy>;  // closes it too
using options_ptr = nats_ptr<natsOptions, natsOptions_Destroy>;
using jetstream_ptr = nats_ptr<jsCtx, jsCtx_Destroy>;
using kv_store_ptr = nats_ptr<kvStore, kvStore_Destroy>;
using subscription_ptr = nats_ptr<natsSubscription, natsSubscription_Destroy>;
using message_ptr = nats_ptr<natsMsg, natsMsg_Destroy>;
using kv_entry_ptr = nats_ptr<kvEntry, kvEntry_Destroy>;
using kv_watcher_ptr = nats_ptr<kvWatcher, kvWatcher_Destroy>;
using stream_info_ptr = nats_ptr<jsStreamInfo, jsStreamInfo_Destroy>;
using pub_ack_ptr = nats_ptr<jsPubAck, jsPubAck_Destroy>;
using statistics_ptr = nats_ptr<natsStatistics, natsStatistics_Destroy>;

/// Throws cubridge::error (domain "fleet") unless `status` is NATS_OK: fleet_errc::unreachable
/// for a connection that is closed, lost or was never made, else fleet_errc::nats_failed. The
/// message names `call`, the status, libnats's last error text, the JetStream error code when
/// not 0, and `involved` ("stream CUBRIDGE_RESULTS at nats://127.0.0.1:4222").
void check(natsStatus status, std::string_view call, std::string_view involved,
           jsErrCode js_code = static_cast<jsErrCode>(0),
           std::source_location where = std::source_location::current());

/// Throws cubridge::error of `code` with the message `description`.
[[noreturn]] void fail(fleet_errc code, std::string description, std::string_view call,
                       std::string_view involved,
                       std::source_location where = std::source_location::current());

/// How to connect.
struct connect_options {
  bus_options bus;   ///< servers (checked by parse_server_list), credentials, TLS
  std::string name;  ///< the client's name, as the server's monitoring shows it
  /// Reconnect forever after a lost connection, waiting 250 ms doubling to 2 s, with jitter.
  /// Off: a lost connection closes it (calls then fail with fleet_errc::unreachable).
  bool reconnect = true;
  /// Keep trying in the background when no server answers at first (a service starts while the
  /// server is down): connect() then returns a connection that is not connected yet. Off: no
  /// server is fleet_errc::unreachable at once (the control side).
  bool retry_on_failed_connect = false;
  /// How long one attempt to open a connection may take.
  std::chrono::milliseconds connect_timeout{2000};
};

/// The first try of each server of a list of several, before a try with the full timeout.
inline constexpr std::chrono::milliseconds quick_connect_timeout{400};

/// The delay before try `attempt` (1, 2, ...) of something that keeps failing: `first`, doubling
/// up to `longest`, plus a random share of up to half of that, so that clients that failed
/// together (a server restart, a storm) do not try again together. The one backoff of the fleet:
/// reconnects, the agent's retries, watches and publishes.
[[nodiscard]] std::chrono::milliseconds jittered_backoff(
    int attempt, std::chrono::milliseconds first, std::chrono::milliseconds longest) noexcept;
/// The delay before reconnect attempt `attempt`: jittered_backoff from 250 ms to 2 s.
[[nodiscard]] std::chrono::milliseconds reconnect_delay(int attempt) noexcept;

/// natsOptions for `options`: every server of the list (tried in order), the credentials, TLS
/// verified against the CA; the caller may add callbacks before connect().
/// @throws cubridge::error: errc::precondition for a server list parse_server_list refuses;
///         errc::io / errc::precondition for a credentials file that cannot be used;
///         fleet_errc::nats_failed for an option libnats does not take (a CA file it cannot
///         load).
[[nodiscard]] options_ptr make_options(const connect_options& options);

/// Connects with `options` (from make_options). With retry_on_failed_connect a connection that
/// is not yet connected is returned (NATS_NOT_YET_CONNECTED). The overload of connect_options
/// tries a list of several servers first with quick_connect_timeout each (a hung server costs
/// that), then with the full timeout, and says the common causes of a refusal in words.
/// @throws cubridge::error (fleet_errc::unreachable) when no server answers at `servers`
///         (redacted in the message), fleet_errc::refused when a server refuses the identity.
[[nodiscard]] connection_ptr connect(natsOptions* options, std::string_view servers);
[[nodiscard]] connection_ptr connect(const connect_options& options);

/// The URL of the server `connection` uses now, redacted; empty when not connected.
[[nodiscard]] std::string connected_url(natsConnection* connection);

/// The JetStream context of `connection`; its API requests wait at most `wait` and go to
/// `api_prefix` (empty: "$JS.API"; a node in an account of its own reaches the fleet's
/// JetStream through the prefix its account imports, bus_options::api_prefix).
[[nodiscard]] jetstream_ptr jetstream(natsConnection* connection,
                                      std::chrono::milliseconds wait = std::chrono::seconds(5),
                                      const std::string& api_prefix = {});

/// The streams and bucket of docs/fleet.md, made when missing with `replicas` replicas. One that
/// exists with another configuration is used as it is: the returned text names each field that
/// differs and both values (empty when it matches), for the caller to report.
[[nodiscard]] std::string ensure_bundle_stream(jsCtx* js, std::string_view module, int replicas,
                                               std::int64_t max_payload);
/// The results stream stores cubridge.result.<m>.* for each of `modules` and nothing wider: the
/// subjects are added to (never removed from) the stream, which is made when missing and at
/// least one module is named. One of an older cubridge (cubridge.result.>) is narrowed to
/// `every_module()` too (the modules with a desired state: asked only then).
[[nodiscard]] std::string ensure_result_stream(
    jsCtx* js, int replicas, std::span<const std::string> modules,
    const std::function<std::vector<std::string>()>& every_module = {});
[[nodiscard]] std::string ensure_heartbeat_stream(jsCtx* js, int replicas);
/// The control bucket, made when missing (the control side).
[[nodiscard]] kv_store_ptr ensure_control_bucket(jsCtx* js, int replicas, std::string* mismatch);
/// The control bucket as it is (a node: never made here). Throws as check() when it is missing.
[[nodiscard]] kv_store_ptr bind_control_bucket(jsCtx* js);

/// A key's value and revision; nullopt when the key is missing or was deleted.
struct kv_value {
  std::string value;
  std::uint64_t revision = 0;
};
[[nodiscard]] std::optional<kv_value> kv_get(kvStore* kv, const std::string& key);

/// The bytes of a message.
[[nodiscard]] std::span<const std::byte> message_bytes(natsMsg* message) noexcept;
[[nodiscard]] std::string_view message_text(natsMsg* message) noexcept;

/// The last message on `subject` of `stream`, or null when there is none (or no such stream).
[[nodiscard]] message_ptr last_message(jsCtx* js, std::string_view stream,
                                       std::string_view subject);

/// Direct gets (JetStream's DIRECT.GET: the payload as stored, no base64 in JSON; answered by
/// any replica, the fleet's streams allow direct gets) over one subscription of its own, made
/// once and kept across reconnects. A get gives up as soon as the connection is lost (its
/// request is lost with it: waiting out a timeout scaled for a large bundle would hold a node
/// back long after the server is back). A get that timed out stays outstanding: the next get of
/// the same subject waits for its answer instead of asking again, since every request asked
/// again queues one more whole copy on a server that is already late; it is asked again once it
/// is two of its waits old (a replica that died with it). One thread uses it.
class direct_getter {
 public:
  explicit direct_getter(natsConnection* connection);

  /// The last message on `subject` of `stream` (JetStream API under `api_prefix`; empty:
  /// "$JS.API"), or null when there is none; waits at most `wait`.
  /// @throws cubridge::error: fleet_errc::unreachable when not connected or the connection was
  ///         lost during the get; fleet_errc::nats_failed on a timeout, no responders or a
  ///         refusal (its status and description).
  [[nodiscard]] message_ptr last_message(std::string_view api_prefix, std::string_view stream,
                                         std::string_view subject, std::chrono::milliseconds wait);
  /// The first message on `subject` of `stream` at or after stream sequence `from` (1: the
  /// first), or null when there is none; its sequence is message_sequence(). Throws as
  /// last_message.
  [[nodiscard]] message_ptr next_message(std::string_view api_prefix, std::string_view stream,
                                         std::string_view subject, std::uint64_t from,
                                         std::chrono::milliseconds wait);

 private:
  [[nodiscard]] message_ptr get(const std::string& api_subject, const std::string& body,
                                const std::string& involved, std::chrono::milliseconds wait);
  struct outstanding {
    std::string api_subject;
    std::string body;
    std::string reply;
    std::uint64_t reconnects = 0;
    std::chrono::steady_clock::time_point sent;
  };
  [[nodiscard]] std::uint64_t reconnects() const;

  natsConnection* connection_;
  std::string inbox_;
  subscription_ptr subscription_;
  statistics_ptr statistics_;
  std::uint64_t serial_ = 0;
  std::optional<outstanding> pending_;
};

/// The stream sequence of a message a direct get returned (its Nats-Sequence header); 0 when it
/// has none.
[[nodiscard]] std::uint64_t message_sequence(natsMsg* message) noexcept;

/// The subjects of `stream` that match `filter` ("cubridge.heartbeat.>"), each holding at least
/// one message; empty when the stream does not exist.
[[nodiscard]] std::vector<std::string> stream_subjects(jsCtx* js, std::string_view stream,
                                                       std::string_view filter);

/// Removes every message on `subject` from `stream`.
void purge_subject(jsCtx* js, std::string_view stream, std::string_view subject);

/// Publishes `data` on `subject` through JetStream and waits at most `wait` for the stream's
/// ack; `message_id`, when not empty, makes a retry within the stream's duplicate window a
/// no-op (JetStream de-duplication).
/// @throws cubridge::error (fleet_errc::oversized) before sending anything when `data` is over
///         the connection's max payload; otherwise as check().
void publish(jsCtx* js, natsConnection* connection, std::string_view subject,
             std::span<const std::byte> data, std::string_view what,
             std::string_view message_id = {},
             std::chrono::milliseconds wait = std::chrono::seconds(5));

}  // namespace cubridge::fleet::detail
