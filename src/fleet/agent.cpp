// The node side of fleet rollout (fleet_agent.hpp, docs/fleet.md): one worker thread that sets
// up the durable consumers and applies their messages in order through the update gate, one
// thread that sends heartbeats.
#include "fleet/nats.hpp"

#include <cubridge/core/error.hpp>
#include <cubridge/fleet/agent.hpp>
#include <cubridge/fleet/subjects.hpp>
#include <cubridge/update/metrics_text.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

namespace cubridge {
namespace {

namespace nats = fleet::detail;

// How long one fetch waits for a message: bounds how soon the worker sees stop() and the next
// module's consumer.
constexpr std::chrono::milliseconds fetch_wait{250};
// JetStream API calls (consumer set-up, publishing with the stream's ack, acks).
constexpr std::chrono::milliseconds api_wait{2000};

double ms_of(std::chrono::microseconds t) {
  return static_cast<double>(t.count()) / 1000.0;
}

// What a message on a module's bundle stream is for this node.
enum class message_kind { bundle, rollback, other_node };

message_kind kind_of(std::string_view subject, std::string_view module, std::string_view node) {
  if (subject == fleet::rollback_subject(module)) return message_kind::rollback;
  if (subject == fleet::bundle_subject_all(module) ||
      subject == fleet::bundle_subject_node(module, node))
    return message_kind::bundle;
  return message_kind::other_node;  // another node's canary subject: not ours
}

}  // namespace

struct fleet_agent::impl {
  impl(module_sink& s, fleet_agent_options o)
      : sink(s), options(std::move(o)), gate(s, options.gate) {}

  struct consumer {
    std::string module;
    nats::subscription_ptr subscription;
  };

  module_sink& sink;
  fleet_agent_options options;
  update_gate gate;
  std::vector<std::string> modules;  // followed, fixed at start()

  nats::connection_ptr connection;
  nats::jetstream_ptr js;
  std::vector<consumer> consumers;  // the worker's only
  std::atomic<bool> ready{false};   // consumers set up

  std::thread worker, heartbeater;
  std::atomic<bool> is_running{false};
  std::mutex wake_mutex;
  std::condition_variable wake;
  bool stopping = false;  // under wake_mutex

  mutable std::mutex results_mutex;
  std::optional<fleet::result_record> last;
  std::map<std::string, std::uint64_t> rejects;  // by reason

  std::atomic<std::uint64_t> applied{0}, rolled_back{0}, duplicates{0}, refused{0}, ignored{0},
      acked{0}, records_published{0}, publish_failures{0}, heartbeats{0}, connects{0};

  // Waits `delay` or until stop(); true when stopping.
  bool pause(std::chrono::milliseconds delay) {
    std::unique_lock lock(wake_mutex);
    return wake.wait_for(lock, delay, [&] { return stopping; });
  }
  bool stop_requested() {
    std::lock_guard lock(wake_mutex);
    return stopping;
  }
  bool link_up() const {
    return connection && natsConnection_Status(connection.get()) == NATS_CONN_STATUS_CONNECTED;
  }

