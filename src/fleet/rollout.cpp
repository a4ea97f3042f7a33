// Publishing, the canary policy and rollback (controller.hpp, docs/fleet.md): each a change of a
// module's desired state by compare-and-set. Nodes act on the state, not on these calls: a
// publish that stored its bundle and wrote its record is done whatever happens to this process.
#include "fleet/controller_impl.hpp"

#include <cubridge/bundle/detail/signing.hpp>
#include <cubridge/core/detail/printable.hpp>
#include <cubridge/fleet/signed_record.hpp>
#include <cubridge/fleet/subjects.hpp>

#include <nats/nats.h>

#include <algorithm>
#include <set>
#include <span>

namespace cubridge::fleet {
namespace {

using steady = std::chrono::steady_clock;

std::string seconds_text(std::chrono::milliseconds window) {
  const auto ms = window.count();
  return ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
}

// "canary n2 refused v3: stage_refused: smoke test failed".
std::string failure_reason(const result_record& r) {
  return "canary " + r.node + " " + std::string(to_string(r.outcome)) + " v" +
         std::to_string(r.version) + (r.reason.empty() ? "" : ": " + r.reason) +
         (r.detail.empty() ? "" : ": " + r.detail);
}

// Whether the node runs the version after this result.
bool succeeded(const result_record& r) {
  return (r.outcome == gate_outcome::applied || r.outcome == gate_outcome::duplicate) &&
         r.serving_version == r.version;
}

std::string now_text() {
  return cubridge::detail::format_time(
      std::chrono::floor<std::chrono::seconds>(std::chrono::system_clock::now()));
}

// A bundle about to be published: verified as a node will verify it, and how the desired state
// names it.
struct prepared_bundle {
  verified_bundle bundle;
  bundle_ref ref;
  const std::string& module() const { return bundle.manifest.name; }
};

prepared_bundle prepare(std::span<const std::byte> bytes, const trusted_keys& keys) {
  verify_limits limits;
  limits.max_bundle_bytes = std::max<std::size_t>(bytes.size(), 1);
  prepared_bundle p{verify_bundle(bytes, keys, limits), {}};
  const auto& m = p.bundle.manifest;
  if (const auto problem = check_fleet_name(m.name, "module name"); !problem.empty())
    cubridge::detail::throw_errc(errc::precondition, "publish",
                                 "bundle of module '" + cubridge::detail::printable(m.name) +
                                     "': " + problem + " (docs/fleet.md: one subject token)");
  p.ref = {m.version, cubridge::detail::sha256_hex(bytes), bytes.size(), m.target};
  return p;
}

// The highest version the state asks any node to run.
std::uint64_t highest_desired(const desired_state& s) {
  std::uint64_t v = s.stable ? s.stable->version : 0;
  if (s.phase == rollout_phase::canary && s.candidate) v = std::max(v, s.candidate->version);
  return v;
}

// Refuses a version that would take the desired state down (or the same version with another
// bundle): only rollback() goes down.
void require_newer(const desired_state& s, const bundle_ref& ref) {
  const auto highest = highest_desired(s);
  if (ref.version > highest) return;
  const bool same_version = (s.stable && s.stable->version == ref.version) ||
                            (s.candidate && s.candidate->version == ref.version);
  detail::fail(fleet_errc::older_version,
               "v" + std::to_string(ref.version) +
                   (same_version ? " is desired already with another bundle (another digest)"
                                 : " is below the desired v" + std::to_string(highest)) +
                   ": publish a higher version, or go back with `cubridge fleet rollback`",
               "publish",
               "desired state of module '" + s.module + "' revision " + std::to_string(s.revision));
}

// `s` with `ref` as its stable bundle: the old stable one joins the history.
void make_stable(desired_state& s, const bundle_ref& ref) {
  if (s.stable && s.stable != ref) {
    s.history.push_back(*s.stable);
    if (s.history.size() > max_desired_history) s.history.erase(s.history.begin());
  }
  s.stable = ref;
  s.candidate.reset();
  s.canaries.clear();
  s.phase = rollout_phase::complete;
  s.reason.clear();
  s.reason_version = 0;
}

// The highest revision any record of `module`'s key still in the bucket's history names
// (verified with `keys`; others do not count).
std::uint64_t highest_revision_held(kvStore* bucket, std::string_view module,
                                    const trusted_keys& keys) {
  kvEntryList list{};
  const auto key = desired_key(module);
  if (kvStore_History(&list, bucket, key.c_str(), nullptr) != NATS_OK) return 0;
  std::uint64_t highest = 0;
  for (int i = 0; i < list.Count; ++i) {
    const auto* data = static_cast<const char*>(kvEntry_Value(list.Entries[i]));
    const std::string_view value(data ? data : "",
                                 static_cast<std::size_t>(kvEntry_ValueLen(list.Entries[i])));
    if (const auto opened = open_record(value, record_kind::desired_state, keys))
      if (const auto s = parse_desired_state(opened->body))
        highest = std::max(highest, s->revision);
  }
  kvEntryList_Destroy(&list);
  return highest;
}

desired_state parse_current(const std::optional<detail::kv_value>& current, std::string_view module,
                            const trusted_keys& keys) {
  desired_state s;
  s.module = module;
  if (!current) return s;
  record_refusal refusal;
  const auto opened = open_record(current->value, record_kind::desired_state, keys, &refusal);
  auto parsed = opened ? parse_desired_state(opened->body, &refusal.why) : std::nullopt;
  if (!parsed || parsed->module != module)
    detail::fail(fleet_errc::invalid_state,
                 "holds a desired state that is refused: " +
                     (parsed ? "it names module '" + parsed->module + "'" : refusal.why) +
                     "; remove the key by hand (nats kv del) after checking who wrote it",
                 "read desired state", "key " + desired_key(module));
  return std::move(*parsed);
}

// `s` as the next revision, signed: numbered above every revision the key's history in the
// bucket still holds, not only above the current value's.
std::string sign_next_revision(desired_state& s, kvStore* bucket, const trusted_keys& keys,
                               const secret_key& operator_key) {
  s.revision = std::max(s.revision, highest_revision_held(bucket, s.module, keys)) + 1;
  s.time = now_text();
  s.software = software_text();
  return sign_record(record_kind::desired_state, to_json(s), operator_key);
}

// The nodes that may be canaries of `p`: live, following its module, able to run it, of
// `cohort` unless that is empty; in node-id order.
std::vector<std::string> eligible_canaries(const std::vector<node_state>& nodes,
                                           const prepared_bundle& p, std::string_view cohort) {
  const auto& m = p.bundle.manifest;
  std::vector<std::string> eligible;
  for (const auto& node : nodes) {
    if (!node.live || !node.beat || !node.beat->versions.contains(m.name)) continue;
    if (!cohort.empty()) {
      const auto label = node.labels.find("cohort");
      if (label == node.labels.end() || label->second != cohort) continue;
    }
    if (!node.beat->gpu.empty()) {
      const auto gpu = parse_compute_capability(node.beat->gpu);
      if (!gpu) continue;
      const bool runs = m.kind == payload_kind::cuda_source
                            ? m.target_capability.numbers() == gpu->numbers()
                            : p.bundle.image && can_run_on(*p.bundle.image, *gpu);
      if (!runs) continue;
    }
    eligible.push_back(node.node);
  }
  return eligible;
}

void require_enough(const std::vector<std::string>& eligible, const canary_policy& policy,
                    const prepared_bundle& p) {
  if (eligible.size() >= policy.canaries) return;
  cubridge::detail::throw_errc(
      errc::precondition, "rollout",
      std::to_string(eligible.size()) + " node(s) qualify for " + std::to_string(policy.canaries) +
          " canaries of module '" + p.module() + "' (live, following it, able to run " +
          p.ref.target + (policy.cohort.empty() ? "" : ", of cohort " + policy.cohort) + ")");
}

// `s` asking `canaries` to run `candidate` while the others stay on the stable bundle.
void enter_canary_phase(desired_state& s, const bundle_ref& candidate,
                        std::vector<std::string> canaries) {
  s.phase = rollout_phase::canary;
  s.candidate = candidate;
  s.canaries = std::move(canaries);
  std::sort(s.canaries.begin(), s.canaries.end());
  s.reason.clear();
  s.reason_version = 0;
}

// `s` back on its stable bundle everywhere, with why `candidate` went no further.
void halt(desired_state& s, const bundle_ref& candidate, std::string reason) {
  s.phase = rollout_phase::halted;
  s.candidate.reset();
  s.canaries.clear();
  s.reason = std::move(reason);
  s.reason_version = candidate.version;
}

// The canaries' answers to one rollout's revision and digest, each node counted once: the first
// failure halts the rollout and gives its reason.
struct canary_tally {
  rollout_report& report;
  std::string_view digest;
  std::set<std::string> canaries{report.canaries.begin(), report.canaries.end()};
  std::set<std::string> applied, failed;

