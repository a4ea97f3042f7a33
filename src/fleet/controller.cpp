// The control side's connection (controller.hpp): the bucket and compare-and-set, bundles stored
// by module, version and digest, enrolment, and reading what the nodes report (every record
// verified with the key the registry holds for the node its subject names). The publish, canary
// and rollback policies are in rollout.cpp.
#include "fleet/controller_impl.hpp"

#include <cubridge/core/detail/printable.hpp>
#include <cubridge/fleet/signed_record.hpp>
#include <cubridge/fleet/subjects.hpp>

#include <algorithm>
#include <thread>

#include <cubridge/bundle/detail/signing.hpp>

namespace cubridge::fleet {
namespace {

using steady = std::chrono::steady_clock;

void count_refusal(read_report* report, const std::string& reason) {
  if (!report) return;
  if (report->refused.size() < 64 || report->refused.contains(reason)) ++report->refused[reason];
}

}  // namespace

// --- impl -------------------------------------------------------------------------------------

void controller::impl::require_name(std::string_view name, std::string_view what) {
  if (const auto problem = check_fleet_name(name, what); !problem.empty())
    cubridge::detail::throw_errc(errc::precondition, "fleet controller",
                                 problem + " (docs/fleet.md: one subject token)");
}

trusted_keys controller::impl::keys_with(const secret_key& signer) const {
  trusted_keys keys = options.operator_keys;
  keys.add(signer.public_key());
  return keys;
}

std::uint64_t controller::impl::compare_and_set(
    const std::string& key,
    const std::function<std::string(const std::optional<detail::kv_value>&)>& make) {
  const std::string involved = "key " + key + " of bucket " + std::string(control_bucket);
  for (int attempt = 0; attempt < 3; ++attempt) {
    const auto current = detail::kv_get(bucket.get(), key);
    const auto value = make(current);
    std::uint64_t written = 0;
    const auto status = current ? kvStore_Update(&written, bucket.get(), key.c_str(), value.data(),
                                                 static_cast<int>(value.size()), current->revision)
                                : kvStore_Create(&written, bucket.get(), key.c_str(), value.data(),
                                                 static_cast<int>(value.size()));
    if (status == NATS_OK) return written;
    // Refused because someone wrote in between (the revision moved): decide again on theirs.
    const auto now = detail::kv_get(bucket.get(), key);
    const bool moved = now.has_value() != current.has_value() ||
                       (now && current && now->revision != current->revision);
    if (!moved) detail::check(status, current ? "kvStore_Update" : "kvStore_Create", involved);
  }
  detail::fail(fleet_errc::conflict,
               "another writer changed it between each read and write, three times in a row",
               "compare-and-set", involved);
}

std::uint64_t controller::impl::write_desired(
    std::string_view module,
    const std::function<std::string(const std::optional<detail::kv_value>&)>& make) {
  ensure_results_of(module);
  const auto written = compare_and_set(desired_key(module), make);
  ensure_results_of(module);
  return written;
}

std::vector<std::string> controller::impl::desired_modules() const {
  kvKeysList keys{};
  kvWatchOptions o;
  kvWatchOptions_Init(&o);
  o.Timeout = options.request_timeout.count();
  const auto status = kvStore_Keys(&keys, bucket.get(), &o);
  if (status == NATS_NOT_FOUND) return {};  // an empty bucket
  detail::check(status, "kvStore_Keys", "bucket " + std::string(control_bucket));
  std::vector<std::string> names;
  const auto prefix = desired_key("");
  for (int i = 0; i < keys.Count; ++i) {
    const std::string_view key = keys.Keys[i];
    if (key.starts_with(prefix) && check_fleet_name(key.substr(prefix.size()), "m").empty())
      names.emplace_back(key.substr(prefix.size()));
  }
  kvKeysList_Destroy(&keys);
  std::sort(names.begin(), names.end());
  return names;
}

void controller::impl::ensure_results_of(std::string_view module) {
  // Only the module at hand: listing the bucket's keys makes a consumer, too slow for a publish
  // during a failover; every module's subjects are added by its own writes and waits.
  std::vector<std::string> names;
  if (!module.empty()) names.emplace_back(module);
  auto w = detail::ensure_result_stream(js.get(), options.bus.replicas, names,
                                        [this] { return desired_modules(); });
  if (!w.empty() && std::find(warnings.begin(), warnings.end(), w) == warnings.end())
    warnings.push_back(std::move(w));
}

void controller::impl::store_bundle(std::string_view module, const bundle_ref& ref,
                                    std::span<const std::byte> bundle) {
  const std::int64_t limit = natsConnection_GetMaxPayload(connection.get());
  if (limit > 0 && bundle.size() > static_cast<std::uint64_t>(limit))
    detail::fail(fleet_errc::oversized,
                 "bundle of " + std::to_string(bundle.size()) +
                     " bytes is over the server's largest message, " + std::to_string(limit) +
                     " bytes (its max_payload; docs/fleet.md, Payload limits)",
                 "publish", "module " + std::string(module));
  if (auto w = detail::ensure_bundle_stream(js.get(), module, options.bus.replicas, limit);
      !w.empty())
    warnings.push_back(std::move(w));
  const auto subject = bundle_subject(module, ref.version, ref.digest);
  const auto stream = bundle_stream(module);
  const auto wait = options.publish_timeout.count() > 0
                        ? options.publish_timeout
                        : options.request_timeout + std::chrono::milliseconds(bundle.size() >> 10);
  // What the subject holds is this bundle: the check that counts, whatever the acks said.
  const auto stored = [&] {
    const auto there = detail::last_message(js.get(), stream, subject);
    return there && cubridge::detail::sha256_hex(detail::message_bytes(there.get())) == ref.digest;
  };
  // The first tries carry a message id (a retry within the duplicate window stores nothing
  // twice); the last goes without, for a subject another writer overwrote meanwhile (its id
  // would be dropped as a duplicate). A stream another operator made a moment ago may not
  // answer yet: tried again after a pause.
  const auto id = std::string(module) + "." + std::to_string(ref.version) + "." + ref.digest;
  for (int attempt = 1;; ++attempt) {
    try {
      detail::publish(js.get(), connection.get(), subject, bundle, "bundle",
                      attempt < 3 ? std::string_view(id) : std::string_view(), wait);
      if (stored()) return;
    } catch (const error& e) {
      if (e.is(fleet_errc::oversized) || e.is(fleet_errc::unreachable)) throw;
      // The ack may be lost while the server stored it: what is stored counts, not the ack.
      if (attempt > 1 && stored()) return;
      if (attempt == 4) throw;
    }
    if (attempt == 4)
      detail::fail(fleet_errc::nats_failed,
                   "holds another bundle after four publishes (another writer overwrites it)",
                   "publish",
                   std::string("subject ").append(subject).append(" of stream ").append(stream));
    std::this_thread::sleep_for(std::chrono::milliseconds(100 << attempt));
  }
}

std::optional<desired_entry> controller::impl::read_desired(std::string_view module,
                                                            const trusted_keys& keys) const {
  const auto key = desired_key(module);
  const auto value = detail::kv_get(bucket.get(), key);
  if (!value) return std::nullopt;
  record_refusal refusal;
  const auto opened = open_record(value->value, record_kind::desired_state, keys, &refusal);
  std::optional<desired_state> state;
  if (opened) state = parse_desired_state(opened->body, &refusal.why);
  if (state && state->module != module) refusal.why = "it names module '" + state->module + "'";
  if (!state || state->module != module)
    detail::fail(fleet_errc::invalid_state,
                 "holds a desired state that is refused: " + refusal.why +
                     " (only `cubridge fleet publish` or `rollback` with the operator's key "
                     "writes it)",
                 "read desired state", "key " + key + " of bucket " + std::string(control_bucket));
  return desired_entry{std::move(*state), value->revision};
}

// --- controller -------------------------------------------------------------------------------

controller::controller(controller_options options) : impl_(std::make_unique<impl>()) {
  auto& d = *impl_;
  d.options = std::move(options);
  CUBRIDGE_EXPECTS(d.options.bus.replicas >= 1 && d.options.bus.replicas <= 5,
                   "bus_options::replicas must be 1 to 5");
  detail::connect_options connect;
  connect.bus = d.options.bus;
  connect.name = d.options.client_name;
  connect.reconnect = false;  // a lost server is an error, never a wait
  connect.retry_on_failed_connect = false;
  connect.connect_timeout = d.options.connect_timeout;
  // A node's credentials reach JetStream only through their prefix, and the control side's
  // first JetStream call would wait out its timeout: said at once instead.
  if (!d.options.bus.credentials.empty() &&
      !read_credentials_file(d.options.bus.credentials).api_prefix.empty())
    detail::fail(fleet_errc::refused,
                 "credentials file '" + d.options.bus.credentials.string() +
                     "' is a node's (it names a JetStream API prefix): the control side needs "
                     "the operator's (`cubridge fleet init` wrote operator.creds)",
                 "fleet controller", "connecting to " + redact_server_list(d.options.bus.servers));
  d.connection = detail::connect(connect);
  d.open =
      d.options.bus.credentials.empty() && d.options.bus.servers.find('@') == std::string::npos;
  d.js = detail::jetstream(d.connection.get(), d.options.request_timeout);
  const int replicas = d.options.bus.replicas;
  try {
    if (auto w = detail::ensure_heartbeat_stream(d.js.get(), replicas); !w.empty())
      d.warnings.push_back(std::move(w));
  } catch (const error& e) {
    if (std::string_view(e.what()).find("Timeout") == std::string_view::npos) throw;
    detail::fail(fleet_errc::nats_failed,
                 "JetStream did not answer within " +
                     std::to_string(d.options.request_timeout.count()) +
                     " ms: the server runs without JetStream, or this identity may not use it",
                 "fleet controller", "the server at " + connected_server());
  }
  std::string mismatch;
  d.bucket = detail::ensure_control_bucket(d.js.get(), replicas, &mismatch);
  if (!mismatch.empty()) d.warnings.push_back(std::move(mismatch));
  d.ensure_results_of({});
}

controller::~controller() = default;

std::size_t controller::max_payload() const {
  const auto limit = natsConnection_GetMaxPayload(impl_->connection.get());
  return limit > 0 ? static_cast<std::size_t>(limit) : 0;
}

std::string controller::connected_server() const {
  return detail::connected_url(impl_->connection.get());
}

bool controller::open_bus() const noexcept {
  return impl_->open;
}

const std::vector<std::string>& controller::warnings() const noexcept {
  return impl_->warnings;
}

node_registry controller::registry() const {
  const std::string key(registry_key);
  const auto value = detail::kv_get(impl_->bucket.get(), key);
  if (!value) return {};
  record_refusal refusal;
  const auto opened =
      open_record(value->value, record_kind::registry, impl_->options.operator_keys, &refusal);
  std::optional<node_registry> registry;
  if (opened) registry = parse_registry(opened->body, &refusal.why);
  if (!registry)
    detail::fail(fleet_errc::invalid_state, "holds a registry that is refused: " + refusal.why,
                 "read registry", "key " + key + " of bucket " + std::string(control_bucket));
  return std::move(*registry);
}

void controller::enroll(std::string_view node, const public_key& key,
                        const std::map<std::string, std::string, std::less<>>& labels,
                        const secret_key& operator_key) {
  impl::require_name(node, "node id");
  CUBRIDGE_EXPECTS(labels.size() <= max_node_labels, "a node has at most 16 labels");
  for (const auto& [name, value] : labels) {
    impl::require_name(name, "label name");
    impl::require_name(value, "label value");
  }
  const auto keys = impl_->keys_with(operator_key);
  impl_->compare_and_set(std::string(registry_key), [&](const auto& current) {
    node_registry registry;
    if (current) {
      record_refusal refusal;
      const auto opened = open_record(current->value, record_kind::registry, keys, &refusal);
      auto parsed = opened ? parse_registry(opened->body, &refusal.why) : std::nullopt;
      if (!parsed)
        detail::fail(fleet_errc::invalid_state, "holds a registry that is refused: " + refusal.why,
                     "enroll", "key registry of bucket " + std::string(control_bucket));
      registry = std::move(*parsed);
    }
    CUBRIDGE_EXPECTS(registry.nodes.size() < max_registry_nodes || registry.find(node),
                     "the registry is full");
    ++registry.revision;
    registry.nodes.insert_or_assign(std::string(node), enrolled_node{key, labels});
    return sign_record(record_kind::registry, to_json(registry), operator_key);
  });
}

std::optional<desired_entry> controller::desired(std::string_view module) const {
  impl::require_name(module, "module name");
  return impl_->read_desired(module, impl_->options.operator_keys);
}

std::vector<desired_state> controller::desired_history(std::string_view module) const {
  impl::require_name(module, "module name");
  kvEntryList list{};
  kvWatchOptions o;
  kvWatchOptions_Init(&o);
  o.Timeout = impl_->options.request_timeout.count();
  const auto key = desired_key(module);
  std::vector<desired_state> out;
  if (kvStore_History(&list, impl_->bucket.get(), key.c_str(), &o) != NATS_OK) return out;
  for (int i = 0; i < list.Count; ++i) {
    kvEntry* e = list.Entries[i];
    if (kvEntry_Operation(e) != kvOp_Put) continue;
    const auto* data = static_cast<const char*>(kvEntry_Value(e));
    const std::string_view value(data ? data : "", static_cast<std::size_t>(kvEntry_ValueLen(e)));
    if (const auto opened =
            open_record(value, record_kind::desired_state, impl_->options.operator_keys))
      if (auto s = parse_desired_state(opened->body); s && s->module == module)
        out.push_back(std::move(*s));
  }
  kvEntryList_Destroy(&list);
  return out;
}

bool controller::impl::read_heartbeats(const node_registry& registry,
                                       steady_clock_deadline deadline) {
  const auto refuse = [this](std::string_view node, const std::string& reason) {
    if (heartbeats_refused.size() < 64 || heartbeats_refused.contains(reason))
      ++heartbeats_refused[reason];
    last_refusal.insert_or_assign(std::string(node), reason);
  };
  const std::string stream(heartbeat_stream);
  jsStreamInfo* raw_info = nullptr;
  jsErrCode js_code = static_cast<jsErrCode>(0);
  const auto status = js_GetStreamInfo(&raw_info, js.get(), stream.c_str(), nullptr, &js_code);
  const detail::stream_info_ptr info(raw_info);
  if (status == NATS_NOT_FOUND) return true;  // no node ever beat
  detail::check(status, "js_GetStreamInfo", "stream " + stream, js_code);
  const std::uint64_t last = info->State.LastSeq;
  if (last <= heartbeats_read_to) return true;
  if (!heartbeats) {
    // One ordered consumer, from the first message the stream keeps: every heartbeat in the
    // server's order with its receive time, and each read after this one takes only what is new.
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = stream.c_str();
    so.Ordered = true;
    so.Config.DeliverPolicy = js_DeliverAll;
    natsSubscription* raw = nullptr;
    const std::string filter = std::string(heartbeat_subject_prefix) + ">";
    const auto made = js_SubscribeSync(&raw, js.get(), filter.c_str(), nullptr, &so, &js_code);
    // A server too busy to answer in time (a connect storm): nothing read this time, made on
    // the next read.
    if (made == NATS_TIMEOUT) return false;
    detail::check(made, "js_SubscribeSync", "ordered consumer of stream " + stream, js_code);
    heartbeats.reset(raw);
  }
  while (heartbeats_read_to < last) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    natsMsg* raw = nullptr;
    const auto next = natsSubscription_NextMsg(&raw, heartbeats.get(), left.count());
    const detail::message_ptr message(raw);
    if (next == NATS_TIMEOUT) return false;
    detail::check(next, "natsSubscription_NextMsg", "ordered consumer of stream " + stream);
    jsMsgMetaData* raw_meta = nullptr;
    if (natsMsg_GetMetaData(&raw_meta, message.get()) != NATS_OK) continue;
    const std::unique_ptr<jsMsgMetaData, decltype(&jsMsgMetaData_Destroy)> meta(
        raw_meta, &jsMsgMetaData_Destroy);
    heartbeats_read_to = meta->Sequence.Stream;
    const std::string_view subject = natsMsg_GetSubject(message.get());
    const auto node = subject.substr(std::min(subject.size(), heartbeat_subject_prefix.size()));
    const auto* enrolled = registry.find(node);
    if (!enrolled) continue;  // a node not enrolled: never read
    record_refusal refusal;
    const auto opened = open_record(detail::message_text(message.get()), record_kind::heartbeat,
                                    trusted_keys{enrolled->key}, &refusal);
    std::optional<heartbeat> beat;
    if (opened) beat = parse_heartbeat(opened->body);
    if (!beat || beat->node != node) {
      refuse(node, opened ? "malformed heartbeat" : "heartbeat not signed by its node");
      continue;  // a forged heartbeat changes nothing
    }
    const auto received = std::chrono::system_clock::time_point(
        std::chrono::duration_cast<std::chrono::system_clock::duration>(
            std::chrono::nanoseconds(meta->Timestamp)));
    const auto verdict = ledger.take(*beat, received);
    if (verdict == heartbeat_verdict::replayed || verdict == heartbeat_verdict::earlier_run)
      refuse(node, "heartbeat going back (" + std::string(to_string(verdict)) + ")");
  }
  return true;
}