  void choose_modules();
  void set_up();
  void run_worker();
  bool fetch_from(consumer& c);
  void handle(const std::string& module, natsMsg* message);
  fleet::result_record record_of(const std::string& module, const gate_decision& d) const;
  void count(const gate_decision& d);
  bool publish_and_ack(const fleet::result_record& record, natsMsg* message);
  bool ack(natsMsg* message);
  void run_heartbeats();
  fleet::heartbeat heartbeat_now() const;
};

// --- start: what to follow --------------------------------------------------------------------

void fleet_agent::impl::choose_modules() {
  modules = options.modules;
  if (modules.empty()) {
    for (const auto& report : sink.status())
      if (fleet::check_fleet_name(report.name, "module").empty()) modules.push_back(report.name);
  }
  std::sort(modules.begin(), modules.end());
  modules.erase(std::unique(modules.begin(), modules.end()), modules.end());
  CUBRIDGE_EXPECTS(!modules.empty(), "fleet agent of node '" + options.node +
                                         "' follows no module: fleet_agent_options::modules is "
                                         "empty and the sink reports none");
  for (const auto& m : modules) {
    const auto problem = fleet::check_fleet_name(m, "module name");
    CUBRIDGE_EXPECTS(problem.empty(), "fleet agent cannot follow a module: " + problem);
  }
}

// --- the worker: consumers and messages -------------------------------------------------------

// Makes the streams (idempotently) and binds this node's durable consumer on each module's
// bundle stream. Deliver-all on a stream that keeps one message per subject gives a new node the
// current bundle for everyone, its own canary bundle and the last rollback request; one
// unacknowledged message at a time keeps them in order.
void fleet_agent::impl::set_up() {
  consumers.clear();
  nats::ensure_result_stream(js.get());
  nats::ensure_heartbeat_stream(js.get());
  const std::string durable = fleet::node_consumer(options.node);
  for (const auto& m : modules) {
    nats::ensure_bundle_stream(js.get(), m);
    const std::string stream = fleet::bundle_stream(m);
    std::string what = "consumer ";  // for errors
    what.append(durable).append(" on stream ").append(stream);
    jsConsumerConfig config;
    jsConsumerConfig_Init(&config);
    config.Durable = durable.c_str();
    config.AckPolicy = js_AckExplicit;
    config.DeliverPolicy = js_DeliverAll;
    config.AckWait = std::chrono::duration_cast<std::chrono::nanoseconds>(options.ack_wait).count();
    config.MaxAckPending = 1;
    jsConsumerInfo* info = nullptr;
    jsErrCode code = static_cast<jsErrCode>(0);
    const auto added = js_AddConsumer(&info, js.get(), stream.c_str(), &config, nullptr, &code);
    if (info) jsConsumerInfo_Destroy(info);
    // An existing durable (another configuration, e.g. another ack_wait) is bound as it is.
    if (added != NATS_OK && code != JSConsumerNameExistErr)
      nats::check(added, "js_AddConsumer", what, code);
    jsSubOptions bind;
    jsSubOptions_Init(&bind);
    bind.Stream = stream.c_str();
    bind.Consumer = durable.c_str();
    natsSubscription* raw = nullptr;
    code = static_cast<jsErrCode>(0);
    const auto subscribed =
        js_PullSubscribe(&raw, js.get(), nullptr, durable.c_str(), nullptr, &bind, &code);
    nats::subscription_ptr owned(raw);
    nats::check(subscribed, "js_PullSubscribe", what, code);
    consumers.push_back({m, std::move(owned)});
  }
  ++connects;
}

void fleet_agent::impl::run_worker() {
  int failures = 0;
  while (!stop_requested()) {
    if (!ready) {
      try {
        if (!link_up()) throw std::runtime_error("not connected");
        set_up();
        ready = true;
        failures = 0;
      } catch (const std::exception&) {
        consumers.clear();
        if (pause(nats::reconnect_delay(++failures))) return;
        continue;
      }
    }
    bool healthy = true;
    for (auto& c : consumers) {
      if (stop_requested()) return;
      healthy = fetch_from(c) && healthy;
    }
    if (healthy) {
      failures = 0;
      continue;
    }
    // Fetches fail while the server is away; after a few, the consumers are set up again (the
    // durable ones resume where they were acknowledged).
    if (++failures >= 3) ready = false;
    if (pause(nats::reconnect_delay(failures))) return;
  }
}

// One fetch from `c`'s consumer, its message handled; false when the fetch failed (not for a
// fetch that found nothing).
bool fleet_agent::impl::fetch_from(consumer& c) {
  natsMsgList list{};
  jsErrCode code = static_cast<jsErrCode>(0);
  const auto status =
      natsSubscription_Fetch(&list, c.subscription.get(), 1, fetch_wait.count(), &code);
  if (status == NATS_TIMEOUT) return true;
  if (status != NATS_OK) return false;
  for (int i = 0; i < list.Count; ++i) handle(c.module, list.Msgs[i]);
  natsMsgList_Destroy(&list);
  return true;
}

void fleet_agent::impl::handle(const std::string& module, natsMsg* message) {
  const std::string_view subject = natsMsg_GetSubject(message);
  gate_decision d;
  switch (kind_of(subject, module, options.node)) {
    case message_kind::other_node:
      ++ignored;
      (void)ack(message);  // not redelivered; another node's record says what became of it
      return;
    case message_kind::bundle:
      d = gate.push(nats::message_bytes(message), module);
      break;
    case message_kind::rollback:
      d = gate.rollback(nats::message_text(message), module);
      break;
  }
  count(d);
  const auto record = record_of(module, d);
  {
    std::lock_guard lock(results_mutex);
    last = record;
  }
  (void)publish_and_ack(record, message);
}

fleet::result_record fleet_agent::impl::record_of(const std::string& module,
                                                  const gate_decision& d) const {
  fleet::result_record r;
  r.node = options.node;
  r.module = module;
  r.version = d.version;
  r.serving_version = d.serving_version;
  r.outcome = d.outcome;
  r.reason = d.reason;
  r.detail = d.detail;
  r.verify_ms = ms_of(d.verify_time);
  r.apply_ms = ms_of(d.apply_time);
  r.time = std::chrono::floor<std::chrono::seconds>(
      options.gate.clock ? options.gate.clock() : std::chrono::system_clock::now());
  return r;
}

void fleet_agent::impl::count(const gate_decision& d) {
  switch (d.outcome) {
    case gate_outcome::applied:
      ++applied;
      return;
    case gate_outcome::rolled_back:
      ++rolled_back;
      return;
    case gate_outcome::duplicate:
      ++duplicates;
      return;
    case gate_outcome::refused:
    case gate_outcome::failed:
      break;
  }
  ++refused;
  std::lock_guard lock(results_mutex);
  if (rejects.size() < 64 || rejects.contains(d.reason)) ++rejects[d.reason];
}

// The record stored, then the ack; both retried (the outcome is decided, the sink is not called
// again) until they go through or the agent stops. A message not acknowledged is delivered again
// after ack_wait, and the replay state makes it a duplicate.
bool fleet_agent::impl::publish_and_ack(const fleet::result_record& record, natsMsg* message) {
  const std::string text = fleet::to_json(record);
  const auto bytes = std::as_bytes(std::span(text.data(), text.size()));
  const auto subject = fleet::result_subject(record.module, record.node);
  for (int attempt = 1;; ++attempt) {
    try {
      nats::publish(js.get(), connection.get(), subject, bytes, "result record");
      ++records_published;
      break;
    } catch (const std::exception&) {
      ++publish_failures;
      if (pause(nats::reconnect_delay(attempt))) return false;
    }
  }
  for (int attempt = 1; !ack(message); ++attempt) {
    ++publish_failures;
    if (pause(nats::reconnect_delay(attempt))) return false;
  }
  return true;
}

bool fleet_agent::impl::ack(natsMsg* message) {
  jsOptions o;
  jsOptions_Init(&o);
  o.Wait = api_wait.count();
  jsErrCode code = static_cast<jsErrCode>(0);
  if (natsMsg_AckSync(message, &o, &code) != NATS_OK) return false;
  ++acked;
  return true;
}

// --- heartbeats -------------------------------------------------------------------------------

fleet::heartbeat fleet_agent::impl::heartbeat_now() const {
  fleet::heartbeat h;
  h.node = options.node;
  h.cohort = options.cohort;
  if (const auto device = sink.device_capability()) h.gpu = to_string(*device);
  h.interval = options.heartbeat_interval;
  h.time = std::chrono::floor<std::chrono::seconds>(
      options.gate.clock ? options.gate.clock() : std::chrono::system_clock::now());
  for (const auto& m : modules) h.versions[m] = sink.current_version(m);
  h.connected = true;  // sent only while connected
  std::lock_guard lock(results_mutex);
  h.last_result = last;
  return h;
}

void fleet_agent::impl::run_heartbeats() {
  const auto subject = fleet::heartbeat_subject(options.node);
  do {
    if (!ready || !link_up()) continue;  // the streams are made by the worker's set-up
    try {
      const auto text = fleet::to_json(heartbeat_now());
      nats::publish(js.get(), connection.get(), subject,
                    std::as_bytes(std::span(text.data(), text.size())), "heartbeat");
      ++heartbeats;
    } catch (const std::exception&) {
      // Missed; the next interval tries again.
    }
  } while (!pause(ready && link_up() && heartbeats > 0
                      ? options.heartbeat_interval
                      : std::min(options.heartbeat_interval, fetch_wait)));
}

// --- the agent --------------------------------------------------------------------------------

fleet_agent::fleet_agent(module_sink& sink, fleet_agent_options options)
    : impl_(std::make_unique<impl>(sink, std::move(options))) {}

fleet_agent::~fleet_agent() {
  stop();
}

void fleet_agent::start() {
  auto& d = *impl_;
  CUBRIDGE_EXPECTS(!d.is_running, "fleet agent already running");
  const auto node_problem = fleet::check_fleet_name(d.options.node, "node id");
  CUBRIDGE_EXPECTS(node_problem.empty(), "fleet_agent_options::node: " + node_problem);
  CUBRIDGE_EXPECTS(d.options.heartbeat_interval.count() > 0 && d.options.ack_wait.count() > 0,
                   "fleet_agent_options::heartbeat_interval and ack_wait must be positive");
  d.choose_modules();
  d.gate.start();  // the replay state, before any message
  nats::connect_options c;
  c.url = d.options.servers;
  c.name = "cubridge-agent-" + d.options.node;
  c.retry_on_failed_connect = true;  // a service starts while the server is down
  d.connection = nats::connect(c);
  d.js = nats::jetstream(d.connection.get(), api_wait);
  {
    std::lock_guard lock(d.wake_mutex);
    d.stopping = false;
  }
  d.worker = std::thread([&d] { d.run_worker(); });
  d.heartbeater = std::thread([&d] { d.run_heartbeats(); });
  d.is_running = true;
}

void fleet_agent::stop() noexcept {
  auto& d = *impl_;
  if (!d.is_running) return;
  {
    std::lock_guard lock(d.wake_mutex);
    d.stopping = true;
  }
  d.wake.notify_all();
  d.worker.join();
  d.heartbeater.join();
  d.consumers.clear();
  d.ready = false;
  d.js.reset();
  d.connection.reset();
  d.is_running = false;
}

bool fleet_agent::running() const noexcept {
  return impl_->is_running;
}

bool fleet_agent::connected() const noexcept {
  return impl_->is_running && impl_->ready && impl_->link_up();
}

fleet_agent_stats fleet_agent::stats() const noexcept {
  const auto& d = *impl_;
  return {d.applied, d.rolled_back,       d.duplicates,       d.refused,    d.ignored,
          d.acked,   d.records_published, d.publish_failures, d.heartbeats, d.connects};
}

std::optional<fleet::result_record> fleet_agent::last_result() const {
  std::lock_guard lock(impl_->results_mutex);
  return impl_->last;
}

std::string fleet_agent::metrics_text() const {
  const auto& d = *impl_;
  metrics_text_writer out;
  out.family("cubridge_module_version", "The bundle version serving, per module (0: none).",
             metric_type::gauge);
  for (const auto& m : d.modules) out.sample(d.sink.current_version(m), {{"module", m}});
  const auto counter = [&out](const char* name, const char* help, std::uint64_t value) {
    out.family(name, help, metric_type::counter);
    out.sample(value);
  };
  counter("cubridge_fleet_promotions_total", "Bundles applied through the fleet.", d.applied);
  counter("cubridge_fleet_rollbacks_total", "Signed rollbacks done through the fleet.",
          d.rolled_back);
  out.family("cubridge_fleet_rejects_total", "Messages refused or failed, by reason.",
             metric_type::counter);
  {
    std::lock_guard lock(d.results_mutex);
    for (const auto& [reason, n] : d.rejects) out.sample(n, {{"reason", reason}});
  }
  out.family("cubridge_fleet_agent_connected", "1 while connected with its consumers set up.",
             metric_type::gauge);
  out.sample(connected() ? 1u : 0u);
  counter("cubridge_fleet_agent_connects_total",
          "Consumer set-ups: the first and one after each lost connection.", d.connects);
  counter("cubridge_fleet_agent_heartbeats_total", "Heartbeats published.", d.heartbeats);
  counter("cubridge_fleet_agent_publish_failures_total",
          "Result records or acks that could not go out (retried).", d.publish_failures);
  return std::move(out).str();
}

}  // namespace cubridge
