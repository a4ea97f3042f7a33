#pragma once
// Raw libnats for the bus tests (test_fleet_bus_security, test_fleet_cluster): owning handles, a
// connection made as a node, the operator or a stranger would make it (user and password, TLS
// with a CA or none, a server list), the server's asynchronous errors kept (permission
// violations arrive that way), and the operator's set-up of the fleet's streams and bucket with
// the names of fleet/subjects.hpp. Nothing of src/fleet/: the tests see the bus as the server
// sees it.
#include <cubridge/fleet/subjects.hpp>

#include <gtest/gtest.h>
#include <nats/nats.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace cubridge::testing {

struct nats_free {
  void operator()(natsConnection* p) const noexcept { natsConnection_Destroy(p); }
  void operator()(natsOptions* p) const noexcept { natsOptions_Destroy(p); }
  void operator()(jsCtx* p) const noexcept { jsCtx_Destroy(p); }
  void operator()(kvStore* p) const noexcept { kvStore_Destroy(p); }
  void operator()(kvEntry* p) const noexcept { kvEntry_Destroy(p); }
  void operator()(kvWatcher* p) const noexcept { kvWatcher_Destroy(p); }
  void operator()(natsMsg* p) const noexcept { natsMsg_Destroy(p); }
  void operator()(natsSubscription* p) const noexcept { natsSubscription_Destroy(p); }
  void operator()(jsStreamInfo* p) const noexcept { jsStreamInfo_Destroy(p); }
  void operator()(jsPubAck* p) const noexcept { jsPubAck_Destroy(p); }
};
template <class T>
using nats_owned = std::unique_ptr<T, nats_free>;

/// What the server said asynchronously (-ERR lines: "Permissions Violation for Publish to ...").
class async_errors {
 public:
  void add(std::string text) {
    std::lock_guard lock(mutex_);
    texts_.push_back(std::move(text));
  }
  /// Whether one error so far holds `part`.
  [[nodiscard]] bool has(std::string_view part) const {
    std::lock_guard lock(mutex_);
    for (const auto& text : texts_)
      if (text.find(part) != std::string::npos) return true;
    return false;
  }
  [[nodiscard]] std::string all() const {
    std::lock_guard lock(mutex_);
    std::string joined;
    for (const auto& text : texts_) joined += text + "\n";
    return joined;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> texts_;
};

/// How to connect.
struct connect_request {
  std::vector<std::string> urls;
  std::string user, password;  // none when empty
  std::filesystem::path ca;    // given: TLS, the server verified against this CA
  bool secure = false;         // TLS even without a CA (the system's trust store)
  int max_reconnect = 0;       // reconnect attempts (100 ms apart) after a server went
};

/// A connection, or why there is none.
struct nats_client {
  natsStatus status = NATS_ERR;
  std::string error;  // libnats's last error when status is not NATS_OK
  std::unique_ptr<async_errors> errors = std::make_unique<async_errors>();
  nats_owned<natsConnection> connection;

