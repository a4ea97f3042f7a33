// The receiving policy (update_gate.hpp): size, verification, device, replay floor, the replay
// state written before the sink applies, and the sink called under the module's lock. Moved out
// of the endpoint's handlers unchanged (the details are the endpoint's words).
#include <cubridge/bundle/detail/signing.hpp>
#include <cubridge/bundle/rollback_request.hpp>
#include <cubridge/core/detail/enum_names.hpp>
#include <cubridge/core/detail/printable.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/core/image.hpp>
#include <cubridge/core/log.hpp>
#include <cubridge/core/process_health.hpp>
#include <cubridge/update/state_location.hpp>
#include <cubridge/update/update_gate.hpp>

#include "refusal_text.hpp"
#include "state_files.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>

namespace cubridge {
namespace {

constexpr std::array<detail::enum_name<gate_outcome>, 5> gate_outcome_names{{
    {gate_outcome::applied, "applied"},
    {gate_outcome::duplicate, "duplicate"},
    {gate_outcome::refused, "refused"},
    {gate_outcome::failed, "failed"},
    {gate_outcome::rolled_back, "rolled_back"},
}};
static_assert(detail::lists_values_in_order(gate_outcome_names));

constexpr std::size_t max_nonces = 100000;

using update_internal::bounded_detail;

std::chrono::microseconds since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               start);
}

/// Logs a decision of the gate (log.hpp) when the call that made it returns, whichever return
/// that is: info for what changed or was already so, and for requests that did not verify (a
/// stranger's traffic: not worth a warning each); warn for a signed request that was refused.
class logged_decision {
 public:
  logged_decision(std::string_view request, const gate_decision& d) : request_(request), d_(d) {}
  logged_decision(const logged_decision&) = delete;
  logged_decision& operator=(const logged_decision&) = delete;
  ~logged_decision() {
    const bool signed_and_refused = !d_.module.empty() && (d_.outcome == gate_outcome::refused ||
                                                           d_.outcome == gate_outcome::failed);
    const auto l = signed_and_refused ? log::level::warn : log::level::info;
    if (!log::enabled(l)) return;
    try {
      std::string line = "update gate: " + std::string(request_);
      if (!d_.module.empty())
        line += " of module '" + detail::printable(d_.module) + "' v" + std::to_string(d_.version);
      line += ": " + std::string(to_string(d_.outcome));
      if (d_.reason != gate_reason::none)
        line +=
            " (" + std::string(to_string(d_.reason)) + ": " + detail::printable(d_.detail) + ")";
      if (!d_.module.empty()) line += "; v" + std::to_string(d_.serving_version) + " serves";
      log::write(l, line);
    } catch (...) {  // no line, rather than an exception out of a destructor
    }
  }

 private:
  std::string_view request_;
  const gate_decision& d_;
};

// What the gate knows of the payloads it handed to the sink, for its poison listener: per module
// the digest of each version it applied (the newest few), the version in the sink's hands now,
// and the version serving as the gate last saw it. Shared with the listener, which process_health
// may still call after remove_poison_listener returned (it calls a copy, outside its own lock):
// a late call finds `state` null, never a destroyed gate.
class applied_memory {
 public:
  /// Versions whose payload is kept per module: a rollback goes back one; 16 is plenty.
  static constexpr std::size_t kept_versions = 16;

