// The node side of the fleet (agent.hpp, docs/fleet.md): one thread that reconciles every
// followed module to its desired state, one that sends heartbeats.
//
// The reconcile loop, per module: read the desired state (a watch wakes it at once; a plain read
// every resync_interval catches what a lost watch missed), verify the operator's signature and
// that the revision did not go back, pick the bundle it names for this node, and if the node
// serves something else: fetch it by subject, check its digest, hand it to the gate with the
// record's authority, and publish one signed result for the revision. Transient failures retry
// with backoff; permanent ones wait for the next revision.
//
// Once the process is poisoned (core/process_health.hpp) the heartbeat thread sends at once a
// heartbeat that says so, then a `failed` result (sticky_error) per module serving a version.
#include "fleet/nats.hpp"

#include <cubridge/bundle/detail/signing.hpp>
#include <cubridge/core/detail/printable.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/core/log.hpp>
#include <cubridge/core/process_health.hpp>
#include <cubridge/fleet/agent.hpp>
#include <cubridge/fleet/desired_state.hpp>
#include <cubridge/fleet/signed_record.hpp>
#include <cubridge/fleet/subjects.hpp>
#include <cubridge/update/metrics_text.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <shared_mutex>
#include <thread>
#include <utility>
#include <vector>

namespace cubridge {
namespace {

namespace nats = fleet::detail;
using steady = std::chrono::steady_clock;

// Publishing with the stream's ack, and the base of a bundle fetch's wait.
constexpr std::chrono::milliseconds api_wait{2000};
// The control calls (binding the bucket, making a watch, reading the desired state and its
// history): small requests, waited for briefly and tried again, so that a node follows a
// cluster's election closely instead of waiting out long timeouts while it happens.
constexpr std::chrono::milliseconds control_wait{1000};
// How long one pass waits on a module's watch: bounds how soon the loop sees stop() and the
// next module.
constexpr std::chrono::milliseconds watch_wait{50};
// How often a loop waiting for a lost connection looks whether it is back.
constexpr std::chrono::milliseconds link_poll{50};

double ms_of(std::chrono::microseconds t) {
  return static_cast<double>(t.count()) / 1000.0;
}

// A fetch of a bundle allows for its size: 2 s plus 1 s per MiB.
std::chrono::milliseconds fetch_wait(std::uint64_t size) {
  // 4 ms per KiB: a server sending a bundle to every node at once answers each late, and a fetch
  // given up early is sent again, one more copy queued on the server (seen in bench_fleet at
  // 1,000 nodes).
  return api_wait + std::chrono::milliseconds((size >> 10) * 4);
}

// A run's id: 64 random bits as 16 hex digits.
std::string new_boot_id() {
  std::random_device device;
  const std::uint64_t bits = (std::uint64_t{device()} << 32) ^ device();
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(bits));
  return text;
}

// Where the agent's threads wait: for stop(), and the heartbeat thread for word that the process
// was poisoned. Shared with the poison listener, which process_health may still call after
// remove_poison_listener returned (it calls a copy, outside its own lock): a late call finds
// this, never a destroyed agent.
struct wake_signal {
  std::mutex mutex;
  std::condition_variable wake;
  bool stopping = false;            // under mutex
  bool poison_news = false;         // under mutex: ends the heartbeat thread's wait, once
  bool poison_results_due = false;  // under mutex: the sticky_error results still to go out
};

}  // namespace

struct fleet_agent::impl {
  impl(std::shared_ptr<update_gate> g, fleet_agent_options o)
      : gate(std::move(g)), options(std::move(o)) {}

  // What the loop knows of one module.
  struct module_follow {
    std::string module;
    nats::kv_watcher_ptr watcher;
    std::optional<fleet::desired_state> desired;  // the newest verified record
    std::uint64_t highest_revision = 0;           // never acts on one below
    std::string desired_body;                     // what that revision said
    std::string desired_value;                    // the signed value it came in, as read
    // The revision whose outcome is settled (converged, applied, or refused for good): nothing
    // more to do until a newer one, unless the node stops serving its target.
    std::uint64_t settled_revision = 0;
    bool settled_converged = false;
    int failures = 0;  // transient, in a row
    steady::time_point next_attempt{};
    steady::time_point next_resync{};
    int watch_failures = 0;  // in a row: the watch is made again after a backoff
    steady::time_point next_watch{};
    std::optional<fleet::result_record> unpublished;  // a result still to go out
    int publish_failures = 0;                         // in a row, for its backoff
    steady::time_point next_publish{};
  };

  std::shared_ptr<update_gate> gate;
  fleet_agent_options options;
  std::optional<secret_key> node_key;
  std::vector<std::string> modules;  // followed, fixed at start()

  // The link: made and replaced by the worker only; the heartbeat thread and the accessors read
  // it under a shared lock (a connection the client library closed is replaced by a new one).
  mutable std::shared_mutex link_mutex;
  nats::connect_options link_options;
  nats::connection_ptr connection;
  nats::jetstream_ptr js;
  nats::kv_store_ptr bucket;
  std::optional<nats::direct_getter> getter;  // the loop's only: bundle fetches
  std::optional<nats::direct_getter> reader;  // the loop's only: the desired state
  std::vector<module_follow> follows;         // the loop's only
  std::atomic<bool> ready{false};             // bucket bound, watches made

