// The steps publish, the canary policy, rollback and wave rollouts are made of
// (rollout_steps.hpp).
#include "fleet/rollout_steps.hpp"

#include <cubridge/bundle/detail/signing.hpp>
#include <cubridge/core/detail/printable.hpp>
#include <cubridge/fleet/signed_record.hpp>
#include <cubridge/fleet/subjects.hpp>

#include <nats/nats.h>

#include <algorithm>

namespace cubridge::fleet::rollout_steps {

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

bool desired_everywhere(const desired_state& s, const bundle_ref& ref) {
  return s.stable == ref && s.phase != rollout_phase::canary;
}

std::optional<bundle_ref> same_payload_desired(jsCtx* js, const desired_state& s,
                                               const prepared_bundle& p, const trusted_keys& keys) {
  if (!s.stable || s.phase == rollout_phase::canary || s.stable->version != p.ref.version ||
      s.stable->target != p.ref.target || s.stable->digest == p.ref.digest)
    return std::nullopt;
  try {
    const auto stored = detail::last_message(
        js, bundle_stream(s.module), bundle_subject(s.module, s.stable->version, s.stable->digest));
    if (!stored) return std::nullopt;
    const auto bytes = detail::message_bytes(stored.get());
    if (cubridge::detail::sha256_hex(bytes) != s.stable->digest) return std::nullopt;
    verify_limits limits;
    limits.max_bundle_bytes = std::max<std::size_t>(bytes.size(), 1);
    const auto desired = verify_bundle(bytes, keys, limits);
    // Everything signed but the time of signing: an expiry, a kind or a key of its own makes
    // it another bundle.
    const auto& a = desired.manifest;
    const auto& b = p.bundle.manifest;
    if (a.payload_sha256 != b.payload_sha256 || a.name != b.name || a.kind != b.kind ||
        a.payload_size != b.payload_size || a.expires != b.expires || a.key_id != b.key_id)
      return std::nullopt;
  } catch (const error& e) {
    if (e.is(fleet_errc::unreachable)) throw;
    return std::nullopt;  // not readable or not verifiable: judged as another bundle
  }
  return s.stable;
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
  s.waves.reset();
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
  s.waves.reset();  // a wave rollout sets its plan after this
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

}  // namespace cubridge::fleet::rollout_steps