std::vector<node_state> controller::nodes(std::chrono::system_clock::time_point now,
                                          read_report* report) const {
  const auto deadline = steady::now() + impl_->options.read_deadline;
  const auto registry = this->registry();
  const bool complete = impl_->read_heartbeats(registry, deadline);
  if (report) {
    if (!complete) report->complete = false;
    for (const auto& [reason, count] : impl_->heartbeats_refused) report->refused[reason] += count;
  }
  std::vector<node_state> out;
  for (const auto& [id, entry] : registry.nodes) {
    node_state state;
    state.node = id;
    state.labels = entry.labels;
    const auto* seen = impl_->ledger.find(id);
    if (!seen) {
      const auto refused = impl_->last_refusal.find(id);
      state.problem = refused != impl_->last_refusal.end() ? "heartbeat refused: " + refused->second
                      : complete                           ? "no heartbeat"
                                                           : "not read within the read deadline";
      out.push_back(std::move(state));
      continue;
    }
    state.received = seen->received;
    state.age = std::max(std::chrono::duration_cast<std::chrono::seconds>(now - seen->received),
                         std::chrono::seconds(0));
    state.live = heartbeat_ledger::live(seen->received, seen->beat.interval, now);
    state.clock_skew = std::chrono::duration_cast<std::chrono::seconds>(
        seen->beat.time - std::chrono::floor<std::chrono::seconds>(seen->received));
    state.restarts = seen->restarts;
    state.replayed = seen->refused;
    state.beat = seen->beat;
    out.push_back(std::move(state));
  }
  return out;
}