  std::thread worker, heartbeater;
  std::atomic<bool> is_running{false};
  std::shared_ptr<wake_signal> wakeup = std::make_shared<wake_signal>();
  std::uint64_t poison_listener = 0;  // from start() to stop()

  mutable std::mutex state_mutex;  // what the other threads read
  std::optional<fleet::result_record> last;
  std::map<std::string, std::uint64_t> rejects;           // by reason
  std::map<std::string, std::uint64_t> acted_on;          // per module: the revision last acted on
  std::map<std::string, fleet::bundle_ref> acted_target;  // and the bundle it named for the node
  std::map<std::string, bool> converged_now;              // per module
  std::string problem;                                    // why not ready
  std::string last_problem;                               // the last one noted, kept once solved
  steady::time_point last_logged{};                       // when a problem was last logged

  // This run of the agent, as its heartbeats name it (records.hpp: boot, sequence, started).
  std::string boot;
  std::chrono::sys_seconds started{};
  std::uint64_t sequence = 0;  // the heartbeat thread's only

  std::atomic<std::uint64_t> applied{0}, duplicates{0}, refused{0}, retries{0},
      records_published{0}, publish_failures{0}, heartbeats{0}, connects{0}, desired_refused{0},
      links_replaced{0};

  bool pause(std::chrono::milliseconds delay) {
    std::unique_lock lock(wakeup->mutex);
    return wakeup->wake.wait_for(lock, delay, [&] { return wakeup->stopping; });
  }
  // As pause(), but word that the process was poisoned ends the wait too, once: the heartbeat
  // that says so goes out at once, not at the next interval.
  bool pause_heartbeat(std::chrono::milliseconds delay) {
    std::unique_lock lock(wakeup->mutex);
    wakeup->wake.wait_for(lock, delay, [&] { return wakeup->stopping || wakeup->poison_news; });
    wakeup->poison_news = false;
    return wakeup->stopping;
  }
  bool take_poison_results() {
    std::lock_guard lock(wakeup->mutex);
    return std::exchange(wakeup->poison_results_due, false);
  }
  // Waits up to `delay` for stop(); while the connection is down, returns as soon as it is up
  // again (looked at every link_poll) with `failures` reset, so that a set-up after a server
  // restart is not held back by the backoff its downtime built up. True when stopping.
  bool pause_for_link(std::chrono::milliseconds delay, int& failures) {
    if (link_up()) return pause(delay);
    const auto until = steady::now() + delay;
    for (auto left = delay; left.count() > 0;
         left = std::chrono::duration_cast<std::chrono::milliseconds>(until - steady::now())) {
      if (pause(std::min(left, link_poll))) return true;
      if (link_up()) {
        failures = 0;
        return false;
      }
    }
    return false;
  }
  bool stop_requested() {
    std::lock_guard lock(wakeup->mutex);
    return wakeup->stopping;
  }
  bool link_up() const {
    std::shared_lock lock(link_mutex);
    return connection && natsConnection_Status(connection.get()) == NATS_CONN_STATUS_CONNECTED;
  }
  // Whether the client library gave the connection up for good (it closes one after the same
  // authentication error twice, e.g. handshakes timing out on a server busy with a connect
  // storm): only a new connection helps then.
  bool link_closed() const { return !connection || natsConnection_IsClosed(connection.get()); }
  std::chrono::system_clock::time_point now() const {
    const auto& clock = gate->options().clock;
    return clock ? clock() : std::chrono::system_clock::now();
  }
  std::chrono::milliseconds backoff(int failures) const {
    return nats::jittered_backoff(failures, options.retry_first, options.retry_longest);
  }
  void note_problem(std::string text) {
    std::lock_guard lock(state_mutex);
    if (!text.empty() && text != last_problem) {
      // A new problem is logged, at most one a second: two that alternate while a server is
      // away do not flood the log.
      const auto now = steady::now();
      if (now - last_logged >= std::chrono::seconds(1)) {
        log::warn("fleet agent of node '" + options.node + "': " + text);
        last_logged = now;
      }
      last_problem = text;
    }
    problem = std::move(text);
  }
  // Makes the link anew (the first time, or after the client library closed it): a fresh
  // connection that keeps trying in the background, and its JetStream context.
  void open_link();

  void choose_modules();
  void set_up();
  bool link_ready(int& link_failures);
  bool set_up_ready(int& set_up_failures);
  bool follow_once(module_follow& f);
  void run_worker();
  void take(module_follow& f, std::string_view value);
  void read_desired(module_follow& f);
  void watch(module_follow& f);
  void reconcile(module_follow& f);
  std::optional<std::vector<std::byte>> fetch(const std::string& module,
                                              const fleet::bundle_ref& ref, std::string& why);
  fleet::result_record record_of(const module_follow& f, const fleet::bundle_ref& target,
                                 const gate_decision& d) const;
  void count(const gate_decision& d);
  /// `r`, signed with the node's key, stored in the result stream. @throws what publishing threw.
  void send_result(const fleet::result_record& r);
  bool publish_record(module_follow& f);
  void run_heartbeats();
  fleet::heartbeat heartbeat_now();
  void listen_for_poison();
  std::vector<fleet::result_record> poisoned_results() const;
  void publish_poisoned_results();
  fleet::module_health health_of(const module_report& report) const;
};