  void attach(update_state* state) {
    std::lock_guard lock(mutex_);
    state_ = state;
  }
  // `version` goes to the sink while `serving` serves. Only a version above it is the suspect
  // while it is applied: new code whose stage or smoke test may fault. One at or below it is
  // going back (a rollback, a halt) to code that served before, and an error then comes more
  // likely from the traffic on what serves.
  void begin_apply(const std::string& module, std::uint64_t version, const std::string& digest,
                   std::uint64_t serving) {
    std::lock_guard lock(mutex_);
    auto& m = modules_[module];
    m.payloads[version] = digest;  // a fixed bundle of the same version replaces the old one
    if (m.payloads.size() > kept_versions) m.payloads.erase(m.payloads.begin());
    m.serving = serving;
    m.applying = version > serving ? version : 0;
  }
  void serving(const std::string& module, std::uint64_t version) {
    std::lock_guard lock(mutex_);
    auto& m = modules_[module];
    m.applying = 0;
    m.serving = version;
  }
  // The process is poisoned: each module's suspect recorded bad (sticky_error) and written at
  // once, since the process ends soon. The suspect is a new version in the sink's hands when
  // there is one (its stage or smoke test ran when the error came), else the one serving, as
  // the swap layer names it (poison_record::running) or as the gate last saw it.
  void on_poison(const poison_record& r) noexcept {
    try {
      std::lock_guard lock(mutex_);
      if (!state_) return;
      for (const auto& [name, m] : modules_) {
        std::uint64_t version = m.applying != 0 ? m.applying : m.serving;
        if (m.applying == 0)
          for (const auto& v : r.running)
            if (v.module == name && v.label != 0) version = v.label;
        const auto payload = m.payloads.find(version);
        if (version == 0 || payload == m.payloads.end()) continue;  // not applied through here
        record(name, version, payload->second, r);
      }
    } catch (...) {  // a listener must not throw; what could not be recorded was logged
    }
  }

 private:
  struct module_memory {
    std::map<std::uint64_t, std::string> payloads;  // version -> payload digest
    std::uint64_t applying = 0;                     // 0: none
    std::uint64_t serving = 0;
  };
  void record(const std::string& name, std::uint64_t version, const std::string& digest,
              const poison_record& r) {
    try {
      if (state_->record_bad({name, digest, version, gate_reason::sticky_error,
                              std::chrono::floor<std::chrono::seconds>(r.at)}))
        log::warn("update gate: module '" + name + "' v" + std::to_string(version) + " (payload " +
                  digest + ") recorded as bad: " + describe(r));
    } catch (const std::exception& e) {
      log::error("update gate: module '" + name + "' v" + std::to_string(version) +
                 " could not be recorded as bad after the process was poisoned: " + e.what());
    }
  }

  // Held only for these maps and the state's record: never across a sink or CUDA call. The
  // listener runs inside such a call, on whichever thread saw the error (one that may hold a
  // module's lock), and takes only this mutex and the state's, so it never waits for a lock its
  // own thread holds.
  std::mutex mutex_;
  update_state* state_ = nullptr;  // the gate's, from its start to its destruction
  std::map<std::string, module_memory, std::less<>> modules_;
};

}  // namespace

std::string_view to_string(gate_outcome outcome) noexcept {
  return detail::name_of(gate_outcome_names, outcome, "unknown");
}

std::optional<gate_outcome> parse_gate_outcome(std::string_view name) noexcept {
  return detail::value_of(gate_outcome_names, name);
}

struct update_gate::impl {
  impl(std::shared_ptr<module_sink> s, update_gate_options o)
      : owned_sink(std::move(s)), sink(*owned_sink), options(std::move(o)) {}
  impl(const impl&) = delete;
  impl& operator=(const impl&) = delete;
  // A listener call under way finishes before the state goes (attach waits for its mutex).
  ~impl() {
    if (poison_listener != 0) remove_poison_listener(poison_listener);
    memory->attach(nullptr);
  }

  std::shared_ptr<module_sink> owned_sink;  // held: the gate cannot outlive its sink
  module_sink& sink;                        // *owned_sink
  update_gate_options options;
  // start() runs once (start_mutex); `started` publishes `state` and `lock` to every door.
  std::mutex start_mutex;
  std::atomic<bool> started{false};
  // The state file's lock, held while the gate lives (none for a state in memory only).
  std::optional<update_internal::state_file_lock> lock;
  // Highest versions and rollback nonces, in memory or persisted; made by start() (the file is
  // known only then: default_state_directory() reads the environment).
  std::unique_ptr<update_state> state;
  // One lock per module, serialising its apply and rollback: a version is applied once. Made
  // only for modules the sink knows or that got a verified bundle, so unauthenticated
  // requests cannot grow the map.
  std::mutex locks_mutex;
  std::map<std::string, std::unique_ptr<std::mutex>, std::less<>> locks;
  // The payloads applied, for the poison listener (added by start(), removed by ~impl).
  std::shared_ptr<applied_memory> memory = std::make_shared<applied_memory>();
  std::uint64_t poison_listener = 0;