std::vector<desired_entry> controller::modules(read_report* report) const {
  const auto deadline = steady::now() + impl_->options.read_deadline;
  const auto names = impl_->desired_modules();
  std::vector<desired_entry> out;
  for (const auto& name : names) {
    if (steady::now() > deadline) {
      if (report) report->complete = false;
      break;
    }
    try {
      if (auto entry = impl_->read_desired(name, impl_->options.operator_keys))
        out.push_back(std::move(*entry));
    } catch (const error& e) {
      if (!e.is(fleet_errc::invalid_state)) throw;
      count_refusal(report, "desired state of '" + name + "' does not verify");
    }
  }
  return out;
}

// --- results ----------------------------------------------------------------------------------

std::optional<result_record> verified_result(std::string_view subject, std::string_view text,
                                             std::string_view module, const node_registry& registry,
                                             std::string& why) {
  const auto prefix = result_subject(module, "");
  if (!subject.starts_with(prefix)) {
    why = "subject of another module";
    return std::nullopt;
  }
  const auto node = subject.substr(prefix.size());
  const auto* entry = registry.find(node);
  if (!entry) {
    why = "result of a node not enrolled";
    return std::nullopt;
  }
  record_refusal refusal;
  const auto opened = open_record(text, record_kind::result, trusted_keys{entry->key}, &refusal);
  if (!opened) {
    why = "result not signed by its node: " + refusal.why;
    return std::nullopt;
  }
  auto record = parse_result_record(opened->body);
  if (!record || record->node != node || record->module != module) {
    why = "malformed result, or naming another node or module";
    return std::nullopt;
  }
  return record;
}

