#include "fleet/nats.hpp"

#include <cubridge/core/error.hpp>
#include <cubridge/fleet/signed_record.hpp>
#include <cubridge/fleet/subjects.hpp>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>
#include <random>
#include <vector>

namespace cubridge::fleet::detail {
namespace {

bool is_connection_lost(natsStatus status) {
  return status == NATS_NO_SERVER || status == NATS_CONNECTION_CLOSED ||
         status == NATS_CONNECTION_DISCONNECTED || status == NATS_NOT_YET_CONNECTED ||
         status == NATS_STALE_CONNECTION;
}

// "No server available for connection (status 4); <libnats's last error> (JetStream 10059)".
std::string describe(natsStatus status, jsErrCode js_code) {
  std::string text = natsStatus_GetText(status);
  text += " (status " + std::to_string(static_cast<int>(status)) + ")";
  natsStatus last = NATS_OK;
  const char* raw = nats_GetLastError(&last);
  std::string_view detail = raw ? raw : "";
  // libnats writes "(conn.c:2088): No server available...": the text without where it is.
  if (detail.starts_with('('))
    if (const auto end = detail.find("): "); end != std::string_view::npos)
      detail.remove_prefix(end + 3);
  if (!detail.empty() && detail != natsStatus_GetText(status))
    text += ": " + redact_server_list(detail);
  if (js_code != 0) text += " (JetStream error " + std::to_string(static_cast<int>(js_code)) + ")";
  return text;
}

int64_t custom_reconnect_delay(natsConnection*, int attempts, void*) {
  return reconnect_delay(attempts).count();
}

// Given to natsOptions_SetRetryOnFailedConnect so that connect returns at once while the
// library keeps trying (a null callback would make natsConnection_Connect block).
void on_late_connect(natsConnection*, void*) {}

// What docs/fleet.md says one stream is. The limits bound what any one identity can make the
// server hold: messages per subject, messages and bytes in all, the largest message, an age.
// JetStream reserves max_bytes on every replica's store up front: kept modest.
struct stream_spec {
  std::string name;
  std::vector<std::string> subjects;
  int64_t max_msgs_per_subject = 1;
  int64_t max_age_ns = 0;  // 0: no limit
  int64_t max_msgs = -1;
  int64_t max_bytes = -1;
  int32_t max_msg_size = -1;
  int replicas = 1;
};

std::string storage_name(jsStorageType storage) {
  return storage == js_FileStorage ? "file" : "memory";
}

std::string retention_name(jsRetentionPolicy retention) {
  switch (retention) {
    case js_LimitsPolicy:
      return "limits";
    case js_InterestPolicy:
      return "interest";
    case js_WorkQueuePolicy:
      return "workqueue";
  }
  return "unknown";
}

std::string join(std::vector<std::string> items) {
  std::sort(items.begin(), items.end());
  std::string text;
  for (const auto& item : items) text += (text.empty() ? "" : ",") + item;
  return text;
}

// Each field of `have` that is not what `spec` asks: "max_msgs_per_subject 1, wanted 64; ...".
std::string differences(const stream_spec& spec, const jsStreamConfig& have) {
  std::string out;
  const auto add = [&out](const std::string& field, const std::string& is,
                          const std::string& wanted) {
    if (is != wanted) out += (out.empty() ? "" : "; ") + field + " " + is + ", wanted " + wanted;
  };
  std::vector<std::string> subjects;
  subjects.reserve(static_cast<std::size_t>(std::max(have.SubjectsLen, 0)));
  for (int i = 0; i < have.SubjectsLen; ++i) subjects.emplace_back(have.Subjects[i]);
  add("subjects", join(subjects), join(spec.subjects));
  add("max_msgs_per_subject", std::to_string(have.MaxMsgsPerSubject),
      std::to_string(spec.max_msgs_per_subject));
  add("max_age_ns", std::to_string(have.MaxAge), std::to_string(spec.max_age_ns));
  add("max_msgs", std::to_string(have.MaxMsgs), std::to_string(spec.max_msgs));
  add("max_bytes", std::to_string(have.MaxBytes), std::to_string(spec.max_bytes));
  add("max_msg_size", std::to_string(have.MaxMsgSize), std::to_string(spec.max_msg_size));
  add("replicas", std::to_string(std::max<int64_t>(have.Replicas, 1)),
      std::to_string(spec.replicas));
  add("storage", storage_name(have.Storage), storage_name(js_FileStorage));
  add("retention", retention_name(have.Retention), retention_name(js_LimitsPolicy));
  return out;
}

// The stream's info, or null when it does not exist.
stream_info_ptr find_stream(jsCtx* js, const std::string& name) {
  jsStreamInfo* info = nullptr;
  jsErrCode js_code = static_cast<jsErrCode>(0);
  const auto status = js_GetStreamInfo(&info, js, name.c_str(), nullptr, &js_code);
  if (status == NATS_NOT_FOUND) return nullptr;
  check(status, "js_GetStreamInfo", "stream " + name, js_code);
  return stream_info_ptr(info);
}

// Empty when `info` is what `spec` asks; else "stream X: field a, wanted b; ...".
std::string mismatch_of(const stream_spec& spec, const jsStreamInfo& info) {
  const auto diff = differences(spec, *info.Config);
  return diff.empty() ? diff : "stream " + spec.name + " is configured otherwise: " + diff;
}

std::string ensure_stream(jsCtx* js, const stream_spec& spec) {
  if (auto info = find_stream(js, spec.name)) return mismatch_of(spec, *info);
  std::vector<const char*> subjects;
  subjects.reserve(spec.subjects.size());
  for (const auto& s : spec.subjects) subjects.push_back(s.c_str());
  jsStreamConfig config;
  jsStreamConfig_Init(&config);
  config.Name = spec.name.c_str();
  config.Subjects = subjects.data();
  config.SubjectsLen = static_cast<int>(subjects.size());
  config.Storage = js_FileStorage;
  config.Retention = js_LimitsPolicy;
  config.MaxMsgsPerSubject = spec.max_msgs_per_subject;
  config.MaxAge = spec.max_age_ns;
  config.MaxMsgs = spec.max_msgs;
  config.MaxBytes = spec.max_bytes;
  config.MaxMsgSize = spec.max_msg_size;
  config.Replicas = spec.replicas;
  config.AllowDirect = true;  // gets of the last message per subject are answered by replicas too
  jsStreamInfo* made = nullptr;
  jsErrCode js_code = static_cast<jsErrCode>(0);
  const auto status = js_AddStream(&made, js, &config, nullptr, &js_code);
  stream_info_ptr owned(made);
  if (status == NATS_OK) return mismatch_of(spec, *owned);
  // Made by someone else meanwhile (another operator command): check theirs.
  if (js_code == JSStreamNameExistErr || js_code == JSStreamSubjectOverlapErr)
    if (auto info = find_stream(js, spec.name)) return mismatch_of(spec, *info);
  check(status, "js_AddStream", "stream " + spec.name, js_code);
  return {};
}

constexpr int control_history = 16;
constexpr int64_t day_ns = int64_t{86400} * 1000 * 1000 * 1000;
// The largest record or heartbeat a node publishes (records.hpp: 64 KiB of body, signed).
constexpr int32_t max_record_message = 256 << 10;
// Results kept per module and node: only the newest is read; a few more for an operator's look.
constexpr int64_t results_kept = 4;
// What results streams of cubridge 0.1.0 stored: every module token, one limit for all nodes.
constexpr std::string_view legacy_result_subjects = "cubridge.result.>";
// Versions of a module kept for refetching (rollback targets and the history).
constexpr int64_t bundles_kept = 32;

}  // namespace

void check(natsStatus status, std::string_view call, std::string_view involved, jsErrCode js_code,
           std::source_location where) {
  if (status == NATS_OK) return;
  fail(is_connection_lost(status) ? fleet_errc::unreachable : fleet_errc::nats_failed,
       describe(status, js_code), call, involved, where);
}

void fail(fleet_errc code, std::string description, std::string_view call,
          std::string_view involved, std::source_location where) {
  throw error(fleet_error_domain, static_cast<int>(code), std::move(description), std::string(call),
              std::string(involved), where);
}

std::chrono::milliseconds jittered_backoff(int attempt, std::chrono::milliseconds first,
                                           std::chrono::milliseconds longest) noexcept {
  auto delay = std::max(first, std::chrono::milliseconds(1));
  for (int i = 1; i < attempt && delay < longest; ++i) delay *= 2;
  delay = std::min(delay, longest);
  thread_local std::minstd_rand random{std::random_device{}()};
  return delay + std::chrono::milliseconds(
                     std::uniform_int_distribution<int64_t>(0, delay.count() / 2)(random));
}

std::chrono::milliseconds reconnect_delay(int attempt) noexcept {
  return jittered_backoff(attempt, std::chrono::milliseconds(250), std::chrono::seconds(2));
}

options_ptr make_options(const connect_options& options) {
  const auto servers = parse_server_list(options.bus.servers);
  natsOptions* raw = nullptr;
  check(natsOptions_Create(&raw), "natsOptions_Create", "options");
  options_ptr owned(raw);
  const std::string involved = "connecting to " + redact_server_list(options.bus.servers);
  std::vector<const char*> urls;
  bool tls = !options.bus.ca_file.empty();
  for (const auto& url : servers) {
    urls.push_back(url.c_str());
    tls = tls || url.starts_with("tls://");
  }
  check(natsOptions_SetServers(raw, urls.data(), static_cast<int>(urls.size())),
        "natsOptions_SetServers", involved);
  // The list in the order given: the first that answers is used, as documented.
  check(natsOptions_SetNoRandomize(raw, true), "natsOptions_SetNoRandomize", involved);
  if (!options.bus.credentials.empty()) {
    const auto credentials = read_credentials_file(options.bus.credentials);
    check(natsOptions_SetUserInfo(raw, credentials.user.c_str(), credentials.password.c_str()),
          "natsOptions_SetUserInfo", involved);
  }
  if (tls) {
    check(natsOptions_SetSecure(raw, true), "natsOptions_SetSecure", involved);
    if (!options.bus.ca_file.empty() && ::access(options.bus.ca_file.c_str(), R_OK) != 0)
      cubridge::detail::throw_errc(
          errc::io, "read CA file",
          "'" + options.bus.ca_file.string() + "' cannot be read: " + std::strerror(errno));
    if (!options.bus.ca_file.empty())
      check(natsOptions_LoadCATrustedCertificates(raw, options.bus.ca_file.c_str()),
            "natsOptions_LoadCATrustedCertificates", "CA file " + options.bus.ca_file.string());
  }
  if (!options.name.empty())
    check(natsOptions_SetName(raw, options.name.c_str()), "natsOptions_SetName", involved);
  check(natsOptions_SetTimeout(raw, options.connect_timeout.count()), "natsOptions_SetTimeout",
        involved);
  check(natsOptions_SetAllowReconnect(raw, options.reconnect), "natsOptions_SetAllowReconnect",
        involved);
  check(natsOptions_SetMaxReconnect(raw, -1), "natsOptions_SetMaxReconnect", involved);
  check(natsOptions_SetCustomReconnectDelay(raw, custom_reconnect_delay, nullptr),
        "natsOptions_SetCustomReconnectDelay", involved);
  if (options.retry_on_failed_connect)
    check(natsOptions_SetRetryOnFailedConnect(raw, true, on_late_connect, nullptr),
          "natsOptions_SetRetryOnFailedConnect", involved);
  return owned;
}

connection_ptr connect(natsOptions* options, std::string_view servers) {
  natsConnection* raw = nullptr;
  const auto status = natsConnection_Connect(&raw, options);
  connection_ptr owned(raw);
  const std::string involved = "connecting to " + redact_server_list(servers);
  if (status == NATS_NOT_YET_CONNECTED && owned) return owned;  // retrying in the background
  if (status == NATS_TIMEOUT || status == NATS_IO_ERROR || status == NATS_NO_SERVER)
    fail(fleet_errc::unreachable, describe(status, static_cast<jsErrCode>(0)),
         "natsConnection_Connect", involved);
  if (status == NATS_NOT_PERMITTED || status == NATS_SSL_ERROR ||
      status == NATS_SECURE_CONNECTION_REQUIRED || status == NATS_SECURE_CONNECTION_WANTED ||
      status == NATS_CONNECTION_AUTH_FAILED)
    fail(fleet_errc::refused, describe(status, static_cast<jsErrCode>(0)), "natsConnection_Connect",
         involved);
  check(status, "natsConnection_Connect", involved);
  return owned;
}

namespace {
connection_ptr connect_once(const connect_options& options);
}  // namespace

connection_ptr connect(const connect_options& options) {
  // A hung server (its port takes the connection and never answers) costs a whole connect
  // timeout before the next of the list is tried: the list is tried first with a short timeout
  // per server, then again with the full one, so one hung server of several costs
  // quick_connect_timeout, not connect_timeout.
  if (!options.retry_on_failed_connect && options.connect_timeout > quick_connect_timeout &&
      parse_server_list(options.bus.servers).size() > 1) {
    auto quick = options;
    quick.connect_timeout = quick_connect_timeout;
    try {
      return connect_once(quick);
    } catch (const error& e) {
      if (!e.is(fleet_errc::unreachable)) throw;
    }
  }
  return connect_once(options);
}

namespace {
connection_ptr connect_once(const connect_options& options) {
  const auto native = make_options(options);
  try {
    return connect(native.get(), options.bus.servers);
  } catch (const error& e) {
    // The causes a new user meets, in one line instead of OpenSSL's or the server's words.
    const std::string text = e.what();
    const auto involved = "connecting to " + redact_server_list(options.bus.servers);
    if (e.is(fleet_errc::refused) && (text.find("certificate") != std::string::npos ||
                                      text.find("SSL handshake") != std::string::npos))
      fail(fleet_errc::refused,
           options.bus.ca_file.empty()
               ? "the server's TLS certificate does not verify against this machine's CAs: give "
                 "the fleet's CA (--ca, `cubridge fleet init` wrote ca.pem)"
               : "the server's TLS certificate does not verify against CA file '" +
                     options.bus.ca_file.string() + "': is it this fleet's ca.pem?",
           "natsConnection_Connect", involved);
    if (e.is(fleet_errc::refused) && text.find("Authorization") != std::string::npos)
      fail(fleet_errc::refused,
           options.bus.credentials.empty()
               ? "the server asks for credentials: give the operator's (--credentials, "
                 "`cubridge fleet init` wrote operator.creds)"
               : "the server refused the credentials in '" + options.bus.credentials.string() +
                     "' (a wrong or old password, or another fleet's file)",
           "natsConnection_Connect", involved);
    if (e.is(fleet_errc::refused) && text.find("Secure Connection") != std::string::npos)
      fail(fleet_errc::refused,
           "the server requires TLS: give tls:// URLs and the fleet's CA (--ca)",
           "natsConnection_Connect", involved);
    throw;
  }
}
}  // namespace

std::string connected_url(natsConnection* connection) {
  char buffer[512] = {};
  if (natsConnection_GetConnectedUrl(connection, buffer, sizeof buffer) != NATS_OK) return {};
  return redact_url(buffer);
}

jetstream_ptr jetstream(natsConnection* connection, std::chrono::milliseconds wait,
                        const std::string& api_prefix) {
  jsOptions options;
  check(jsOptions_Init(&options), "jsOptions_Init", "JetStream");
  options.Wait = wait.count();
  // libnats keeps the pointer until the context is made (it copies the prefix then).
  if (!api_prefix.empty()) options.Prefix = api_prefix.c_str();
  jsCtx* raw = nullptr;
  check(natsConnection_JetStream(&raw, connection, &options), "natsConnection_JetStream",
        "JetStream");
  return jetstream_ptr(raw);
}

std::string ensure_bundle_stream(jsCtx* js, std::string_view module, int replicas,
                                 std::int64_t max_payload) {
  stream_spec spec{bundle_stream(module), {bundle_subjects(module)}, 1, 0};
  spec.max_msgs = bundles_kept;
  spec.max_msg_size = static_cast<int32_t>(std::min<std::int64_t>(max_payload, INT32_MAX));
  spec.replicas = replicas;
  return ensure_stream(js, spec);
}

std::string ensure_result_stream(jsCtx* js, int replicas, std::span<const std::string> modules,
                                 const std::function<std::vector<std::string>()>& every_module) {
  // One subject per module with a desired state, none wider: a node's result for any other
  // module token is stored nowhere, so what one node can make the stream hold is bounded by
  // (modules) x results_kept x max_record_message whatever it publishes, and no discard-old
  // limit on the whole stream lets it evict another node's results (docs/fleet-security.md).
  stream_spec spec{std::string(result_stream), {}, results_kept, 7 * day_ns};
  spec.max_msg_size = max_record_message;
  spec.replicas = replicas;
  auto info = find_stream(js, spec.name);
  std::vector<std::string> wanted(modules.begin(), modules.end());
  if (info) {
    const auto& have = *info->Config;
    for (int i = 0; i < have.SubjectsLen; ++i) {
      if (std::string_view(have.Subjects[i]) != legacy_result_subjects) {
        spec.subjects.emplace_back(have.Subjects[i]);
      } else if (every_module) {  // narrowed to every module with a desired state, once
        for (auto& m : every_module()) wanted.push_back(std::move(m));
      }
    }
  }
  bool missing = false;
  for (const auto& module : wanted) {
    auto subject = result_subjects(module);
    if (std::find(spec.subjects.begin(), spec.subjects.end(), subject) != spec.subjects.end())
      continue;
    spec.subjects.push_back(std::move(subject));
    missing = true;
  }
  if (!info) return spec.subjects.empty() ? std::string() : ensure_stream(js, spec);
  std::sort(spec.subjects.begin(), spec.subjects.end());
  // A stream an older cubridge made stores cubridge.result.> with stream-wide limits: narrowed
  // to the modules and given the per-subject bound on the first write of a desired state.
  const bool outdated = info->Config->MaxBytes != spec.max_bytes ||
                        info->Config->MaxMsgsPerSubject != spec.max_msgs_per_subject ||
                        spec.subjects.size() != static_cast<std::size_t>(info->Config->SubjectsLen);
  if ((!missing && !outdated) || spec.subjects.empty()) return mismatch_of(spec, *info);
  std::vector<const char*> subjects;
  subjects.reserve(spec.subjects.size());
  for (const auto& s : spec.subjects) subjects.push_back(s.c_str());
  jsStreamConfig config = *info->Config;  // the rest as the stream has it
  config.Subjects = subjects.data();
  config.SubjectsLen = static_cast<int>(subjects.size());
  config.MaxMsgsPerSubject = spec.max_msgs_per_subject;
  config.MaxMsgs = spec.max_msgs;
  config.MaxBytes = spec.max_bytes;
  jsStreamInfo* updated = nullptr;
  jsErrCode js_code = static_cast<jsErrCode>(0);
  const auto status = js_UpdateStream(&updated, js, &config, nullptr, &js_code);
  stream_info_ptr owned(updated);
  check(status, "js_UpdateStream", "stream " + spec.name, js_code);
  return mismatch_of(spec, *owned);
}

std::string ensure_heartbeat_stream(jsCtx* js, int replicas) {
  constexpr int64_t hour_ns = int64_t{3600} * 1000 * 1000 * 1000;
  stream_spec spec{
      std::string(heartbeat_stream), {"cubridge.heartbeat.>"}, heartbeats_kept, hour_ns};
  spec.max_msg_size = max_record_message;
  spec.max_bytes = int64_t{64} << 20;
  spec.replicas = replicas;
  return ensure_stream(js, spec);
}

kv_store_ptr ensure_control_bucket(jsCtx* js, int replicas, std::string* mismatch) {
  const std::string bucket(control_bucket);
  // A bucket is the stream KV_<bucket>: its history is max_msgs_per_subject.
  stream_spec spec{
      std::string(control_bucket_stream), {"$KV." + bucket + ".>"}, control_history, 0};
  spec.replicas = replicas;
  if (auto info = find_stream(js, spec.name)) {
    // Only what a bucket's own configuration sets is compared (its other limits are the KV's).
    const auto& c = *info->Config;
    std::string diff;
    if (c.MaxMsgsPerSubject != control_history)
      diff += "history " + std::to_string(c.MaxMsgsPerSubject) + ", wanted " +
              std::to_string(control_history);
    if (mismatch && !diff.empty())
      *mismatch = "bucket " + bucket + " is configured otherwise: " + diff;
  } else {
    kvConfig config;
    check(kvConfig_Init(&config), "kvConfig_Init", "bucket " + bucket);
    config.Bucket = bucket.c_str();
    config.History = control_history;
    config.StorageType = js_FileStorage;
    config.Replicas = replicas;
    config.MaxValueSize = static_cast<int32_t>(max_signed_record_bytes);
    kvStore* made = nullptr;
    const auto status = js_CreateKeyValue(&made, js, &config);
    kv_store_ptr owned(made);
    if (status == NATS_OK) return owned;
    if (!find_stream(js, spec.name)) check(status, "js_CreateKeyValue", "bucket " + bucket);
  }
  return bind_control_bucket(js);
}

kv_store_ptr bind_control_bucket(jsCtx* js) {
  const std::string bucket(control_bucket);
  kvStore* bound = nullptr;
  check(js_KeyValue(&bound, js, bucket.c_str()), "js_KeyValue", "bucket " + bucket);
  return kv_store_ptr(bound);
}

std::optional<kv_value> kv_get(kvStore* kv, const std::string& key) {
  kvEntry* raw = nullptr;
  const auto status = kvStore_Get(&raw, kv, key.c_str());
  const kv_entry_ptr entry(raw);
  if (status == NATS_NOT_FOUND) return std::nullopt;
  check(status, "kvStore_Get", "key " + key + " of bucket " + std::string(control_bucket));
  if (kvEntry_Operation(entry.get()) != kvOp_Put) return std::nullopt;
  const auto* data = static_cast<const char*>(kvEntry_Value(entry.get()));
  return kv_value{
      std::string(data ? data : "", static_cast<std::size_t>(kvEntry_ValueLen(entry.get()))),
      kvEntry_Revision(entry.get())};
}

std::span<const std::byte> message_bytes(natsMsg* message) noexcept {
  return {reinterpret_cast<const std::byte*>(natsMsg_GetData(message)),
          static_cast<std::size_t>(natsMsg_GetDataLength(message))};
}

std::string_view message_text(natsMsg* message) noexcept {
  return {natsMsg_GetData(message), static_cast<std::size_t>(natsMsg_GetDataLength(message))};
}

message_ptr last_message(jsCtx* js, std::string_view stream, std::string_view subject) {
  natsMsg* raw = nullptr;
  jsErrCode js_code = static_cast<jsErrCode>(0);
  const std::string stream_name(stream), subject_name(subject);
  const auto status =
      js_GetLastMsg(&raw, js, stream_name.c_str(), subject_name.c_str(), nullptr, &js_code);
  message_ptr owned(raw);
  if (status == NATS_NOT_FOUND || js_code == JSStreamNotFoundErr) return nullptr;
  check(status, "js_GetLastMsg", "subject " + subject_name + " of stream " + stream_name, js_code);
  return owned;
}

direct_getter::direct_getter(natsConnection* connection) : connection_(connection) {
  natsInbox* raw_inbox = nullptr;
  check(natsInbox_Create(&raw_inbox), "natsInbox_Create", "direct gets");
  inbox_ = raw_inbox;
  natsInbox_Destroy(raw_inbox);
  natsSubscription* raw = nullptr;
  check(natsConnection_SubscribeSync(&raw, connection, (inbox_ + ".*").c_str()),
        "natsConnection_SubscribeSync", "direct gets");
  subscription_.reset(raw);
  natsStatistics* stats = nullptr;
  check(natsStatistics_Create(&stats), "natsStatistics_Create", "direct gets");
  statistics_.reset(stats);
}

std::uint64_t direct_getter::reconnects() const {
  std::uint64_t count = 0;
  if (natsConnection_GetStats(connection_, statistics_.get()) != NATS_OK ||
      natsStatistics_GetCounts(statistics_.get(), nullptr, nullptr, nullptr, nullptr, &count) !=
          NATS_OK)
    return 0;
  return count;
}

message_ptr direct_getter::last_message(std::string_view api_prefix, std::string_view stream,
                                        std::string_view subject, std::chrono::milliseconds wait) {
  const std::string api = (api_prefix.empty() ? std::string("$JS.API") : std::string(api_prefix)) +
                          ".DIRECT.GET." + std::string(stream) + "." + std::string(subject);
  return get(api, {}, "subject " + std::string(subject) + " of stream " + std::string(stream),
             wait);
}

message_ptr direct_getter::next_message(std::string_view api_prefix, std::string_view stream,
                                        std::string_view subject, std::uint64_t from,
                                        std::chrono::milliseconds wait) {
  const std::string api = (api_prefix.empty() ? std::string("$JS.API") : std::string(api_prefix)) +
                          ".DIRECT.GET." + std::string(stream);
  const std::string body = "{\"seq\":" + std::to_string(std::max<std::uint64_t>(from, 1)) +
                           ",\"next_by_subj\":\"" + std::string(subject) + "\"}";
  return get(api, body,
             "subject " + std::string(subject) + " of stream " + std::string(stream) +
                 " from sequence " + std::to_string(from),
             wait);
}

std::uint64_t message_sequence(natsMsg* message) noexcept {
  const char* text = nullptr;
  if (natsMsgHeader_Get(message, JSSequence, &text) != NATS_OK || !text) return 0;
  std::uint64_t value = 0;
  const std::string_view view(text);
  const auto [end, ec] = std::from_chars(view.data(), view.data() + view.size(), value);
  return ec == std::errc{} && end == view.data() + view.size() ? value : 0;
}

message_ptr direct_getter::get(const std::string& api, const std::string& body,
                               const std::string& involved, std::chrono::milliseconds wait) {
  using clock = std::chrono::steady_clock;
  // An answer that has not come in two of its waits is taken as lost (a replica that died
  // with the request, the connection still up) and asked for again.
  const auto longest_outstanding = 2 * wait;
  const auto lost = [&] {
    pending_.reset();
    fail(fleet_errc::unreachable, "the connection was lost during the direct get", "direct get",
         involved);
  };
  if (natsConnection_Status(connection_) != NATS_CONN_STATUS_CONNECTED) lost();
  const auto now = clock::now();
  if (pending_ &&
      (pending_->api_subject != api || pending_->body != body ||
       pending_->reconnects != reconnects() || now - pending_->sent > longest_outstanding))
    pending_.reset();
  if (!pending_) {
    outstanding request{api, body, inbox_ + "." + std::to_string(++serial_), reconnects(), now};
    check(natsConnection_PublishRequest(connection_, api.c_str(), request.reply.c_str(),
                                        body.empty() ? nullptr : body.data(),
                                        static_cast<int>(body.size())),
          "natsConnection_PublishRequest", involved);
    pending_ = std::move(request);
  }
  // The answer in slices, so that a lost connection (the request with it) is seen at once.
  constexpr std::chrono::milliseconds slice{100};
  const auto until = now + wait;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - clock::now());
    if (left.count() <= 0)
      fail(fleet_errc::nats_failed,
           "no answer within " + std::to_string(wait.count()) +
               " ms (Timeout; still awaited by the next get)",
           "direct get", involved);
    natsMsg* raw = nullptr;
    const auto status =
        natsSubscription_NextMsg(&raw, subscription_.get(), std::min(left, slice).count());
    message_ptr message(raw);
    if (status == NATS_OK) {
      // A late answer to a request given up for another subject is dropped.
      if (pending_->reply != natsMsg_GetSubject(raw)) continue;
      pending_.reset();
      if (natsMsg_IsNoResponders(raw))
        fail(fleet_errc::nats_failed, "no responders (no such stream, or it takes no direct gets)",
             "direct get", involved);
      const char* code = nullptr;
      if (natsMsg_GetDataLength(raw) == 0 && natsMsgHeader_Get(raw, "Status", &code) == NATS_OK) {
        if (std::string_view(code) == "404") return nullptr;
        const char* description = nullptr;
        (void)natsMsgHeader_Get(raw, "Description", &description);
        fail(fleet_errc::nats_failed,
             "refused: " + std::string(code) + " " + std::string(description ? description : ""),
             "direct get", involved);
      }
      return message;
    }
    if (status != NATS_TIMEOUT) check(status, "natsSubscription_NextMsg", involved);
    if (natsConnection_Status(connection_) != NATS_CONN_STATUS_CONNECTED ||
        reconnects() != pending_->reconnects)
      lost();
  }
}

