// Wave rollouts, resume and abort (controller.hpp, docs/fleet.md "Progressive delivery"). The
// plan lives in the desired state: each step is a compare-and-set of the module's record, and a
// controller that stops between steps leaves a record the next one carries on from.
#include "fleet/controller_impl.hpp"
#include "fleet/rollout_steps.hpp"

#include <cubridge/core/detail/check.hpp>
#include <cubridge/core/detail/printable.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <thread>

namespace cubridge::fleet {
using namespace rollout_steps;

namespace {

using system_clock = std::chrono::system_clock;

// How a run paces itself.
struct wave_policy_timing {
  std::chrono::milliseconds poll{500};  // between heartbeat reads during a bake
};

// The percentage of a wave written "P%", nullopt for a count of nodes.
std::optional<unsigned> percent_of(std::string_view wave) {
  if (!wave.ends_with('%')) return std::nullopt;
  unsigned value = 0;
  wave.remove_suffix(1);
  std::from_chars(wave.data(), wave.data() + wave.size(), value);
  return value;
}

// A whole decimal number from `lowest` to `highest`, nothing else; 0 otherwise.
std::size_t whole_number(std::string_view text, std::size_t lowest, std::size_t highest) {
  std::size_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc{} || end != text.data() + text.size() || text[0] == '0' ||
      value < lowest || value > highest)
    return 0;
  return value;
}

std::vector<std::string> all_nodes_to(const wave_plan& plan, std::size_t wave) {
  std::vector<std::string> nodes;
  for (std::size_t i = 0; i <= wave && i < plan.nodes.size(); ++i)
    nodes.insert(nodes.end(), plan.nodes[i].begin(), plan.nodes[i].end());
  std::sort(nodes.begin(), nodes.end());
  return nodes;
}

health_limits limits_of(const wave_plan& plan) {
  return {plan.max_failure_rate, plan.max_metrics, plan.baseline_breach_halts};
}

// One run of a module's waves, from the wave its desired state names to the end or a halt.
class wave_run {
 public:
  wave_run(controller& control, controller::impl& d, trusted_keys keys,
           const secret_key& operator_key, std::string module, rollout_report& report)
      : control_(control),
        d_(d),
        keys_(std::move(keys)),
        key_(operator_key),
        module_(std::move(module)),
        report_(report),
        registry_(control.registry()),
        watch_(d.connection.get(), module_, registry_) {}

  /// Writes the record `change` makes of the current one, if the current one is still the
  /// record this run wrote or read last; a change by anyone else ends the run (conflict).
  template <class Change>
  void write(Change change) {
    const auto revision = report_.desired.revision;
    d_.write_desired(module_, [&](const auto& current) {
      auto s = parse_current(current, module_, keys_);
      if (s.revision != revision)
        detail::fail(fleet_errc::conflict,
                     "changed by another writer during the wave rollout (revision " +
                         std::to_string(revision) + " is now " + std::to_string(s.revision) +
                         (s.phase == rollout_phase::halted ? ", halted: " + s.reason : "") +
                         "): this controller stops",
                     "rollout_waves", "desired state of module '" + module_ + "'");
      change(s);
      auto value = sign_next_revision(s, d_.bucket.get(), keys_, key_);
      report_.desired = s;
      return value;
    });
  }

  /// Runs the waves from the one report_.desired names.
  void run(const wave_policy_timing& timing) {
    timing_ = timing;
    for (;;) {
      const auto& plan = *report_.desired.waves;
      const std::size_t wave = plan.wave;
      const auto candidate = plan.candidate;
      event(wave, rollout_step::started,
            std::to_string(report_.desired.canaries.size()) + " node(s) on v" +
                std::to_string(candidate.version));
      const auto started = cubridge::detail::parse_time(plan.started);
      deadline_ =
          (started ? system_clock::time_point(*started) : system_clock::now()) + plan.deadline;
      runs_at_start_ = runs_of(control_.nodes());
      if (!wait_until_applied(wave) || !bake(wave)) return;
      event(wave, rollout_step::passed, "healthy for " + seconds_text(plan.bake));
      if (wave + 2 >= plan.sizes.size()) {  // the next wave is every node: the candidate is stable
        write([&](desired_state& s) { make_stable(s, candidate); });
        event(wave + 1, rollout_step::completed,
              "v" + std::to_string(candidate.version) + " stable");
        report_.completed = true;
        return;
      }
      write([&](desired_state& s) {
        auto& p = *s.waves;
        p.wave = wave + 1;
        p.started = now_text();
        s.canaries = all_nodes_to(p, p.wave);
      });
    }
  }