  std::chrono::system_clock::time_point now() const {
    return options.clock ? options.clock() : std::chrono::system_clock::now();
  }
  std::mutex& lock_of(const std::string& name) {
    std::lock_guard lock(locks_mutex);
    auto& slot = locks[name];
    if (!slot) slot = std::make_unique<std::mutex>();
    return *slot;
  }
  std::mutex* find_lock(std::string_view name) {
    std::lock_guard lock(locks_mutex);
    const auto it = locks.find(name);
    return it == locks.end() ? nullptr : it->second.get();
  }

  // The sink's answer to `call`; one that throws (a sink must not) is apply_failed with the
  // serving version as the decision knew it.
  template <class Call>
  static sink_result sink_answer(Call&& call, const gate_decision& d) noexcept {
    try {
      return call();
    } catch (const std::exception& x) {
      return {gate_reason::apply_failed, d.previous_version,
              std::string("sink threw: ") + x.what()};
    } catch (...) {
      return {gate_reason::apply_failed, d.previous_version, "sink threw a non-standard exception"};
    }
  }
  // The outcome of a sink's refusal: its version serving already is a duplicate, a failure of
  // the sink or of the version's probation failed, anything else refused.
  static gate_outcome outcome_of_refusal(gate_reason reason, std::uint64_t version,
                                         const sink_result& result) noexcept {
    if (reason == gate_reason::apply_failed || reason == gate_reason::probation_incomplete ||
        marks_bad(reason))
      return gate_outcome::failed;
    if (reason == gate_reason::replayed_version && version != 0 &&
        result.serving_version == version)
      return gate_outcome::duplicate;
    return gate_outcome::refused;
  }
  static gate_decision& refuse(gate_decision& d, gate_reason reason, std::string detail,
                               gate_outcome outcome = gate_outcome::refused) {
    d.outcome = outcome;
    d.reason = reason;
    d.detail = bounded_detail(std::move(detail));
    return d;
  }
  // Before start() the replay state is not loaded: deciding then could accept a replay.
  bool refuse_unstarted(gate_decision& d) const {
    if (started.load(std::memory_order_acquire)) return false;
    refuse(d, gate_reason::not_started, "the update gate was not started (update_gate::start)",
           gate_outcome::failed);
    return true;
  }
  std::filesystem::path resolve_state_file() const;

  std::optional<verified_bundle> verify(std::span<const std::byte> body, gate_decision& d);
  void keep_floor(const std::string& name, std::uint64_t current);
  bool refuse_known_bad(const bundle_manifest& m, gate_decision& d);
  std::string record_bad_payload(const bundle_manifest& m, gate_reason reason);
  void apply_recorded(const verified_bundle& bundle, std::uint64_t seen, apply_rule rule,
                      gate_decision& d);
  std::optional<rollback_request> verify_rollback(std::string_view body, std::string_view expected,
                                                  gate_decision& d);
  bool fresh_rollback(const rollback_request& request, gate_decision& d);
  void apply_rollback(const std::string& name, gate_decision& d);
};

// --- push -------------------------------------------------------------------------------------

// The size check and verify_bundle; nothing when refused (decided in `d`).
std::optional<verified_bundle> update_gate::impl::verify(std::span<const std::byte> body,
                                                         gate_decision& d) {
  if (body.size() > options.max_bundle_bytes) {
    refuse(
        d, gate_reason::too_large,
        std::to_string(body.size()) + " bytes, limit " + std::to_string(options.max_bundle_bytes));
    return std::nullopt;
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    verify_limits limits;
    limits.max_bundle_bytes = options.max_bundle_bytes;
    limits.now = now();
    limits.require_expiry = options.require_expiry;
    limits.max_age = options.max_bundle_age;
    // Whether it runs on the sink's device is verify_bundle's to answer (wrong_device), once:
    // the image it returns records it, and loading it does not decide it again.
    limits.device = sink.device_capability();
    auto bundle = verify_bundle(body, options.keys, limits);
    d.verify_time = since(start);
    return bundle;
  } catch (const bundle_error& e) {
    refuse(d, gate_reason_of(e.reason()), e.involved());
  } catch (const std::exception& e) {
    refuse(d, gate_reason::bad_request, e.what());
  }
  d.verify_time = since(start);
  return std::nullopt;
}