std::vector<std::string> stream_subjects(jsCtx* js, std::string_view stream,
                                         std::string_view filter) {
  jsOptions options;
  check(jsOptions_Init(&options), "jsOptions_Init", "JetStream");
  const std::string stream_name(stream), filter_text(filter);
  options.Stream.Info.SubjectsFilter = filter_text.c_str();
  jsStreamInfo* raw = nullptr;
  jsErrCode js_code = static_cast<jsErrCode>(0);
  const auto status = js_GetStreamInfo(&raw, js, stream_name.c_str(), &options, &js_code);
  const stream_info_ptr info(raw);
  if (status == NATS_NOT_FOUND || js_code == JSStreamNotFoundErr) return {};
  check(status, "js_GetStreamInfo", "subjects " + filter_text + " of stream " + stream_name,
        js_code);
  std::vector<std::string> subjects;
  if (const auto* list = info->State.Subjects)
    for (int i = 0; i < list->Count; ++i)
      if (list->List[i].Msgs > 0) subjects.emplace_back(list->List[i].Subject);
  std::sort(subjects.begin(), subjects.end());
  return subjects;
}

void purge_subject(jsCtx* js, std::string_view stream, std::string_view subject) {
  jsOptions options;
  check(jsOptions_Init(&options), "jsOptions_Init", "JetStream");
  const std::string stream_name(stream), subject_name(subject);
  options.Stream.Purge.Subject = subject_name.c_str();
  jsErrCode js_code = static_cast<jsErrCode>(0);
  check(js_PurgeStream(js, stream_name.c_str(), &options, &js_code), "js_PurgeStream",
        "subject " + subject_name + " of stream " + stream_name, js_code);
}