  /// Halts the rollout at `wave`: the candidate goes, the plan stays (resume runs it again).
  void halt_at(std::size_t wave, halt_signal signal, std::string node, std::string reason,
               std::string metric = {}) {
    report_.halt_reason = reason;
    report_.halt_signal = signal;
    report_.halt_metric = std::move(metric);
    report_.halt_node = std::move(node);
    const auto candidate = report_.desired.waves->candidate;
    write([&](desired_state& s) {
      halt(s, candidate,
           "wave " + std::to_string(wave + 1) + " of " + std::to_string(s.waves->sizes.size()) +
               ": " + reason);
      s.waves->wave = wave;  // halted: the phase says so, the plan stays for resume
    });
    event(wave, rollout_step::halted, report_.halt_reason);
  }

 private:
  void event(std::size_t wave, rollout_step what, std::string detail) {
    report_.timeline.push_back({system_clock::now(), wave, what, std::move(detail)});
  }

  steady::time_point steady_deadline() const {
    const auto left = deadline_ - system_clock::now();
    return steady::now() + std::max<system_clock::duration>(left, system_clock::duration::zero());
  }

  // Every node of the waves so far answers this revision with the candidate serving; false when
  // the rollout halted (a node refused it, or the deadline passed).
  bool wait_until_applied(std::size_t wave) {
    report_.canaries = report_.desired.canaries;
    report_.results.clear();
    canary_tally tally{report_, report_.desired.waves->candidate.digest};
    const auto asked = system_clock::now();
    // A canary that dies before its result is as lost as one that dies in the bake: its
    // heartbeats are looked at between results, never only the deadline awaited.
    evidence lost;
    collect_canary_results(d_.js.get(), watch_, module_, registry_, tally, report_.canaries.size(),
                           steady_deadline(), timing_.poll, [&] {
                             lost = check_evidence(control_.nodes(), asked, system_clock::now(),
                                                   evidence_of::liveness);
                             return lost.signal == halt_signal::none;
                           });
    if (lost.signal != halt_signal::none) {
      halt_at(wave, lost.signal, lost.node, lost.reason + " (before its result came)");
      return false;
    }
    if (!report_.halt_reason.empty()) {
      const auto reason = report_.halt_reason;
      std::string node = tally.failed.empty() ? std::string() : *tally.failed.begin();
      halt_at(wave, halt_signal::result, std::move(node), reason);
      return false;
    }
    if (tally.applied.size() < report_.canaries.size()) {
      halt_at(wave, halt_signal::deadline, "",
              std::to_string(tally.applied.size()) + " of " +
                  std::to_string(report_.canaries.size()) +
                  " node(s) applied the candidate before the wave's deadline (" +
                  seconds_text(report_.desired.waves->deadline) + ")");
      return false;
    }
    event(wave, rollout_step::applied,
          std::to_string(tally.applied.size()) + " node(s) run the candidate");
    return true;
  }

  // Which run of each node (boot id, restarts seen) the wave started with.
  struct run_mark {
    std::string boot;
    std::uint64_t restarts = 0;
  };
  static std::map<std::string, run_mark, std::less<>> runs_of(const std::vector<node_state>& all) {
    std::map<std::string, run_mark, std::less<>> out;
    for (const auto& n : all)
      if (n.beat) out[n.node] = {n.beat->boot, n.restarts};
    return out;
  }