// A version promoted past the gate (a hot_reloader, a direct promote) is a floor too: kept even
// after a rollback below it; a pending version found serving was applied: settled. Best effort;
// the refusal it comes with stands either way.
void update_gate::impl::keep_floor(const std::string& name, std::uint64_t current) {
  try {
    state->store_highest_version(name, current);
  } catch (const std::exception&) {
  }
}

// A payload recorded bad on this node is refused before anything else happens to it: never
// staged, whatever its version, whoever vouches for it.
bool update_gate::impl::refuse_known_bad(const bundle_manifest& m, gate_decision& d) {
  const auto bad = state->find_bad(m.name, m.payload_sha256);
  if (!bad) return false;
  refuse(d, gate_reason::known_bad,
         "payload " + m.payload_sha256 + " of module '" + m.name +
             "' is recorded as bad on this node: " + std::string(to_string(bad->reason)) + " as v" +
             std::to_string(bad->version) + " at " + detail::format_time(bad->time),
         gate_outcome::failed);
  return true;
}

// The sink refused `m` for a reason that marks it bad (a failed probation): its payload recorded,
// so that it is never staged here again. Returns what the detail should add when that could not
// be written ("" when done).
std::string update_gate::impl::record_bad_payload(const bundle_manifest& m, gate_reason reason) {
  try {
    (void)state->record_bad({m.name, m.payload_sha256, m.version, reason,
                             std::chrono::floor<std::chrono::seconds>(now())});
    return {};
  } catch (const std::exception& x) {
    return std::string(" (recorded as bad in memory only: ") + x.what() + ")";
  }
}

// Hands the bundle, its version recorded already (pending), to the sink; once it returns, the
// outcome is known and the record settled. Not applied, the same version may come again, so the
// record goes back to `seen` (the serving version if that was higher; for a resumed apply the
// version itself, which stays refused); should that write fail, the version stays refused (the
// safe side), and the detail says so.
void update_gate::impl::apply_recorded(const verified_bundle& bundle, std::uint64_t seen,
                                       apply_rule rule, gate_decision& d) {
  const auto& m = bundle.manifest;
  const auto start = std::chrono::steady_clock::now();
  memory->begin_apply(m.name, m.version, m.payload_sha256, d.previous_version);
  const auto result = sink_answer([&] { return sink.apply(bundle, rule); }, d);
  memory->serving(m.name, result.serving_version);
  d.apply_time = since(start);
  std::string detail = result.detail;
  if (marks_bad(result.reason)) detail += record_bad_payload(m, result.reason);
  try {
    if (result.reason == gate_reason::none)
      state->settle(m.name);
    else
      state->store_highest_version(m.name, std::max(seen, result.serving_version));
  } catch (const std::exception& x) {
    try {
      state->settle(m.name);  // settled in memory even when this write fails too
    } catch (const std::exception&) {
    }
    detail += std::string(" (v") + std::to_string(m.version) + " stays refused: " + x.what() + ")";
  }
  // What serves comes back with the answer: the sink compared and switched under one lock.
  d.serving_version = result.serving_version;
  if (result.reason == gate_reason::none) {
    d.outcome = gate_outcome::applied;
    return;
  }
  d.highest_version = std::max(d.highest_version, result.serving_version);
  refuse(d, result.reason, detail, outcome_of_refusal(result.reason, m.version, result));
}