  void operator()(result_record record) {
    if (!canaries.contains(record.node) || record.revision != report.desired.revision ||
        record.digest != digest || applied.contains(record.node) || failed.contains(record.node))
      return;
    if (succeeded(record)) {
      applied.insert(record.node);
    } else {
      failed.insert(record.node);
      if (report.halt_reason.empty()) report.halt_reason = failure_reason(record);
    }
    report.results.push_back(std::move(record));
  }
};

// Hands each of `nodes`' stored last result for `module` that verifies to `take`, within
// `deadline`: one read that times out (a server busy sending bundles) loses only that node's
// stored result, which a watch may still bring.
template <class Take>
void take_stored_results(jsCtx* js, std::string_view module, std::span<const std::string> nodes,
                         const node_registry& registry, steady::time_point deadline, Take& take) {
  for (const auto& node : nodes) {
    if (steady::now() >= deadline) return;
    const auto subject = result_subject(module, node);
    try {
      if (const auto m = detail::last_message(js, std::string(result_stream), subject)) {
        std::string why;
        if (auto r = verified_result(subject, detail::message_text(m.get()), module, registry, why))
          take(std::move(*r));
      }
    } catch (const error& e) {
      if (e.is(fleet_errc::unreachable)) throw;
    }
  }
}

}  // namespace

rollout_report controller::publish(std::span<const std::byte> bytes,
                                   const secret_key& operator_key) {
  auto& d = *impl_;
  const auto keys = d.keys_with(operator_key);
  const auto p = prepare(bytes, keys);
  const auto& module = p.module();
  rollout_report report;
  report.version = p.ref.version;
  d.store_bundle(module, p.ref, bytes);
  d.compare_and_set(desired_key(module), [&](const auto& current) {
    auto s = parse_current(current, module, keys);
    report.already_desired = s.stable == p.ref && s.phase != rollout_phase::canary;
    if (report.already_desired) {
      report.desired = s;
      return current->value;  // the same value: a retried publish writes nothing new
    }
    if (!(s.phase == rollout_phase::canary && s.candidate == p.ref)) require_newer(s, p.ref);
    make_stable(s, p.ref);
    auto value = sign_next_revision(s, d.bucket.get(), keys, operator_key);
    report.desired = s;
    return value;
  });
  report.completed = true;
  return report;
}

rollout_report controller::rollout(std::span<const std::byte> bytes, const canary_policy& policy,
                                   const secret_key& operator_key) {
  auto& d = *impl_;
  const std::size_t wanted = policy.successes == 0 ? policy.canaries : policy.successes;
  CUBRIDGE_EXPECTS(
      policy.canaries > 0 && wanted <= policy.canaries && policy.canaries <= max_desired_canaries,
      "canary policy: 1 to 10,000 canaries, K successes 1 to N");
  CUBRIDGE_EXPECTS(policy.window.count() > 0, "canary policy: the window must be positive");
  const auto keys = d.keys_with(operator_key);
  const auto p = prepare(bytes, keys);
  const auto& module = p.module();
  rollout_report report;
  report.version = p.ref.version;
  const auto registry = this->registry();
  const auto eligible = eligible_canaries(nodes(), p, policy.cohort);

  result_watch watch(d.connection.get(), module, registry);  // first: no result is missed
  d.store_bundle(module, p.ref, bytes);
  d.compare_and_set(desired_key(module), [&](const auto& current) {
    auto s = parse_current(current, module, keys);
    if (s.phase == rollout_phase::canary && s.candidate == p.ref) {  // resumed
      report.canaries = s.canaries;
      report.desired = s;
      return current->value;
    }
    if (s.stable == p.ref && s.phase != rollout_phase::canary) {
      report.already_desired = true;
      report.desired = s;
      return current->value;
    }
    require_newer(s, p.ref);
    require_enough(eligible, policy, p);
    report.canaries.assign(eligible.begin(),
                           eligible.begin() + static_cast<std::ptrdiff_t>(policy.canaries));
    enter_canary_phase(s, p.ref, report.canaries);
    auto value = sign_next_revision(s, d.bucket.get(), keys, operator_key);
    report.desired = s;
    return value;
  });
  if (report.already_desired) {
    report.completed = true;
    return report;
  }

  const auto deadline = steady::now() + policy.window;
  canary_tally tally{report, p.ref.digest};
  take_stored_results(d.js.get(), module, report.canaries, registry, deadline, tally);
  while (tally.applied.size() < wanted && report.halt_reason.empty())
    if (auto record = watch.next(deadline))
      tally(std::move(*record));
    else
      break;
  if (report.halt_reason.empty() && tally.applied.size() < wanted)
    report.halt_reason = std::to_string(tally.applied.size()) + " of " + std::to_string(wanted) +
                         " canary results `applied` within " + seconds_text(policy.window);

  // Promoted or halted, only if the state is still this rollout's (another writer may have
  // gone further meanwhile: then that writer's word stands).
  const auto revision = report.desired.revision;
  d.compare_and_set(desired_key(module), [&](const auto& current) {
    auto s = parse_current(current, module, keys);
    if (s.revision != revision)
      detail::fail(fleet_errc::conflict,
                   "changed by another writer during the rollout (revision " +
                       std::to_string(revision) + " is now " + std::to_string(s.revision) +
                       "): this rollout's outcome is not written",
                   "rollout", "desired state of module '" + module + "'");
    if (report.halt_reason.empty())
      make_stable(s, p.ref);
    else
      halt(s, p.ref, report.halt_reason);
    auto value = sign_next_revision(s, d.bucket.get(), keys, operator_key);
    report.desired = s;
    return value;
  });
  report.completed = report.halt_reason.empty();
  return report;
}

desired_state controller::rollback(std::string_view module, std::uint64_t to_version,
                                   const secret_key& operator_key) {
  auto& d = *impl_;
  impl::require_name(module, "module name");
  const auto keys = d.keys_with(operator_key);
  desired_state written;
  d.compare_and_set(desired_key(module), [&](const auto& current) {
    auto s = parse_current(current, module, keys);
    const auto from = highest_desired(s);
    auto target = s.history.end();
    if (to_version == 0 && !s.history.empty()) target = std::prev(s.history.end());
    if (to_version != 0)
      target = std::find_if(s.history.begin(), s.history.end(),
                            [&](const bundle_ref& r) { return r.version == to_version; });
    if (target == s.history.end())
      detail::fail(fleet_errc::invalid_state,
                   to_version == 0 ? "has no earlier stable version to go back to"
                                   : "has no v" + std::to_string(to_version) +
                                         " among its earlier stable versions (the last " +
                                         std::to_string(max_desired_history) + " are kept)",
                   "rollback", "desired state of module '" + std::string(module) + "'");
    const bundle_ref back = *target;
    s.history.erase(target, s.history.end());
    s.stable = back;
    s.candidate.reset();
    s.canaries.clear();
    s.phase = rollout_phase::rolled_back;
    s.reason =
        "operator rollback from v" + std::to_string(from) + " to v" + std::to_string(back.version);
    s.reason_version = from;
    auto value = sign_next_revision(s, d.bucket.get(), keys, operator_key);
    written = s;
    return value;
  });
  return written;
}

std::vector<result_record> controller::wait_for_results(std::string_view module,
                                                        std::uint64_t revision,
                                                        std::string_view digest,
                                                        std::span<const std::string> nodes,
                                                        std::chrono::milliseconds timeout) {
  const auto registry = this->registry();
  result_watch watch(impl_->connection.get(), module, registry);  // first: nothing falls between
  std::set<std::string> waiting(nodes.begin(), nodes.end());
  std::vector<result_record> seen;
  const auto take = [&](result_record record) {
    if (record.revision == revision && record.digest == digest && waiting.erase(record.node) > 0)
      seen.push_back(std::move(record));
  };
  const auto deadline = steady::now() + timeout;
  take_stored_results(impl_->js.get(), module, nodes, registry, deadline, take);
  while (!waiting.empty())
    if (auto record = watch.next(deadline))
      take(std::move(*record));
    else
      break;
  return seen;
}

}  // namespace cubridge::fleet