  // The evidence the bake stands on: every node of the wave heard from throughout it, on the
  // candidate, in the run it had when the wave started. A node that went silent, restarted or
  // left the candidate fails the wave; missing evidence is never taken for health. Returns the
  // first such node's signal and reason; `sampled` says whether every node was heard from on
  // the candidate since `applied`.
  struct evidence {
    std::string node;
    halt_signal signal = halt_signal::none;
    std::string reason;
    bool sampled = true;
  };
  // What check_evidence looks at: while the wave applies, only that each node lives in its
  // run (it may still serve the old version); in the bake, that it serves the candidate too.
  enum class evidence_of { liveness, liveness_and_candidate };
  evidence check_evidence(const std::vector<node_state>& all, system_clock::time_point applied,
                          system_clock::time_point now,
                          evidence_of what = evidence_of::liveness_and_candidate) const {
    const auto& plan = *report_.desired.waves;
    evidence e;
    for (const auto& canary : report_.desired.canaries) {
      const auto it = std::find_if(all.begin(), all.end(),
                                   [&](const node_state& n) { return n.node == canary; });
      const node_state* n = it == all.end() ? nullptr : &*it;
      const auto interval = n && n->beat ? n->beat->interval : std::chrono::milliseconds(5000);
      const auto allowed = plan.max_missed_heartbeats * interval + std::chrono::seconds(1);
      const auto heard = n && n->beat ? std::max(n->received, applied) : applied;
      const auto fail = [&](halt_signal signal, std::string reason) {
        if (e.signal != halt_signal::none) return;
        e.node = canary;
        e.signal = signal;
        e.reason = "canary " + canary + " " + std::move(reason);
      };
      if (const auto mark = runs_at_start_.find(canary);
          n && n->beat && mark != runs_at_start_.end() &&
          (n->restarts > mark->second.restarts ||
           (!mark->second.boot.empty() && n->beat->boot != mark->second.boot)))
        fail(halt_signal::canary_restarted, "restarted during the wave (run " + mark->second.boot +
                                                " became " + n->beat->boot +
                                                "): a version that kills its process fails");
      if (now - heard > allowed)
        fail(halt_signal::canary_lost,
             "sent no heartbeat for " +
                 seconds_text(std::chrono::duration_cast<std::chrono::milliseconds>(now - heard)) +
                 " (the server's receive times; " + std::to_string(plan.max_missed_heartbeats) +
                 " interval(s) of " + seconds_text(interval) +
                 " and a second allowed): a canary that stops reporting is not healthy");
      const bool fresh = n && n->beat && n->received > applied;
      if (what == evidence_of::liveness) continue;
      if (!fresh) {
        e.sampled = false;
        continue;
      }
      const auto h = n->beat->versions.find(report_.desired.module);
      const auto serving = h == n->beat->versions.end() ? 0 : h->second;
      if (serving != plan.candidate.version)
        fail(halt_signal::canary_left, "left the candidate v" +
                                           std::to_string(plan.candidate.version) +
                                           ": it serves v" + std::to_string(serving));
    }
    return e;
  }

  // The bake: the wave's nodes stay healthy against the baseline for the bake time after they
  // all applied, each heard from throughout; false when the rollout halted.
  bool bake(std::size_t wave) {
    const auto& plan = *report_.desired.waves;
    const auto limits = limits_of(plan);
    const auto applied = system_clock::now();
    const auto done = applied + plan.bake;
    std::map<std::string, counter_mark, std::less<>> start;
    bool first = true;
    for (;;) {
      const auto all = control_.nodes();
      const auto now = system_clock::now();
      const auto samples = sample_wave(report_.desired, all, applied);
      if (first) {  // the baseline's window starts with the bake
        for (const auto& b : samples.baseline)
          start[b.node] = {b.health.launches, b.health.launch_failures};
        first = false;
      }
      const auto proof = check_evidence(all, applied, now);
      if (proof.signal != halt_signal::none) {
        halt_at(wave, proof.signal, proof.node, proof.reason);
        return false;
      }
      report_.last_verdict = analyse_wave(samples.canaries, samples.baseline, start, limits);
      if (report_.last_verdict.failed) {
        const auto verdict = report_.last_verdict;
        halt_at(wave, verdict.signal, verdict.node, verdict.reason, verdict.metric);
        return false;
      }
      // Passed only on evidence: the bake is over and every node was heard from since.
      if (now >= done && proof.sampled) return true;
      if (now >= deadline_) {
        halt_at(wave, halt_signal::deadline, "",
                "the wave did not finish its bake before its deadline (" +
                    seconds_text(plan.deadline) + ")");
        return false;
      }
      const auto next = now >= done ? now + timing_.poll : std::min(done, deadline_);
      std::this_thread::sleep_for(
          std::min<system_clock::duration>(timing_.poll, std::min(next, deadline_) - now));
    }
  }