  [[nodiscard]] bool connected() const { return status == NATS_OK && connection != nullptr; }
  [[nodiscard]] natsConnection* get() const { return connection.get(); }
};

inline void keep_async_error(natsConnection* nc, natsSubscription*, natsStatus err, void* closure) {
  const char* text = nullptr;
  (void)natsConnection_GetLastError(nc, &text);
  static_cast<async_errors*>(closure)->add(std::string(natsStatus_GetText(err)) + ": " +
                                           (text ? text : ""));
}

/// Connects (one attempt per server, 10 s timeout each: bcrypt on a loaded machine).
[[nodiscard]] inline nats_client connect_to(const connect_request& request) {
  nats_client client;
  natsOptions* raw = nullptr;
  if (natsOptions_Create(&raw) != NATS_OK) return client;
  const nats_owned<natsOptions> options(raw);
  std::vector<const char*> urls;
  for (const auto& url : request.urls) urls.push_back(url.c_str());
  natsStatus s = natsOptions_SetServers(options.get(), urls.data(), static_cast<int>(urls.size()));
  if (s == NATS_OK) s = natsOptions_SetTimeout(options.get(), 10000);
  if (s == NATS_OK) s = natsOptions_SetMaxReconnect(options.get(), request.max_reconnect);
  if (s == NATS_OK) s = natsOptions_SetReconnectWait(options.get(), 100);
  if (s == NATS_OK)
    s = natsOptions_SetErrorHandler(options.get(), keep_async_error, client.errors.get());
  if (s == NATS_OK && !request.user.empty())
    s = natsOptions_SetUserInfo(options.get(), request.user.c_str(), request.password.c_str());
  if (s == NATS_OK && (request.secure || !request.ca.empty()))
    s = natsOptions_SetSecure(options.get(), true);
  if (s == NATS_OK && !request.ca.empty())
    s = natsOptions_LoadCATrustedCertificates(options.get(), request.ca.c_str());
  natsConnection* connection = nullptr;
  if (s == NATS_OK) s = natsConnection_Connect(&connection, options.get());
  client.status = s;
  client.connection.reset(connection);
  if (s != NATS_OK) {
    const char* last = nats_GetLastError(nullptr);
    client.error = std::string(natsStatus_GetText(s)) + (last ? std::string(": ") + last : "");
  }
  return client;
}

/// A JetStream context waiting `wait_ms` for each answer (20 s: only a loaded machine waits that
/// long); `prefix` the API prefix (none: "$JS.API").
[[nodiscard]] inline nats_owned<jsCtx> jetstream(natsConnection* connection,
                                                 std::int64_t wait_ms = 20000,
                                                 const char* prefix = nullptr) {
  jsOptions options;
  jsOptions_Init(&options);
  options.Wait = wait_ms;
  if (prefix) options.Prefix = prefix;
  jsCtx* js = nullptr;
  EXPECT_EQ(natsConnection_JetStream(&js, connection, &options), NATS_OK);
  return nats_owned<jsCtx>(js);
}

/// The module the tests roll out.
inline constexpr std::string_view test_module = "m";

/// Adds a stream as the control side makes the fleet's (file storage, AllowDirect).
inline natsStatus add_stream(jsCtx* js, const std::string& name, const std::string& subjects,
                             std::int64_t per_subject, int replicas, jsErrCode* code = nullptr) {
  jsStreamConfig config;
  jsStreamConfig_Init(&config);
  config.Name = name.c_str();
  const char* subject = subjects.c_str();
  config.Subjects = &subject;
  config.SubjectsLen = 1;
  config.Storage = js_FileStorage;
  config.MaxMsgsPerSubject = per_subject;
  config.Replicas = replicas;
  config.AllowDirect = true;
  jsStreamInfo* info = nullptr;
  jsErrCode ignored = static_cast<jsErrCode>(0);
  const auto s = js_AddStream(&info, js, &config, nullptr, code ? code : &ignored);
  jsStreamInfo_Destroy(info);
  return s;
}

/// Adds the control bucket (history 16).
inline natsStatus add_bucket(jsCtx* js, int replicas, nats_owned<kvStore>* bound = nullptr) {
  kvConfig config;
  kvConfig_Init(&config);
  const std::string bucket(fleet::control_bucket);
  config.Bucket = bucket.c_str();
  config.History = 16;
  config.StorageType = js_FileStorage;
  config.Replicas = replicas;
  kvStore* kv = nullptr;
  const auto s = js_CreateKeyValue(&kv, js, &config);
  if (bound)
    bound->reset(kv);
  else
    kvStore_Destroy(kv);
  return s;
}

/// Everything the operator makes: the bucket with `desired.m` and `registry`, the bundle stream
/// of module m with one bundle, the results and heartbeats streams.
inline void set_up_fleet(jsCtx* js, int replicas = 1) {
  const std::string m(test_module);
  ASSERT_EQ(add_stream(js, fleet::bundle_stream(m), fleet::bundle_subjects(m), 1, replicas),
            NATS_OK);
  ASSERT_EQ(add_stream(js, std::string(fleet::result_stream), "cubridge.result.>", 16, replicas),
            NATS_OK);
  ASSERT_EQ(
      add_stream(js, std::string(fleet::heartbeat_stream), "cubridge.heartbeat.>", 1, replicas),
      NATS_OK);
  nats_owned<kvStore> kv;
  ASSERT_EQ(add_bucket(js, replicas, &kv), NATS_OK);
  std::uint64_t revision = 0;
  ASSERT_EQ(kvStore_PutString(&revision, kv.get(), fleet::desired_key(m).c_str(), "desired v1"),
            NATS_OK);
  ASSERT_EQ(kvStore_PutString(&revision, kv.get(), std::string(fleet::registry_key).c_str(),
                              "registry r1"),
            NATS_OK);
  jsPubAck* ack = nullptr;
  jsErrCode code = static_cast<jsErrCode>(0);
  const std::string bundle = "bundle v1";
  ASSERT_EQ(js_Publish(&ack, js, fleet::bundle_subject(m, 1, std::string(64, 'a')).c_str(),
                       bundle.data(), static_cast<int>(bundle.size()), nullptr, &code),
            NATS_OK)
      << "JetStream error " << code;
  jsPubAck_Destroy(ack);
}

/// The subject of the bundle set_up_fleet publishes.
[[nodiscard]] inline std::string test_bundle_subject() {
  return fleet::bundle_subject(test_module, 1, std::string(64, 'a'));
}

/// The last message of `subject` in `stream` as text; empty when there is none.
[[nodiscard]] inline std::string last_text(jsCtx* js, const std::string& stream,
                                           const std::string& subject) {
  natsMsg* raw = nullptr;
  jsErrCode code = static_cast<jsErrCode>(0);
  if (js_GetLastMsg(&raw, js, stream.c_str(), subject.c_str(), nullptr, &code) != NATS_OK)
    return {};
  const nats_owned<natsMsg> message(raw);
  return std::string(natsMsg_GetData(raw), static_cast<std::size_t>(natsMsg_GetDataLength(raw)));
}

/// The last message on `subject` of `stream` as text, by a direct get (as the agent fetches a
/// bundle); empty when there is none or the get was refused.
[[nodiscard]] inline std::string direct_text(jsCtx* js, const std::string& stream,
                                             const std::string& subject) {
  jsDirectGetMsgOptions by_subject;
  jsDirectGetMsgOptions_Init(&by_subject);
  by_subject.LastBySubject = subject.c_str();
  natsMsg* raw = nullptr;
  if (js_DirectGetMsg(&raw, js, stream.c_str(), nullptr, &by_subject) != NATS_OK) return {};
  const nats_owned<natsMsg> message(raw);
  return std::string(natsMsg_GetData(raw), static_cast<std::size_t>(natsMsg_GetDataLength(raw)));
}

/// The value of `key` in the control bucket as text; empty when there is none.
[[nodiscard]] inline std::string kv_text(kvStore* kv, const std::string& key) {
  kvEntry* raw = nullptr;
  if (kvStore_Get(&raw, kv, key.c_str()) != NATS_OK) return {};
  const nats_owned<kvEntry> entry(raw);
  return std::string(kvEntry_ValueString(raw));
}

}  // namespace cubridge::testing