gate_decision update_gate::push(std::span<const std::byte> body, std::string_view expected_module,
                                const push_authority* authority) {
  auto& g = *impl_;
  gate_decision d;
  const logged_decision logged("push", d);
  if (g.refuse_unstarted(d)) return d;
  const auto bundle = g.verify(body, d);
  if (!bundle) {
    // Signed by a trusted key, only for another GPU: worth noting for a module already known.
    if (d.reason == gate_reason::wrong_device) d.note = module_note::if_present;
    return d;
  }
  const auto& m = bundle->manifest;
  d.module = m.name;
  d.version = m.version;
  d.manifest = m;
  if (!expected_module.empty() && m.name != expected_module) {
    d.note = module_note::if_present;
    return g.refuse(d, gate_reason::name_mismatch,
                    "URL names module '" + std::string(expected_module) +
                        "', the signed manifest '" + m.name + "'");
  }
  d.note = module_note::always;  // signed by a trusted key: worth remembering
  std::lock_guard serial(g.lock_of(m.name));
  // The serving version is the module's (the sink reads it from the module's chain, whoever
  // promoted); the replay state is the floor: the highest version ever seen applied.
  const std::uint64_t current = g.sink.current_version(m.name);
  const std::uint64_t highest = g.state->highest_version(m.name);  // applied before, or a floor
  const std::uint64_t seen = std::max(current, highest);
  d.previous_version = d.serving_version = current;
  d.highest_version = seen;
  if (g.refuse_known_bad(m, d)) return d;
  // A crash between the record and the sink's answer leaves the version pending; served
  // below it after the restart, that apply never happened or was lost: resumed, not a replay.
  const bool pending = g.state->pending(m.name);
  const bool resumed = pending && m.version == highest && current < highest;
  const bool authorised = authority && authority->version == m.version && m.version != current &&
                          (m.version > current || authority->below_serving);
  if (authorised && m.version <= highest && !resumed) {
    // Below or at the floor by the operator's word: applied, the floor kept (nothing recorded,
    // so the same bundle without that word stays a replay).
    d.detail = "v" + std::to_string(m.version) + " at or below v" + std::to_string(seen) + " by " +
               authority->source;
    // Below what serves only by that word; else compared at the switch as any push.
    g.apply_recorded(*bundle, highest,
                     m.version < current ? apply_rule::operator_word : apply_rule::above_serving,
                     d);
    return d;
  }
  if (m.version <= seen && !resumed && !authorised) {
    if (current > highest || (pending && current == highest)) g.keep_floor(m.name, current);
    return g.refuse(d,
                    m.version == seen ? gate_reason::replayed_version : gate_reason::older_version,
                    "module '" + m.name + "' v" + std::to_string(m.version) + " is not above v" +
                        std::to_string(seen) +
                        (seen == current ? " (serving)" : " (applied before, or the floor)"),
                    m.version == current ? gate_outcome::duplicate : gate_outcome::refused);
  }
  // Recorded as pending (and with a state file written) before the sink sees it: a version
  // that may have been applied is never accepted again once settled, even after a crash
  // between apply and answer; only its interrupted apply may be resumed.
  if (resumed) {
    d.detail = "resumes the unsettled apply of v" + std::to_string(m.version);
  } else {
    try {
      g.state->record_pending(m.name, m.version);
    } catch (const std::exception& x) {
      return g.refuse(d, gate_reason::state_failed, x.what(), gate_outcome::failed);
    }
  }
  g.apply_recorded(
      *bundle, seen,
      authorised && m.version < current ? apply_rule::operator_word : apply_rule::above_serving, d);
  return d;
}

// --- rollback ---------------------------------------------------------------------------------

// verify_rollback_request and the expected name = the signed name; nothing when refused.
std::optional<rollback_request> update_gate::impl::verify_rollback(std::string_view body,
                                                                   std::string_view expected,
                                                                   gate_decision& d) {
  const auto start = std::chrono::steady_clock::now();
  rollback_request request;
  try {
    request = verify_rollback_request(body, options.keys);
  } catch (const bundle_error& e) {
    refuse(d, gate_reason_of(e.reason()),
           e.involved());  // not verified: not noted under the module's name
  } catch (const std::exception& e) {
    refuse(d, gate_reason::bad_request, e.what());
  }
  d.verify_time = since(start);
  if (d.reason != gate_reason::none) return std::nullopt;
  d.module = request.module;
  d.note = module_note::if_present;
  if (!expected.empty() && request.module != expected) {
    refuse(d, gate_reason::name_mismatch,
           "URL names module '" + std::string(expected) + "', the signed request '" +
               request.module + "'");
    return std::nullopt;
  }
  return request;
}