  controller& control_;
  controller::impl& d_;
  trusted_keys keys_;
  const secret_key& key_;
  std::string module_;
  rollout_report& report_;
  node_registry registry_;
  result_watch watch_;
  wave_policy_timing timing_;
  system_clock::time_point deadline_;
  std::map<std::string, run_mark, std::less<>> runs_at_start_;
};

// The desired state of `module` with its wave rollout, for `verb` ("resume", "abort");
// fleet_errc::invalid_state when it has none.
desired_state wave_rollout_of(const std::optional<detail::kv_value>& current,
                              std::string_view module, const trusted_keys& keys,
                              std::string_view verb) {
  auto s = parse_current(current, module, keys);
  if (!s.waves)
    detail::fail(fleet_errc::invalid_state, "has no wave rollout to " + std::string(verb),
                 std::string(verb), "desired state of module '" + std::string(module) + "'");
  return s;
}

// The plan of `policy` for `p` over the nodes that qualify now, starting at wave 0.
wave_plan plan_for(const prepared_bundle& p, const wave_policy& policy,
                   const std::vector<std::string>& waves,
                   const std::vector<std::string>& qualifying) {
  wave_plan plan;
  plan.candidate = p.ref;
  plan.sizes = waves;
  const auto counts = wave_counts(waves, qualifying.size());
  std::size_t taken = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    const bool last = i + 1 == counts.size();
    const std::size_t upto = last ? taken : counts[i];
    plan.nodes.emplace_back(qualifying.begin() + static_cast<std::ptrdiff_t>(taken),
                            qualifying.begin() + static_cast<std::ptrdiff_t>(upto));
    taken = upto;
  }
  plan.started = now_text();
  plan.bake = policy.bake;
  plan.deadline = policy.deadline;
  plan.max_failure_rate = policy.limits.max_failure_rate;
  plan.max_metrics = policy.limits.max_metrics;
  plan.baseline_breach_halts = policy.limits.baseline_breach_halts;
  plan.max_missed_heartbeats = policy.max_missed_heartbeats;
  return plan;
}

}  // namespace

wave_samples sample_wave(const desired_state& state, const std::vector<node_state>& nodes,
                         system_clock::time_point since) {
  wave_samples out;
  if (!state.waves) return out;
  const auto stable = state.stable ? state.stable->version : 0;
  for (const auto& node : nodes) {
    if (!node.live || !node.beat) continue;
    const auto h = node.beat->health.find(state.module);
    if (h == node.beat->health.end()) continue;
    const bool canary = std::binary_search(state.canaries.begin(), state.canaries.end(), node.node);
    // A canary's heartbeat received before the wave applied may speak of an earlier run of the
    // same version; a baseline node's last one speaks of the stable version whenever it was made.
    if (canary && node.received <= since) continue;
    if (canary && h->second.version == state.waves->candidate.version)
      out.canaries.push_back({node.node, h->second, node.beat->poisoned});
    else if (!canary && stable != 0 && h->second.version == stable)
      out.baseline.push_back({node.node, h->second, node.beat->poisoned});
  }
  return out;
}

std::vector<std::string> checked_waves(std::vector<std::string> waves) {
  CUBRIDGE_EXPECTS(!waves.empty(), "waves: at least one wave");
  unsigned last_percent = 0;
  for (std::size_t i = 0; i < waves.size(); ++i) {
    const auto& w = waves[i];
    const auto wrong = [&](const std::string& why) {
      cubridge::detail::throw_errc(errc::precondition, "waves",
                                   "wave " + std::to_string(i + 1) + " '" +
                                       cubridge::detail::printable(w, {.max_bytes = 16}) + "' " +
                                       why);
    };
    if (const auto percent = percent_of(w)) {
      if (whole_number(std::string_view(w).substr(0, w.size() - 1), 1, 100) == 0)
        wrong("is not a percentage from 1% to 100%");
      if (*percent <= last_percent) wrong("is not above the wave before it");
      last_percent = *percent;
    } else if (whole_number(w, 1, max_desired_canaries) == 0) {
      wrong("is neither a number of nodes (1 to 10000) nor a percentage (1% to 100%)");
    }
    if (i + 1 < waves.size() && w == "100%") wrong("is every node, and waves follow it");
  }
  if (waves.back() != "100%") waves.emplace_back("100%");
  CUBRIDGE_EXPECTS(waves.size() <= max_waves,
                   "waves: at most " + std::to_string(max_waves) + " waves, 100% included");
  return waves;
}

std::vector<std::size_t> wave_counts(const std::vector<std::string>& waves,
                                     std::size_t qualifying) {
  std::vector<std::size_t> counts;
  std::size_t before = 0;
  for (std::size_t i = 0; i < waves.size(); ++i) {
    std::size_t target = qualifying;
    if (i + 1 < waves.size()) {
      if (const auto percent = percent_of(waves[i]))
        target = (qualifying * *percent + 99) / 100;  // rounded up: 10% of 4 nodes is 1
      else
        target = std::min(whole_number(waves[i], 1, max_desired_canaries), qualifying);
    }
    target = std::min(std::max(target, before + 1), qualifying);  // at least one more, if any
    counts.push_back(target);
    before = target;
  }
  return counts;
}