result_watch::result_watch(natsConnection* connection, std::string_view module,
                           const node_registry& registry)
    : module_(module), registry_(registry) {
  natsSubscription* raw = nullptr;
  const std::string subject = result_subject(module, "*");
  detail::check(natsConnection_SubscribeSync(&raw, connection, subject.c_str()),
                "natsConnection_SubscribeSync", "subject " + subject);
  subscription_.reset(raw);
  // A flood of records cannot make the controller hold more than this: beyond, the client drops.
  detail::check(natsSubscription_SetPendingLimits(raw, 65536, 64 << 20),
                "natsSubscription_SetPendingLimits", "subject " + subject);
  // Once flushed, the server has the subscription: every later result reaches it.
  detail::check(natsConnection_FlushTimeout(connection, 5000), "natsConnection_FlushTimeout",
                "subject " + subject);
}

std::optional<result_record> result_watch::next(steady::time_point deadline) {
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady::now()).count();
    if (left <= 0) return std::nullopt;
    natsMsg* raw = nullptr;
    const auto status = natsSubscription_NextMsg(&raw, subscription_.get(), left);
    const detail::message_ptr message(raw);
    if (status == NATS_TIMEOUT) return std::nullopt;
    if (status == NATS_SLOW_CONSUMER) {  // dropped some of a flood; what follows still counts
      ++refused_;
      continue;
    }
    detail::check(status, "natsSubscription_NextMsg", "results of module " + module_);
    std::string why;
    if (auto record = verified_result(natsMsg_GetSubject(message.get()),
                                      detail::message_text(message.get()), module_, registry_, why))
      return record;
    ++refused_;
  }
}

}  // namespace cubridge::fleet
