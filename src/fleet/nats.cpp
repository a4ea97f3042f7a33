#include "fleet/nats.hpp"

#include <cubridge/fleet/subjects.hpp>

#include <algorithm>
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
  if (!detail.empty() && detail != natsStatus_GetText(status)) text += ": " + std::string(detail);
  if (js_code != 0) text += " (JetStream error " + std::to_string(static_cast<int>(js_code)) + ")";
  return text;
}

int64_t custom_reconnect_delay(natsConnection*, int attempts, void*) {
  return reconnect_delay(attempts).count();
}

// Given to natsOptions_SetRetryOnFailedConnect so that connect returns at once while the
// library keeps trying (a null callback would make natsConnection_Connect block).
void on_late_connect(natsConnection*, void*) {}

// What docs/fleet.md says one stream is.
struct stream_spec {
  std::string name;
  std::vector<std::string> subjects;
  int64_t max_msgs_per_subject = 1;
  int64_t max_age_ns = 0;  // 0: no limit
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

void refuse_if_different(const stream_spec& spec, const jsStreamInfo& info) {
  const auto diff = differences(spec, *info.Config);
  if (!diff.empty())
    fail(fleet_errc::config_mismatch,
         "exists with another configuration than docs/fleet.md's: " + diff +
             " (delete it or fix it by hand)",
         "ensure stream", "stream " + spec.name);
}

void ensure_stream(jsCtx* js, const stream_spec& spec) {
  if (auto info = find_stream(js, spec.name)) return refuse_if_different(spec, *info);
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
  jsStreamInfo* made = nullptr;
  jsErrCode js_code = static_cast<jsErrCode>(0);
  const auto status = js_AddStream(&made, js, &config, nullptr, &js_code);
  stream_info_ptr owned(made);
  if (status == NATS_OK) return refuse_if_different(spec, *owned);
  // Made by someone else meanwhile (another node starting): check theirs.
  if (js_code == JSStreamNameExistErr)
    if (auto info = find_stream(js, spec.name)) return refuse_if_different(spec, *info);
  check(status, "js_AddStream", "stream " + spec.name, js_code);
}

constexpr int desired_history = 8;

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

std::chrono::milliseconds reconnect_delay(int attempt) noexcept {
  constexpr int64_t first = 250, longest = 2000;
  const int doublings = std::clamp(attempt - 1, 0, 3);
  const int64_t base = std::min(longest, first << doublings);
  thread_local std::minstd_rand random{std::random_device{}()};
  const int64_t jitter = std::uniform_int_distribution<int64_t>(0, base / 4)(random);
  return std::chrono::milliseconds(std::min(longest, base + jitter));
}

options_ptr make_options(const connect_options& options) {
  natsOptions* raw = nullptr;
  check(natsOptions_Create(&raw), "natsOptions_Create", options.url);
  options_ptr owned(raw);
  const std::string involved = "connecting to " + options.url;
  check(natsOptions_SetURL(raw, options.url.c_str()), "natsOptions_SetURL", involved);
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

connection_ptr connect(natsOptions* options, std::string_view url) {
  natsConnection* raw = nullptr;
  const auto status = natsConnection_Connect(&raw, options);
  connection_ptr owned(raw);
  if (status == NATS_NOT_YET_CONNECTED && owned) return owned;  // retrying in the background
  if (status == NATS_TIMEOUT || status == NATS_IO_ERROR)
    fail(fleet_errc::unreachable, describe(status, static_cast<jsErrCode>(0)),
         "natsConnection_Connect", "connecting to " + std::string(url));
  check(status, "natsConnection_Connect", "connecting to " + std::string(url));
  return owned;
}

connection_ptr connect(const connect_options& options) {
  const auto native = make_options(options);
  return connect(native.get(), options.url);
}

jetstream_ptr jetstream(natsConnection* connection, std::chrono::milliseconds wait) {
  jsOptions options;
  check(jsOptions_Init(&options), "jsOptions_Init", "JetStream");
  options.Wait = wait.count();
  jsCtx* raw = nullptr;
  check(natsConnection_JetStream(&raw, connection, &options), "natsConnection_JetStream",
        "JetStream");
  return jetstream_ptr(raw);
}

void ensure_bundle_stream(jsCtx* js, std::string_view module) {
  const std::string name = bundle_stream(module);
  const std::string bundles = "cubridge.bundle." + std::string(module) + ".>";
  ensure_stream(js, {name, {bundles, rollback_subject(module)}, 1, 0});
}

void ensure_result_stream(jsCtx* js) {
  ensure_stream(js, {std::string(result_stream), {"cubridge.result.>"}, 64, 0});
}

void ensure_heartbeat_stream(jsCtx* js) {
  constexpr int64_t hour_ns = int64_t{3600} * 1000 * 1000 * 1000;
  ensure_stream(js, {std::string(heartbeat_stream), {"cubridge.heartbeat.>"}, 1, hour_ns});
}

kv_store_ptr ensure_desired_bucket(jsCtx* js) {
  const std::string bucket(desired_bucket);
  // A bucket is the stream KV_<bucket>: its history is max_msgs_per_subject.
  const stream_spec spec{"KV_" + bucket, {"$KV." + bucket + ".>"}, desired_history, 0};
  if (auto info = find_stream(js, spec.name)) {
    refuse_if_different(spec, *info);
  } else {
    kvConfig config;
    check(kvConfig_Init(&config), "kvConfig_Init", "bucket " + bucket);
    config.Bucket = bucket.c_str();
    config.History = desired_history;
    config.StorageType = js_FileStorage;
    kvStore* made = nullptr;
    const auto status = js_CreateKeyValue(&made, js, &config);
    kv_store_ptr owned(made);
    if (status == NATS_OK) return owned;
    if (!find_stream(js, spec.name)) check(status, "js_CreateKeyValue", "bucket " + bucket);
  }
  kvStore* bound = nullptr;
  check(js_KeyValue(&bound, js, bucket.c_str()), "js_KeyValue", "bucket " + bucket);
  return kv_store_ptr(bound);
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
             std::span<const std::byte> data, std::string_view what) {
  const std::string subject_name(subject);
  const int64_t limit = natsConnection_GetMaxPayload(connection);
  if (limit > 0 && data.size() > static_cast<std::uint64_t>(limit))
    fail(fleet_errc::oversized,
         std::string(what) + " of " + std::to_string(data.size()) +
             " bytes is over the server's largest message, " + std::to_string(limit) +
             " bytes (its max_payload; docs/fleet.md, Payload limits)",
         "publish", "subject " + subject_name);
  jsPubAck* ack = nullptr;
  jsErrCode js_code = static_cast<jsErrCode>(0);
  const auto status = js_Publish(&ack, js, subject_name.c_str(), data.data(),
                                 static_cast<int>(data.size()), nullptr, &js_code);
  pub_ack_ptr owned(ack);
  check(status, "js_Publish", std::string(what) + " on subject " + subject_name, js_code);
}

}  // namespace cubridge::fleet::detail