// --- start: what to follow --------------------------------------------------------------------

void fleet_agent::impl::choose_modules() {
  modules = options.modules;
  if (modules.empty()) {
    for (const auto& report : gate->sink().status())
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

// --- the loop ---------------------------------------------------------------------------------

// Readies the modules for a new connection. The bucket is bound and the watches made by the
// loop, when they can be, and a node converges without them: the resync reads the desired state
// with direct gets every resync_interval, which any replica answers, so that a bucket that
// cannot be bound now (a cluster electing its leader) holds nothing back.
void fleet_agent::impl::set_up() {
  for (auto& f : follows) {
    // A watch is kept across reconnects of its connection (libnats makes its ordered consumer
    // again by itself) and destroyed only with the connection: libnats 3.4.1 reads freed memory
    // when a watcher is destroyed while its consumer is being reset (AddressSanitizer, 500
    // agents in bench_fleet_storm).
    f.watch_failures = 0;
    f.next_watch = {};
    f.next_resync = {};  // read at once: the watch's first value may take a moment
    // A fetch that failed with the lost connection is tried again at once on the new one.
    f.failures = 0;
    f.next_attempt = {};
  }
  ++connects;
}

void fleet_agent::impl::watch(module_follow& f) {
  kvWatchOptions o;
  kvWatchOptions_Init(&o);
  kvWatcher* raw = nullptr;
  const auto key = fleet::desired_key(f.module);
  nats::check(kvStore_Watch(&raw, bucket.get(), key.c_str(), &o), "kvStore_Watch",
              "key " + key + " of bucket " + std::string(fleet::control_bucket));
  f.watcher.reset(raw);
}

// A value of `desired.<m>` as read or watched: taken only when it verifies, parses, names this
// module and is not older than what was seen; counted otherwise.
void fleet_agent::impl::take(module_follow& f, std::string_view value) {
  // The value verified last, read again by the resync: nothing new, and no signature to check
  // (at 1,000 agents a resync every 2 s was 500 verifications a second for nothing).
  if (f.desired && value == f.desired_value) return;
  fleet::record_refusal refusal;
  const auto opened =
      fleet::open_record(value, fleet::record_kind::desired_state, gate->options().keys, &refusal);
  std::optional<fleet::desired_state> state;
  if (opened) state = fleet::parse_desired_state(opened->body, &refusal.why);
  if (!state || state->module != f.module) {
    ++desired_refused;
    note_problem("desired state of '" + f.module +
                 "' refused: " + (state ? "it names module '" + state->module + "'" : refusal.why));
    return;
  }
  if (state->revision < f.highest_revision) {  // an old record written back
    ++desired_refused;
    note_problem("desired state of '" + f.module + "' revision " + std::to_string(state->revision) +
                 " is older than revision " + std::to_string(f.highest_revision) + " seen");
    return;
  }
  if (state->revision == f.highest_revision && f.desired) {
    if (opened->body == f.desired_body) return;  // seen
    ++desired_refused;                           // one revision, two contents: the first one stands
    note_problem("desired state of '" + f.module + "' revision " + std::to_string(state->revision) +
                 " came again with other content");
    return;
  }
  f.highest_revision = state->revision;
  f.desired_body = opened->body;
  f.desired_value = value;
  f.desired = std::move(*state);
  f.failures = 0;
  f.next_attempt = {};
}

// Reads the desired state with direct gets (any replica answers: no leader needed, no consumer
// made): the key's last value and, unless it is the one taken already, every revision the key's
// history keeps, oldest first, so that the newest verified record is taken whatever was written
// last.
void fleet_agent::impl::read_desired(module_follow& f) {
  const std::string stream(fleet::control_bucket_stream);
  const auto subject =
      "$KV." + std::string(fleet::control_bucket) + "." + fleet::desired_key(f.module);
  if (!reader) reader.emplace(connection.get());
  const auto last = reader->last_message(options.bus.api_prefix, stream, subject, control_wait);
  // A deleted or purged key is a marker with no value: nothing to take (the last good stays).
  if (!last || natsMsg_GetDataLength(last.get()) == 0) return;
  const std::string value(nats::message_text(last.get()));
  if (f.desired && value == f.desired_value) return;  // nothing new
  std::string newest;
  std::uint64_t newest_revision = 0;
  const auto consider = [&](std::string_view text) {
    const auto opened =
        fleet::open_record(text, fleet::record_kind::desired_state, gate->options().keys);
    const auto state = opened ? fleet::parse_desired_state(opened->body) : std::nullopt;
    if (state && state->module == f.module && state->revision > newest_revision) {
      newest_revision = state->revision;
      newest = text;
    }
  };
  const auto last_sequence = nats::message_sequence(last.get());
  try {
    // At most the bucket's history per key (16), and the last value itself.
    for (std::uint64_t from = 1, reads = 0; from <= last_sequence && reads <= 64; ++reads) {
      const auto m =
          reader->next_message(options.bus.api_prefix, stream, subject, from, control_wait);
      const auto sequence = m ? nats::message_sequence(m.get()) : 0;
      if (sequence == 0) break;
      consider(nats::message_text(m.get()));
      from = sequence + 1;
    }
  } catch (const error& e) {
    if (e.is(fleet_errc::unreachable)) throw;
    // A bus whose node permissions predate the history read (fleet init before issue 33: no
    // DIRECT.GET of the bucket's stream): the last value alone, and said so.
    note_problem("the history of the desired state of '" + f.module + "' could not be read (" +
                 e.what() + "): the last value is taken alone; allow $JS.API.DIRECT.GET." + stream +
                 " to the node (`cubridge fleet init` does)");
  }
  consider(value);
  if (!newest.empty()) take(f, newest);
  if (value != newest) take(f, value);  // refused and counted: older, or not verified
}

void fleet_agent::impl::open_link() {
  std::string why;
  {
    std::shared_lock lock(link_mutex);
    if (connection) {
      const char* text = nullptr;
      const auto status = natsConnection_GetLastError(connection.get(), &text);
      why =
          std::string(natsStatus_GetText(status)) + (text && *text ? std::string(": ") + text : "");
    }
  }
  // Out of the lock: a first attempt may take the connect timeout.
  auto fresh = nats::connect(link_options);
  auto fresh_js = nats::jetstream(fresh.get(), control_wait, options.bus.api_prefix);
  std::unique_lock lock(link_mutex);
  getter.reset();
  reader.reset();
  bucket.reset();
  for (auto& f : follows) f.watcher.reset();
  ready = false;
  if (connection) {
    ++links_replaced;
    note_problem("the client library closed the connection to " +
                 fleet::redact_server_list(options.bus.servers) + " (" + why +
                 "): connecting again");
  }
  js = std::move(fresh_js);
  connection = std::move(fresh);
}

// The link made anew when the client library closed it (the first time too), with jittered
// exponential backoff, forever. True when the loop may go on; false after a wait (the caller
// looks at stop_requested() and comes back).
bool fleet_agent::impl::link_ready(int& link_failures) {
  if (!link_closed()) return true;
  try {
    open_link();
    link_failures = 0;
  } catch (const std::exception& e) {
    note_problem(std::string("cannot connect: ") + e.what());
  }
  // A closed link again soon after is not retried in a tight loop.
  if (link_closed() || link_failures > 0) {
    (void)pause(nats::reconnect_delay(++link_failures));
    return false;
  }
  return true;
}

// The bucket bound once the link is up. True when set up; false after a wait.
bool fleet_agent::impl::set_up_ready(int& set_up_failures) {
  if (ready) return true;
  try {
    if (!link_up())
      throw std::runtime_error("not connected to " +
                               fleet::redact_server_list(options.bus.servers));
    set_up();
    ready = true;
    set_up_failures = 0;
    note_problem({});
    return true;
  } catch (const std::exception& e) {
    note_problem(e.what());
    // Connected but the bucket not bound (a cluster electing its leader): tried again soon,
    // each try being one small request; not connected: the reconnect's backoff.
    const auto delay = link_up() ? std::min(nats::reconnect_delay(++set_up_failures),
                                            std::chrono::milliseconds(control_wait))
                                 : nats::reconnect_delay(++set_up_failures);
    (void)pause_for_link(delay, set_up_failures);
    return false;
  }
}

// One pass over a followed module: its desired state read when due, its watch made when due and
// read, and the reconcile. False when stopping.
bool fleet_agent::impl::follow_once(module_follow& f) {
  const auto now = steady::now();
  if (now >= f.next_resync) {
    read_desired(f);
    f.next_resync = now + options.resync_interval;
  }
  if (!f.watcher && now >= f.next_watch) {
    try {
      if (!bucket) bucket = nats::bind_control_bucket(js.get());  // the operator made it
      watch(f);
      f.watch_failures = 0;
    } catch (const std::exception& e) {
      note_problem(e.what());
      f.next_watch = now + backoff(++f.watch_failures);
    }
  }
  if (!f.watcher) {  // the resync alone, until the watch can be made
    reconcile(f);
    return !pause(watch_wait);
  }
  kvEntry* raw = nullptr;
  const auto status = kvWatcher_Next(&raw, f.watcher.get(), watch_wait.count());
  const nats::kv_entry_ptr entry(raw);
  if (status == NATS_OK && entry && kvEntry_Operation(entry.get()) == kvOp_Put) {
    const auto* data = static_cast<const char*>(kvEntry_Value(entry.get()));
    take(f, std::string_view(data ? data : "",
                             static_cast<std::size_t>(kvEntry_ValueLen(entry.get()))));
  }
  // Any other status (the connection lost, the consumer being reset) is libnats's to recover
  // from; the watcher is not destroyed here (see set_up), and the resync reads on meanwhile.
  reconcile(f);
  return true;
}

void fleet_agent::impl::run_worker() {
  int set_up_failures = 0, link_failures = 0;
  follows.clear();
  for (const auto& m : modules) follows.push_back({m});
  // Nodes that boot together (a rack powered on, every node after a server restart) do not
  // knock on the server together.
  if (options.connect_jitter.count() > 0) {
    thread_local std::minstd_rand random{std::random_device{}()};
    if (pause(std::chrono::milliseconds(std::uniform_int_distribution<std::int64_t>(
            0, options.connect_jitter.count())(random))))
      return;
  }
  while (!stop_requested()) {
    if (!link_ready(link_failures) || !set_up_ready(set_up_failures)) continue;
    bool healthy = true;
    for (auto& f : follows) {
      if (stop_requested()) return;
      try {
        if (!follow_once(f)) return;
      } catch (const std::exception& e) {
        note_problem(e.what());
        healthy = false;
      }
    }
    if (!healthy && !link_up()) {
      ready = false;  // set up again once the connection is back
      if (pause_for_link(nats::reconnect_delay(++set_up_failures), set_up_failures)) return;
    }
  }
}

// Brings the module to its desired state for this node, or records why it cannot.
void fleet_agent::impl::reconcile(module_follow& f) {
  // The last result goes out when it can; a result stream that refuses it (gone, configured
  // otherwise) never holds back the apply of a newer revision.
  if (f.unpublished && steady::now() >= f.next_publish) (void)publish_record(f);
  if (!f.desired) return;
  const auto& desired = *f.desired;
  const fleet::bundle_ref* target = desired.target_for(options.node);
  const std::uint64_t serving = gate->serving(f.module);
  {
    std::lock_guard lock(state_mutex);
    converged_now[f.module] = !target || serving == target->version;
  }
  if (!target) return;  // nothing desired for this node yet
  const bool serves = serving == target->version;
  // Settled for this revision: acted on again only when the node lost its target (a restart
  // serving less), never to undo a newer version another door applied since.
  if (f.settled_revision == desired.revision &&
      (serves || !f.settled_converged || serving > target->version))
    return;
  if (steady::now() < f.next_attempt) return;
  // Going below what serves is the operator's explicit word only: a rollback or a halt.
  const bool below_serving = desired.phase == fleet::rollout_phase::rolled_back ||
                             desired.phase == fleet::rollout_phase::halted;

  // The gate decides, with or without the bundle: one that serves already is not fetched.
  gate_decision d;
  if (auto known = gate->already_serving(f.module, target->version)) {
    d = std::move(*known);
  } else {
    std::string why;
    const auto bytes = fetch(f.module, *target, why);
    if (!bytes) {
      ++retries;
      note_problem(why);
      f.next_attempt = steady::now() + backoff(++f.failures);
      return;
    }
    const push_authority authority{
        target->version, below_serving,
        "the desired state of '" + f.module + "' revision " + std::to_string(desired.revision)};
    d = gate->push(*bytes, f.module, &authority);
    if (transient(d.reason)) {  // else the bundle's own fault: wait for the next revision
      ++retries;
      note_problem("module '" + f.module + "' v" + std::to_string(target->version) + ": " +
                   std::string(to_string(d.reason)) + ": " + d.detail);
      f.next_attempt = steady::now() + backoff(++f.failures);
      return;
    }
  }
  f.failures = 0;
  count(d);
  f.settled_revision = desired.revision;
  f.settled_converged = d.outcome == gate_outcome::applied || d.outcome == gate_outcome::duplicate;
  // What serves came back with the decision; one refused before the gate looked at the
  // module (a bundle that did not verify) changed nothing.
  if (d.module != f.module) d.serving_version = serving;
  {
    std::lock_guard lock(state_mutex);
    acted_on[f.module] = desired.revision;
    acted_target[f.module] = *target;
    converged_now[f.module] = d.serving_version == target->version;
  }
  f.unpublished = record_of(f, *target, d);
  f.next_publish = {};
  {
    std::lock_guard lock(state_mutex);
    last = f.unpublished;
  }
  (void)publish_record(f);
}

// The bundle `ref` names, from its subject; nullopt (why in `why`) when it cannot be had now.
std::optional<std::vector<std::byte>> fleet_agent::impl::fetch(const std::string& module,
                                                               const fleet::bundle_ref& ref,
                                                               std::string& why) {
  const auto subject = fleet::bundle_subject(module, ref.version, ref.digest);
  nats::message_ptr message;
  try {
    if (!getter) getter.emplace(connection.get());
    message = getter->last_message(options.bus.api_prefix, fleet::bundle_stream(module), subject,
                                   fetch_wait(ref.size));
  } catch (const std::exception& e) {
    why = e.what();
    return std::nullopt;
  }
  if (!message) {
    why = "no bundle on " + subject + " of stream " + fleet::bundle_stream(module);
    return std::nullopt;
  }
  const auto bytes = nats::message_bytes(message.get());
  if (cubridge::detail::sha256_hex(bytes) != ref.digest) {
    why = "the bundle on " + subject + " is not the one the desired state names (SHA-256 differs)";
    return std::nullopt;
  }
  return std::vector<std::byte>(bytes.begin(), bytes.end());
}

fleet::result_record fleet_agent::impl::record_of(const module_follow& f,
                                                  const fleet::bundle_ref& target,
                                                  const gate_decision& d) const {
  fleet::result_record r;
  r.node = options.node;
  r.module = f.module;
  r.revision = f.desired ? f.desired->revision : 0;
  r.digest = target.digest;
  r.version = target.version;
  r.serving_version = d.serving_version;  // came back with the decision
  r.outcome = d.outcome;
  r.reason = to_string(d.reason);
  r.detail = d.detail;
  r.verify_ms = ms_of(d.verify_time);
  r.apply_ms = ms_of(d.apply_time);
  r.time = std::chrono::floor<std::chrono::seconds>(now());
  return r;
}

void fleet_agent::impl::count(const gate_decision& d) {
  switch (d.outcome) {
    case gate_outcome::applied:
    case gate_outcome::rolled_back:
      ++applied;
      return;
    case gate_outcome::duplicate:
      ++duplicates;
      return;
    case gate_outcome::refused:
    case gate_outcome::failed:
      break;
  }
  ++refused;
  std::lock_guard lock(state_mutex);
  ++rejects[std::string(to_string(d.reason))];
}

// The module's unpublished result, signed, stored in the result stream; false when it could not
// go out now (retried on the next pass, never applied again).
void fleet_agent::impl::send_result(const fleet::result_record& r) {
  const auto text = fleet::sign_record(fleet::record_kind::result, fleet::to_json(r), *node_key);
  nats::publish(js.get(), connection.get(), fleet::result_subject(r.module, options.node),
                std::as_bytes(std::span(text.data(), text.size())), "result record", {}, api_wait);
  ++records_published;
}

bool fleet_agent::impl::publish_record(module_follow& f) {
  try {
    send_result(*f.unpublished);
    f.unpublished.reset();
    f.publish_failures = 0;
    return true;
  } catch (const std::exception& e) {
    ++publish_failures;
    f.next_publish = steady::now() + backoff(++f.publish_failures);
    note_problem(std::string("result record not published yet: ") + e.what());
    return false;
  }
}

// --- heartbeats -------------------------------------------------------------------------------

// What the heartbeat says of one module: the sink's launch counters of the serving version, and
// the service's probe.
fleet::module_health fleet_agent::impl::health_of(const module_report& report) const {
  fleet::module_health h;
  h.version = report.current_version;
  if (report.counters) {
    h.launches = report.counters->launches;
    h.launch_failures = report.counters->launch_failures;
    if (report.counters->sticky_error) h.sticky_error = report.counters->last_launch_failure;
  }
  if (!options.health_probe) return h;
  try {
    auto probed = options.health_probe(report.name, report.current_version);
    h.healthy = probed.healthy;
    h.values = std::move(probed.values);
    h.detail = std::move(probed.detail);
  } catch (const std::exception& e) {
    h.healthy = false;
    h.detail = std::string("the health probe threw: ") + e.what();
  } catch (...) {
    h.healthy = false;
    h.detail = "the health probe threw a non-standard exception";
  }
  return h;
}

fleet::heartbeat fleet_agent::impl::heartbeat_now() {
  fleet::heartbeat h;
  h.node = options.node;
  h.cohort = options.cohort;
  if (const auto device = gate->sink().device_capability()) h.gpu = to_string(*device);
  h.interval = options.heartbeat_interval;
  h.time = std::chrono::floor<std::chrono::seconds>(now());
  h.software = fleet::software_text();
  for (const auto& m : modules) h.versions[m] = gate->serving(m);
  for (const auto& report : gate->sink().status())
    if (h.versions.contains(report.name)) h.health[report.name] = health_of(report);
  h.connected = true;  // sent only while connected
  h.boot = boot;
  h.started = started;
  if (const auto record = process_health())
    h.poisoned = fleet::poison_report{record->error_name, record->call,
                                      std::chrono::floor<std::chrono::seconds>(record->at)};
  else if (process_poisoned())  // flagged without a record (no memory for one)
    h.poisoned = fleet::poison_report{{}, {}, h.time};
  std::lock_guard lock(state_mutex);
  for (const auto& [m, revision] : acted_on) h.revisions[m] = revision;
  h.last_result = last;
  h.problem = problem;
  return h;
}

// A `failed` result (sticky_error) per followed module that serves a version, once the process
// is poisoned: for the revision whose bundle serves when the node acted on one (so that a rollout
// waiting for this node's answer halts on it), else for the revision last acted on, with no
// digest (a record about no bundle).
std::vector<fleet::result_record> fleet_agent::impl::poisoned_results() const {
  const auto record = process_health();
  const std::string what = record ? describe(*record) : "poisoned by a sticky CUDA error";
  std::vector<fleet::result_record> out;
  for (const auto& m : modules) {
    fleet::result_record r;
    r.version = r.serving_version = gate->serving(m);
    if (r.version == 0) continue;  // nothing serves: nothing to fail
    r.node = options.node;
    r.module = m;
    r.outcome = gate_outcome::failed;
    r.reason = to_string(gate_reason::sticky_error);
    r.detail = what;
    r.time = std::chrono::floor<std::chrono::seconds>(now());
    std::lock_guard lock(state_mutex);
    if (const auto it = acted_on.find(m); it != acted_on.end()) r.revision = it->second;
    if (const auto it = acted_target.find(m);
        it != acted_target.end() && it->second.version == r.version)
      r.digest = it->second.digest;
    out.push_back(std::move(r));
  }
  return out;
}

// Publishes poisoned_results() (the caller holds the link's shared lock); what cannot go out now
// goes out after the next heartbeat. From the heartbeat thread, never from the poison listener:
// publishing waits for the server, and the listener runs on whichever thread saw the error.
void fleet_agent::impl::publish_poisoned_results() {
  try {
    for (const auto& r : poisoned_results()) {
      send_result(r);
      std::lock_guard lock(state_mutex);
      last = r;
    }
  } catch (const std::exception& e) {
    ++publish_failures;
    {
      std::lock_guard lock(wakeup->mutex);
      wakeup->poison_results_due = true;
    }
    note_problem(std::string("sticky_error result not published yet: ") + e.what());
  }
}

void fleet_agent::impl::run_heartbeats() {
  const auto subject = fleet::heartbeat_subject(options.node);
  do {
    // Sent once connected, whether or not the bucket is bound yet: a node that is up says so
    // even while a swamped server is slow to answer its set-up.
    if (!link_up()) continue;
    try {
      std::shared_lock lock(link_mutex);
      if (!js) continue;
      auto beat = heartbeat_now();
      beat.sequence = ++sequence;  // a beat that fails to go out leaves a gap, never a repeat
      const auto text =
          fleet::sign_record(fleet::record_kind::heartbeat, fleet::to_json(beat), *node_key);
      nats::publish(js.get(), connection.get(), subject,
                    std::as_bytes(std::span(text.data(), text.size())), "heartbeat", {}, api_wait);
      ++heartbeats;
      // Poisoned: the results follow the first heartbeat that says so.
      if (beat.poisoned && take_poison_results()) publish_poisoned_results();
    } catch (const std::exception&) {
      // Missed; the next interval tries again.
    }
  } while (
      !pause_heartbeat(link_up() && heartbeats > 0
                           ? options.heartbeat_interval
                           : std::min(options.heartbeat_interval, std::chrono::milliseconds(100))));
}

// Before the threads start: the flags cleared, and the listener added, which only leaves word
// for the heartbeat thread (publishing waits for the server, and the listener runs on whichever
// thread saw the error). Called at once when the process is poisoned already.
void fleet_agent::impl::listen_for_poison() {
  {
    std::lock_guard lock(wakeup->mutex);
    wakeup->stopping = wakeup->poison_news = wakeup->poison_results_due = false;
  }
  poison_listener = add_poison_listener([wakeup = wakeup](const poison_record&) {
    try {
      {
        std::lock_guard lock(wakeup->mutex);
        wakeup->poison_news = wakeup->poison_results_due = true;
      }
      wakeup->wake.notify_all();
    } catch (...) {  // a listener must not throw; the next heartbeat says poisoned anyway
    }
  });
}

// --- the agent --------------------------------------------------------------------------------

fleet_agent::fleet_agent(std::shared_ptr<update_gate> gate, fleet_agent_options options)
    : impl_(std::make_unique<impl>(std::move(gate), std::move(options))) {
  CUBRIDGE_EXPECTS(impl_->gate != nullptr, "fleet_agent needs an update_gate");
}

fleet_agent::~fleet_agent() {
  stop();
}

void fleet_agent::start() {
  auto& d = *impl_;
  CUBRIDGE_EXPECTS(!d.is_running, "fleet agent already running");
  const auto node_problem = fleet::check_fleet_name(d.options.node, "node id");
  CUBRIDGE_EXPECTS(node_problem.empty(), "fleet_agent_options::node: " + node_problem);
  CUBRIDGE_EXPECTS(d.options.heartbeat_interval.count() > 0 &&
                       d.options.heartbeat_interval <= fleet::max_heartbeat_interval &&
                       d.options.resync_interval.count() > 0 && d.options.retry_first.count() > 0 &&
                       d.options.retry_longest >= d.options.retry_first,
                   "fleet_agent_options: heartbeat_interval (at most 1 h), resync_interval and "
                   "the retry delays must be positive");
  CUBRIDGE_EXPECTS(!d.options.node_key_file.empty(),
                   "fleet_agent_options::node_key_file: node '" + d.options.node +
                       "' needs its own key (cubridge keygen) to sign its results");
  (void)fleet::parse_server_list(d.options.bus.servers);  // a bad list is the caller's mistake
  d.choose_modules();
  if (!d.options.allow_readable_key) {
    std::error_code ec;
    const auto perms = std::filesystem::status(d.options.node_key_file, ec).permissions();
    using std::filesystem::perms;
    CUBRIDGE_EXPECTS(ec || (perms & (perms::group_read | perms::others_read)) == perms::none,
                     "node key file '" + d.options.node_key_file.string() +
                         "' may be read by group or others (chmod 600 it)");
  }
  d.node_key.emplace(read_secret_key_file(d.options.node_key_file));
  // A node of fleet init's NODES account reaches JetStream through the prefix its credentials
  // file names; resolved once, for every JetStream context of the agent.
  d.options.bus.api_prefix = fleet::api_prefix_of(d.options.bus);
  d.gate->start();  // the replay state, before anything is applied
  d.boot = new_boot_id();
  d.started = std::chrono::floor<std::chrono::seconds>(d.now());
  d.sequence = 0;
  auto& c = d.link_options;
  c.bus = d.options.bus;
  c.name = "cubridge-agent-" + d.options.node;
  c.retry_on_failed_connect = true;  // a service starts while the server is down
  (void)nats::make_options(c);       // a CA or credentials file it cannot use: the caller's error
  d.listen_for_poison();
  d.worker = std::thread([&d] { d.run_worker(); });
  d.heartbeater = std::thread([&d] { d.run_heartbeats(); });
  d.is_running = true;
}

void fleet_agent::stop() noexcept {
  auto& d = *impl_;
  if (!d.is_running) return;
  remove_poison_listener(std::exchange(d.poison_listener, 0));
  {
    std::lock_guard lock(d.wakeup->mutex);
    d.wakeup->stopping = true;
  }
  d.wakeup->wake.notify_all();
  d.worker.join();
  d.heartbeater.join();
  d.follows.clear();
  d.ready = false;
  d.getter.reset();
  d.reader.reset();
  d.bucket.reset();
  std::unique_lock lock(d.link_mutex);
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

std::string fleet_agent::connected_server() const {
  if (!connected()) return {};
  std::shared_lock lock(impl_->link_mutex);
  return impl_->connection ? nats::connected_url(impl_->connection.get()) : std::string();
}

std::string fleet_agent::last_problem() const {
  std::lock_guard lock(impl_->state_mutex);
  return impl_->problem;
}

fleet_agent_stats fleet_agent::stats() const noexcept {
  const auto& d = *impl_;
  return {d.applied,          d.duplicates, d.refused,  d.retries,         d.records_published,
          d.publish_failures, d.heartbeats, d.connects, d.desired_refused, d.links_replaced};
}

bool fleet_agent::converged() const {
  std::lock_guard lock(impl_->state_mutex);
  if (impl_->converged_now.size() < impl_->modules.size()) return false;
  for (const auto& [m, yes] : impl_->converged_now)
    if (!yes) return false;
  return true;
}

std::optional<fleet::result_record> fleet_agent::last_result() const {
  std::lock_guard lock(impl_->state_mutex);
  return impl_->last;
}

std::string fleet_agent::metrics_text() const {
  const auto& d = *impl_;
  metrics_text_writer out;
  out.family("cubridge_module_version", "The bundle version serving, per module (0: none).",
             metric_type::gauge);
  for (const auto& m : d.modules) out.sample(d.gate->serving(m), {{"module", m}});
  const auto counter = [&out](const char* name, const char* help, std::uint64_t value) {
    out.family(name, help, metric_type::counter);
    out.sample(value);
  };
  counter("cubridge_fleet_promotions_total", "Bundles applied through the fleet.", d.applied);
  out.family("cubridge_fleet_rejects_total", "Desired bundles refused for good, by reason.",
             metric_type::counter);
  {
    std::lock_guard lock(d.state_mutex);
    for (const auto& [reason, n] : d.rejects) out.sample(n, {{"reason", reason}});
  }
  counter("cubridge_fleet_retries_total",
          "Transient failures retried (fetch, state write, server gone).", d.retries);
  counter("cubridge_fleet_desired_refused_total",
          "Desired-state records refused (signature, format, revision going back).",
          d.desired_refused);
  out.family("cubridge_fleet_agent_connected", "1 while connected and watching.",
             metric_type::gauge);
  out.sample(connected() ? 1u : 0u);
  counter("cubridge_fleet_agent_connects_total",
          "Set-ups: the first and one after each lost connection.", d.connects);
  counter("cubridge_fleet_agent_heartbeats_total", "Heartbeats published.", d.heartbeats);
  counter("cubridge_fleet_agent_publish_failures_total",
          "Result records that could not go out at once (retried).", d.publish_failures);
  counter("cubridge_fleet_agent_links_replaced_total",
          "Connections the client library closed for good and the agent made anew.",
          d.links_replaced);
  out.family("cubridge_fleet_agent_problem",
             "1 while the agent has a problem (why not connected or converged), with the last "
             "problem noted as its label (kept once solved, with the value 0).",
             metric_type::gauge);
  {
    std::lock_guard lock(d.state_mutex);
    if (!d.last_problem.empty())
      out.sample(d.problem.empty() ? 0u : 1u,
                 {{"problem", cubridge::detail::printable(d.last_problem,
                                                          {.max_bytes = 200, .quoted = false})}});
  }
  return std::move(out).str();
}

}  // namespace cubridge