// Whether `request` was created within the rollback window and its nonce is new (then
// remembered); refused in `d` otherwise.
bool update_gate::impl::fresh_rollback(const rollback_request& request, gate_decision& d) {
  const auto now = std::chrono::floor<std::chrono::seconds>(this->now());
  const auto skew = request.created > now ? request.created - now : now - request.created;
  if (skew > options.rollback_window) {
    refuse(d, gate_reason::expired_request,
           "request created " + detail::format_time(request.created) + ", endpoint time " +
               detail::format_time(now) + ", window " +
               std::to_string(options.rollback_window.count()) + " s");
    return false;
  }
  // A nonce is remembered (and with a state file written, before anything is done) while its
  // request could still be fresh; older ones are dropped.
  nonce_outcome fresh = nonce_outcome::full;
  try {
    fresh = state->remember_nonce(request.nonce, request.created, now - 2 * options.rollback_window,
                                  max_nonces);
  } catch (const std::exception& x) {
    refuse(d, gate_reason::state_failed, x.what(), gate_outcome::failed);
    return false;
  }
  if (fresh == nonce_outcome::replayed) {
    refuse(d, gate_reason::replayed_request, "nonce " + request.nonce + " was used before");
    return false;
  }
  if (fresh == nonce_outcome::full) {
    d.note = module_note::none;
    refuse(d, gate_reason::busy, "too many rollback requests in the window");
    return false;
  }
  return true;
}

// The sink's rollback, its outcome in `d`; the caller holds the module's lock.
void update_gate::impl::apply_rollback(const std::string& name, gate_decision& d) {
  const auto start = std::chrono::steady_clock::now();
  const auto result = sink_answer([&] { return sink.rollback(name); }, d);
  memory->serving(name, result.serving_version);
  d.apply_time = since(start);
  d.serving_version = result.serving_version;
  if (result.reason == gate_reason::none) {
    d.outcome = gate_outcome::rolled_back;
    d.version = result.serving_version;
    return;
  }
  refuse(d, result.reason, result.detail, outcome_of_refusal(result.reason, 0, result));
}

gate_decision update_gate::rollback(std::string_view signed_request,
                                    std::string_view expected_module) {
  auto& g = *impl_;
  gate_decision d;
  const logged_decision logged("rollback", d);
  if (g.refuse_unstarted(d)) return d;
  const auto request = g.verify_rollback(signed_request, expected_module, d);
  if (!request || !g.fresh_rollback(*request, d)) return d;
  const std::string& name = request->module;
  const std::uint64_t known = g.sink.current_version(name);
  std::mutex* module_lock = g.find_lock(name);
  d.previous_version = d.serving_version = known;
  if (!module_lock && known == 0) {
    d.note = module_note::none;
    return g.refuse(d, gate_reason::unknown_module, "no module '" + name + "'");
  }
  if (!module_lock) module_lock = &g.lock_of(name);
  d.note = module_note::always;
  std::lock_guard serial(*module_lock);
  const std::uint64_t current = g.sink.current_version(name);
  d.previous_version = d.serving_version = current;
  if (request->from_version != current)
    return g.refuse(d, gate_reason::version_mismatch,
                    "request rolls back from v" + std::to_string(request->from_version) + ", v" +
                        std::to_string(current) + " serves");
  // The version rolled back from was applied, by the gate or past it: it is the floor from now
  // on (recorded before the sink is called, as for a push), settled: an unsettled apply is not
  // resumed after an operator's rollback.
  const std::uint64_t highest = g.state->highest_version(name);
  if (current > highest || g.state->pending(name)) {
    try {
      g.state->store_highest_version(name, std::max(current, highest));
    } catch (const std::exception& x) {
      return g.refuse(d, gate_reason::state_failed, x.what(), gate_outcome::failed);
    }
  }
  g.apply_rollback(name, d);
  return d;
}

// --- the gate ---------------------------------------------------------------------------------

std::shared_ptr<update_gate> update_gate::create(std::shared_ptr<module_sink> sink,
                                                 update_gate_options options) {
  return std::make_shared<update_gate>(std::move(sink), std::move(options));
}