rollout_report controller::rollout_waves(std::span<const std::byte> bytes,
                                         const wave_policy& policy,
                                         const secret_key& operator_key) {
  auto& d = *impl_;
  const auto waves = checked_waves(policy.waves);
  CUBRIDGE_EXPECTS(
      policy.bake.count() >= 0 && policy.deadline.count() > 0 && policy.poll.count() > 0,
      "wave policy: the bake time may not be negative, the deadline and the poll "
      "interval must be positive");
  CUBRIDGE_EXPECTS(policy.limits.max_failure_rate <= 1,
                   "wave policy: the failure rate limit is a fraction, at most 1");
  CUBRIDGE_EXPECTS(
      policy.max_missed_heartbeats >= 1 &&
          policy.max_missed_heartbeats <= max_missed_heartbeats_limit,
      "wave policy: max_missed_heartbeats is 1 to " + std::to_string(max_missed_heartbeats_limit));
  const auto keys = d.keys_with(operator_key);
  const auto p = prepare(bytes, keys);
  const auto& module = p.module();
  rollout_report report;
  report.version = p.ref.version;
  wave_run run(*this, d, keys, operator_key, module, report);  // its watch first: no result missed
  d.store_bundle(module, p.ref, bytes);
  const auto qualifying = eligible_canaries(nodes(), p, policy.cohort);
  d.write_desired(module, [&](const auto& current) {
    auto s = parse_current(current, module, keys);
    if (s.phase == rollout_phase::canary && s.waves && !s.waves_halted() &&
        s.waves->candidate == p.ref) {  // under way: carried on from its wave
      report.desired = s;
      return current->value;
    }
    if (desired_everywhere(s, p.ref)) {
      report.already_desired = true;
      report.desired = s;
      return current->value;
    }
    require_newer(s, p.ref);
    if (qualifying.empty())
      cubridge::detail::throw_errc(
          errc::precondition, "rollout_waves",
          "no node qualifies for the first wave of module '" + module +
              "' (live, following it, able to run " + p.ref.target +
              (policy.cohort.empty() ? "" : ", of cohort " + policy.cohort) + ")");
    if (waves.size() == 1) {  // "100%" alone: every node at once, a plain publish
      make_stable(s, p.ref);
      report.completed = true;
    } else {
      auto plan = plan_for(p, policy, waves, qualifying);
      enter_canary_phase(s, p.ref, plan.nodes[0]);
      s.waves = std::move(plan);
    }
    auto value = sign_next_revision(s, d.bucket.get(), keys, operator_key);
    report.desired = s;
    return value;
  });
  if (report.already_desired || report.completed) {
    report.completed = true;
    return report;
  }
  report.canaries = report.desired.canaries;
  run.run({policy.poll});
  return report;
}

rollout_report controller::resume(std::string_view module, const secret_key& operator_key) {
  auto& d = *impl_;
  impl::require_name(module, "module name");
  const auto keys = d.keys_with(operator_key);
  rollout_report report;
  wave_run run(*this, d, keys, operator_key, std::string(module), report);
  d.write_desired(module, [&](const auto& current) {
    auto s = wave_rollout_of(current, module, keys, "resume");
    report.version = s.waves->candidate.version;
    if (!s.waves_halted()) {  // under way, its controller gone: carried on as it is
      report.desired = s;
      return current->value;
    }
    auto plan = std::move(*s.waves);
    require_newer(s, plan.candidate);
    enter_canary_phase(s, plan.candidate, all_nodes_to(plan, plan.wave));  // drops the plan
    plan.started = now_text();
    s.waves = std::move(plan);
    auto value = sign_next_revision(s, d.bucket.get(), keys, operator_key);
    report.desired = s;
    return value;
  });
  report.canaries = report.desired.canaries;
  run.run({std::chrono::milliseconds(500)});
  return report;
}

desired_state controller::abort(std::string_view module, const secret_key& operator_key) {
  auto& d = *impl_;
  impl::require_name(module, "module name");
  const auto keys = d.keys_with(operator_key);
  desired_state written;
  d.write_desired(module, [&](const auto& current) {
    auto s = wave_rollout_of(current, module, keys, "abort");
    const auto& plan = *s.waves;
    halt(s, plan.candidate,
         "aborted by the operator at wave " + std::to_string(plan.wave + 1) + " of " +
             std::to_string(plan.sizes.size()) +
             (s.waves_halted() ? " (halted before: " + s.reason + ")" : ""));
    s.waves.reset();
    auto value = sign_next_revision(s, d.bucket.get(), keys, operator_key);
    written = s;
    return value;
  });
  return written;
}

}  // namespace cubridge::fleet