void publish(jsCtx* js, natsConnection* connection, std::string_view subject,
             std::span<const std::byte> data, std::string_view what, std::string_view message_id,
             std::chrono::milliseconds wait) {
  const std::string subject_name(subject);
  const int64_t limit = natsConnection_GetMaxPayload(connection);
  if (limit > 0 && data.size() > static_cast<std::uint64_t>(limit))
    fail(fleet_errc::oversized,
         std::string(what) + " of " + std::to_string(data.size()) +
             " bytes is over the server's largest message, " + std::to_string(limit) +
             " bytes (its max_payload; docs/fleet.md, Payload limits)",
         "publish", "subject " + subject_name);
  jsPubOptions options;
  check(jsPubOptions_Init(&options), "jsPubOptions_Init", "publish");
  options.MaxWait = wait.count();
  const std::string id(message_id);
  if (!id.empty()) options.MsgId = id.c_str();
  jsPubAck* ack = nullptr;
  jsErrCode js_code = static_cast<jsErrCode>(0);
  const auto status = js_Publish(&ack, js, subject_name.c_str(), data.data(),
                                 static_cast<int>(data.size()), &options, &js_code);
  pub_ack_ptr owned(ack);
  check(status, "js_Publish", std::string(what) + " on subject " + subject_name, js_code);
}

}  // namespace cubridge::fleet::detail