namespace {
// The sink a gate is given, checked before anything dereferences it.
std::shared_ptr<module_sink> given_sink(std::shared_ptr<module_sink> sink) {
  CUBRIDGE_EXPECTS(sink != nullptr, "update_gate needs a module_sink");
  return sink;
}
}  // namespace

update_gate::update_gate(std::shared_ptr<module_sink> sink, update_gate_options options)
    : impl_(std::make_unique<impl>(given_sink(std::move(sink)), std::move(options))) {}

update_gate::~update_gate() = default;

// The file named, else the default one while persisting, else none (memory only).
std::filesystem::path update_gate::impl::resolve_state_file() const {
  if (!options.state_file.empty()) return options.state_file;
  if (!options.persist_state) return {};
  const auto dir = default_state_directory();
  update_internal::create_state_directory(dir);
  return dir / default_state_file_name;
}

// The replay state, before anything is decided: a file that cannot be read or is another
// gate's stops the start (ignoring it would accept every old bundle again). Everything is built
// aside and published at the end, so a failed start leaves the gate as it was.
void update_gate::start() {
  auto& g = *impl_;
  if (g.started.load(std::memory_order_acquire)) return;
  std::lock_guard once(g.start_mutex);
  if (g.started.load(std::memory_order_relaxed)) return;  // another door started it meanwhile
  for (const auto& [name, floor] : g.options.version_floor)
    CUBRIDGE_EXPECTS(
        check_module_name(name).empty() && detail::check_signed_text(name).empty(),
        "update_gate_options::version_floor names no module: " + detail::printable(name));
  const auto file = g.resolve_state_file();
  std::optional<update_internal::state_file_lock> lock;
  if (!file.empty()) lock.emplace(file);  // before reading: the file is ours from here on
  auto state = std::make_unique<update_state>(file);
  state->load();
  for (const auto& [name, floor] : g.options.version_floor)
    state->raise_highest_version(name, floor);
  // Listening before anything is published (it may throw); a call before attach() records
  // nothing, and nothing was applied before the start anyway.
  const auto listener =
      add_poison_listener([memory = g.memory](const poison_record& r) { memory->on_poison(r); });
  g.lock = std::move(lock);
  g.state = std::move(state);
  g.memory->attach(g.state.get());
  g.poison_listener = listener;
  g.started.store(true, std::memory_order_release);
}

bool update_gate::started() const noexcept {
  return impl_->started.load(std::memory_order_acquire);
}

std::filesystem::path update_gate::state_file() const {
  return started() ? impl_->state->file() : std::filesystem::path{};
}

std::uint64_t update_gate::highest_version(std::string_view module) const {
  return started() ? impl_->state->highest_version(module) : 0;
}

std::uint64_t update_gate::serving(std::string_view module) const {
  return impl_->sink.current_version(module);
}

std::optional<gate_decision> update_gate::already_serving(std::string_view module,
                                                          std::uint64_t version) const {
  const auto current = serving(module);
  if (version == 0 || current != version) return std::nullopt;
  gate_decision d;
  d.outcome = gate_outcome::duplicate;
  d.reason = gate_reason::replayed_version;
  d.module = std::string(module);
  d.version = d.serving_version = d.previous_version = current;
  d.highest_version = std::max(current, highest_version(module));
  d.detail = "v" + std::to_string(current) + " serves already";
  return d;
}

void update_gate::record_bad(std::string_view module, std::string_view digest,
                             std::uint64_t version, gate_reason reason) {
  CUBRIDGE_EXPECTS(started(), "recording a bad version of module " + detail::printable(module) +
                                  " before update_gate::start");
  const auto when = std::chrono::floor<std::chrono::seconds>(impl_->now());
  (void)impl_->state->record_bad({std::string(module), std::string(digest), version, reason, when});
}

std::vector<bad_version> update_gate::bad_versions() const {
  return started() ? impl_->state->bad_versions() : std::vector<bad_version>{};
}

module_sink& update_gate::sink() const noexcept {
  return impl_->sink;
}

const update_gate_options& update_gate::options() const noexcept {
  return impl_->options;
}

}  // namespace cubridge
