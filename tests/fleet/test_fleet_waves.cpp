// Progressive delivery (docs/fleet.md, "Progressive delivery"): wave rollouts end to end over a
// real nats-server, with agents whose services report health through a probe. Waves advance
// only after their bake; a node of a later wave never fetches the candidate early; a probe that
// fails on one canary halts the first wave and no other node ever runs the version; a fleet-wide
// dip halts for review (or bakes on when asked); the progress deadline halts a stuck wave; resume
// and abort; a controller killed mid-rollout is carried on from the same wave; forged health is
// ignored and counted.
#include "fleet/fleet_fixture.hpp"

#include <cubridge/fleet/wave_analysis.hpp>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <fstream>
#include <future>

extern char** environ;

namespace {

using namespace cubridge::testing::fleet_fixture;
using system_time = std::chrono::system_clock::time_point;
using cubridge::fleet::halt_signal;
using cubridge::fleet::rollout_step;

// A probe over a flag per node: unhealthy on `bad_version` while the flag says so.
struct probe_switch {
  std::atomic<std::uint64_t> bad_version{0};
  std::atomic<bool> everywhere{false};  // unhealthy whatever the version (a fleet-wide dip)
  cubridge::health_probe_fn probe() {
    return [this](std::string_view, std::uint64_t version) {
      cubridge::health_report r;
      r.healthy = !(everywhere || (bad_version != 0 && version == bad_version));
      r.values["wrong_answers"] = r.healthy ? 0.0 : 12.0;
      if (!r.healthy) r.detail = "output check: 12 wrong answers";
      return r;
    };
  }
};

class FleetWaves : public FleetControlPlane {
 protected:
  const std::string m = "filters";
  probe_switch probes;

  // n1..n<count>, following m, beating every 200 ms, with the probe; all on v1.
  std::vector<fleet_node*> fleet_of(int count) {
    for (int i = 1; i <= count; ++i)
      add_node({"n" + std::to_string(i), {m}, 200ms, {}, probes.probe()});
    const auto everyone = all_nodes();
    (void)control->publish(bundle(m, 1), operator_keys.secret_key);
    EXPECT_TRUE(converge(everyone, m, 1)) << serving_text(everyone, m);
    // Every node live with its health seen by the controller, before a wave is chosen.
    EXPECT_TRUE(eventually(
        [&] {
          const auto seen = control->nodes();
          return std::all_of(seen.begin(), seen.end(), [&](const auto& n) {
            return n.live && n.beat && n.beat->health.contains(m) &&
                   n.beat->health.at(m).version == 1;
          });
        },
        10s));
    return everyone;
  }

  fleet::wave_policy policy(std::vector<std::string> waves, std::chrono::milliseconds bake) const {
    fleet::wave_policy p;
    p.waves = std::move(waves);
    p.bake = bake;
    p.poll = 100ms;
    return p;
  }

  static const fleet::rollout_event* find_event(const fleet::rollout_report& r, std::size_t wave,
                                                fleet::rollout_step what) {
    for (const auto& e : r.timeline)
      if (e.wave == wave && e.what == what) return &e;
    return nullptr;
  }
};

TEST_F(FleetWaves, WavesAdvanceOnlyAfterTheirBakeAndLaterWavesNeverFetchEarly) {
  const auto everyone = fleet_of(4);
  const auto report =
      control->rollout_waves(bundle(m, 2), policy({"1", "50%"}, 1500ms), operator_keys.secret_key);
  ASSERT_TRUE(report.completed) << report.halt_reason;
  EXPECT_TRUE(converge(everyone, m, 2)) << serving_text(everyone, m);
  // 4 nodes: wave 1 is n1, wave 2 (50%) adds n2, the last wave is everyone.
  const auto* applied1 = find_event(report, 0, fleet::rollout_step::applied);
  const auto* passed1 = find_event(report, 0, fleet::rollout_step::passed);
  const auto* applied2 = find_event(report, 1, fleet::rollout_step::applied);
  const auto* passed2 = find_event(report, 1, fleet::rollout_step::passed);
  ASSERT_TRUE(applied1 && passed1 && applied2 && passed2);
  EXPECT_GE(passed1->time - applied1->time, 1500ms);
  EXPECT_GE(passed2->time - applied2->time, 1500ms);
  const auto served = [&](int node) {
    return *nodes[static_cast<std::size_t>(node)]->sink->first_served(m, 2);
  };
  EXPECT_LT(served(0), passed1->time);  // n1 in wave 1
  EXPECT_GE(served(1), passed1->time);  // n2 only once wave 1 passed
  EXPECT_LT(served(1), passed2->time);
  EXPECT_GE(served(2), passed2->time);  // n3, n4: the last wave
  EXPECT_GE(served(3), passed2->time);
  const auto state = control->desired(m);
  ASSERT_TRUE(state);
  EXPECT_EQ(state->state.phase, rollout_phase::complete);
  EXPECT_EQ(state->state.stable->version, 2u);
  EXPECT_FALSE(state->state.waves);  // done: no plan left
}

TEST_F(FleetWaves, AProbeFailingOnTheCanaryHaltsTheFirstWaveAndNoOtherNodeEverRunsIt) {
  const auto everyone = fleet_of(4);
  probes.bad_version = 2;  // v2 passes its smoke test, then gives wrong answers
  const auto report =
      control->rollout_waves(bundle(m, 2), policy({"1", "50%"}, 5000ms), operator_keys.secret_key);
  EXPECT_FALSE(report.completed);
  EXPECT_EQ(report.halt_signal, halt_signal::probe);
  EXPECT_EQ(report.halt_node, "n1");
  EXPECT_NE(report.halt_reason.find("output check: 12 wrong answers"), std::string::npos)
      << report.halt_reason;
  EXPECT_NE(report.halt_reason.find("3 baseline node(s) at 0%"), std::string::npos)
      << report.halt_reason;
  // Caught within the bake, not at its end.
  const auto* applied = find_event(report, 0, fleet::rollout_step::applied);
  const auto* halted = find_event(report, 0, fleet::rollout_step::halted);
  ASSERT_TRUE(applied && halted);
  EXPECT_LT(halted->time - applied->time, 5000ms);
  // n1 goes back by itself; the others never were offered v2.
  EXPECT_TRUE(converge(everyone, m, 1)) << serving_text(everyone, m);
  for (std::size_t i = 1; i < nodes.size(); ++i)
    EXPECT_FALSE(holds(nodes[i]->sink->offered(m), 2)) << nodes[i]->id;
  const auto state = control->desired(m);
  ASSERT_TRUE(state && state->state.waves);
  EXPECT_EQ(state->state.phase, rollout_phase::halted);
  EXPECT_TRUE(state->state.waves_halted());
  EXPECT_EQ(state->state.waves->wave, 0u);
  EXPECT_NE(state->state.reason.find("wave 1 of 3"), std::string::npos) << state->state.reason;

  // Resumed once the service is fixed: the same wave runs again, then the rest.
  probes.bad_version = 0;
  const auto resumed = control->resume(m, operator_keys.secret_key);
  ASSERT_TRUE(resumed.completed) << resumed.halt_reason;
  ASSERT_FALSE(resumed.timeline.empty());
  EXPECT_EQ(resumed.timeline.front().wave, 0u);
  EXPECT_TRUE(converge(everyone, m, 2)) << serving_text(everyone, m);
}

TEST_F(FleetWaves, AFleetWideDipHaltsForReviewByDefaultAndBakesOnWhenAsked) {
  const auto everyone = fleet_of(3);
  probes.everywhere = true;  // the old version and the new one both report unhealthy
  // ... and the controller has seen the baseline say so before the wave starts.
  ASSERT_TRUE(eventually(
      [&] {
        const auto seen = control->nodes();
        return std::all_of(seen.begin(), seen.end(), [&](const auto& n) {
          return n.beat && n.beat->health.contains(m) && !n.beat->health.at(m).healthy;
        });
      },
      10s));
  // By default a baseline that breaches on its own halts: the canary cannot be judged.
  auto p = policy({"1"}, 2500ms);
  p.limits.max_metrics["wrong_answers"] = 1;
  const auto halted = control->rollout_waves(bundle(m, 2), p, operator_keys.secret_key);
  EXPECT_FALSE(halted.completed);
  EXPECT_EQ(halted.halt_signal, halt_signal::baseline_unhealthy) << halted.halt_reason;
  EXPECT_NE(halted.halt_reason.find("the baseline is unhealthy"), std::string::npos)
      << halted.halt_reason;
  EXPECT_TRUE(converge(everyone, m, 1)) << serving_text(everyone, m);
  (void)control->abort(m, operator_keys.secret_key);
  // Asked to bake on through a dip: not the candidate's fault. A bake long enough for a
  // heartbeat made after the apply (heartbeat times are whole seconds: up to 1 s and an
  // interval later) to be judged.
  p.limits.baseline_breach_halts = false;
  const auto report = control->rollout_waves(bundle(m, 3), p, operator_keys.secret_key);
  ASSERT_TRUE(report.completed) << report.halt_reason;
  EXPECT_EQ(report.last_verdict.canary.at("unhealthy"), 1.0);
  EXPECT_EQ(report.last_verdict.baseline.at("unhealthy"), 1.0);
  EXPECT_EQ(report.last_verdict.baseline.at("metric:wrong_answers"), 12.0);
  EXPECT_TRUE(converge(everyone, m, 3)) << serving_text(everyone, m);
}

TEST_F(FleetWaves, OneWaveOfEveryNodeIsAPlainPublish) {
  const auto everyone = fleet_of(2);
  const auto report =
      control->rollout_waves(bundle(m, 2), policy({"100%"}, 1000ms), operator_keys.secret_key);
  EXPECT_TRUE(report.completed);
  const auto state = control->desired(m);
  ASSERT_TRUE(state);  // readable: no canary phase without canaries was written
  EXPECT_EQ(state->state.phase, rollout_phase::complete);
  EXPECT_EQ(state->state.stable->version, 2u);
  EXPECT_TRUE(converge(everyone, m, 2)) << serving_text(everyone, m);
}

TEST_F(FleetWaves, TheProgressDeadlineHaltsAStuckWave) {
  const auto everyone = fleet_of(3);
  nodes[0]->sink->fail(2, 4000ms);  // n1's smoke test of v2 takes 4 s (then fails)
  auto p = policy({"1"}, 500ms);
  p.deadline = 1500ms;
  const auto report = control->rollout_waves(bundle(m, 2), p, operator_keys.secret_key);
  EXPECT_FALSE(report.completed);
  EXPECT_EQ(report.halt_signal, halt_signal::deadline);
  EXPECT_NE(report.halt_reason.find("0 of 1 node(s) applied"), std::string::npos)
      << report.halt_reason;
  EXPECT_TRUE(converge(everyone, m, 1)) << serving_text(everyone, m);
  for (std::size_t i = 1; i < nodes.size(); ++i)
    EXPECT_FALSE(holds(nodes[i]->sink->offered(m), 2)) << nodes[i]->id;
}

TEST_F(FleetWaves, AbortEndsAHaltedRolloutAndResumeThenHasNothingToRun) {
  const auto everyone = fleet_of(2);
  probes.bad_version = 2;
  const auto halted =
      control->rollout_waves(bundle(m, 2), policy({"1"}, 3000ms), operator_keys.secret_key);
  ASSERT_FALSE(halted.completed);
  const auto written = control->abort(m, operator_keys.secret_key);
  EXPECT_EQ(written.phase, rollout_phase::halted);
  EXPECT_FALSE(written.waves);
  EXPECT_NE(written.reason.find("aborted by the operator at wave 1 of 2"), std::string::npos)
      << written.reason;
  EXPECT_FLEET_ERROR(control->resume(m, operator_keys.secret_key), fleet_errc::invalid_state,
                     "no wave rollout to resume");
  EXPECT_FLEET_ERROR(control->abort(m, operator_keys.secret_key), fleet_errc::invalid_state,
                     "no wave rollout to abort");
  EXPECT_TRUE(converge(everyone, m, 1)) << serving_text(everyone, m);
}

TEST_F(FleetWaves, ForgedHealthIsIgnoredAndCounted) {
  const auto everyone = fleet_of(3);
  raw_bus attacker(server.url());
  std::uint64_t refused = 0;
  auto p = policy({"1"}, 1500ms);
  p.limits.max_failure_rate = 0.01;
  auto rollout = std::async(std::launch::async, [&] {
    return control->rollout_waves(bundle(m, 2), p, operator_keys.secret_key);
  });
  // Once the wave runs: heartbeats for every node saying v2 fails every launch and is
  // unhealthy, signed by a stranger (not the node's enrolled key).
  const auto reader = make_controller();  // a controller is used by one thread
  EXPECT_TRUE(eventually(
      [&] {
        const auto s = reader->desired(m);
        return s && s->state.phase == rollout_phase::canary;
      },
      10s));
  while (rollout.wait_for(50ms) != std::future_status::ready) {
    for (const char* id : {"n1", "n2", "n3"}) {
      fleet::heartbeat h;
      h.node = id;
      h.gpu = "sm_90";
      h.interval = 200ms;
      h.time = std::chrono::floor<std::chrono::seconds>(std::chrono::system_clock::now()) + 1s;
      h.versions[m] = 2;
      h.health[m] = {.version = 2, .launches = 100, .launch_failures = 100, .healthy = false};
      attacker.publish(fleet::heartbeat_subject(id),
                       fleet::sign_record(fleet::record_kind::heartbeat, fleet::to_json(h),
                                          stranger.secret_key));
    }
    fleet::read_report read;
    (void)reader->nodes(std::chrono::system_clock::now(), &read);
    for (const auto& [why, count] : read.refused) refused += count;
  }
  const auto report = rollout.get();
  EXPECT_TRUE(report.completed) << report.halt_reason;
  EXPECT_GT(refused, 0u);
  EXPECT_TRUE(converge(everyone, m, 2)) << serving_text(everyone, m);
}

// `cubridge fleet publish --waves` killed (SIGKILL) in its second wave: the next controller
// carries on from that wave, not from the first.
TEST_F(FleetWaves, AControllerKilledMidRolloutIsCarriedOnFromTheSameWave) {
  const auto everyone = fleet_of(4);
  const auto key_file = dir.path / "operator.key";
  cubridge::write_key_file(key_file, operator_keys.secret_key);
  const auto bundle_file = dir.path / "filters-v2.bundle";
  const auto v2 = bundle(m, 2);
  std::ofstream(bundle_file, std::ios::binary)
      .write(reinterpret_cast<const char*>(v2.data()), static_cast<std::streamsize>(v2.size()));
  const std::string url = server.url();
  std::vector<std::string> args = {CUBRIDGE_TOOL_PATH,
                                   "fleet",
                                   "publish",
                                   bundle_file.string(),
                                   "--key",
                                   key_file.string(),
                                   "--server",
                                   url,
                                   "--waves",
                                   "1,50%",
                                   "--bake",
                                   "3s"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t child = 0;
  ASSERT_EQ(posix_spawn(&child, argv[0], nullptr, nullptr, argv.data(), environ), 0);
  // Killed as soon as it wrote its second wave (n2 joins n1 on v2).
  ASSERT_TRUE(eventually(
      [&] {
        const auto s = control->desired(m);
        return s && s->state.waves && s->state.waves->wave == 1;
      },
      30s));
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status));
  const auto state = control->desired(m);
  ASSERT_TRUE(state && state->state.waves);
  EXPECT_EQ(state->state.canaries, (std::vector<std::string>{"n1", "n2"}));
  // The next controller, given the same bundle, carries on with the record's plan (its bake of
  // 3 s, whatever this policy says) from the second wave.
  const auto report = control->rollout_waves(v2, policy({"1"}, 60s), operator_keys.secret_key);
  ASSERT_FALSE(report.timeline.empty());
  EXPECT_EQ(report.timeline.front().wave, 1u);
  EXPECT_EQ(report.timeline.front().what, rollout_step::started);
  const auto* applied = find_event(report, 1, fleet::rollout_step::applied);
  const auto* passed = find_event(report, 1, fleet::rollout_step::passed);
  ASSERT_TRUE(applied && passed);
  EXPECT_GE(passed->time - applied->time, 3s);
  EXPECT_LT(passed->time - applied->time, 30s);
  EXPECT_TRUE(report.completed) << report.halt_reason;
  EXPECT_TRUE(converge(everyone, m, 2)) << serving_text(everyone, m);
}

// --- the analysis and the wave sizes, without a bus ----------------------------------------

fleet::health_sample sample(const std::string& node, std::uint64_t launches, std::uint64_t failures,
                            bool healthy = true) {
  fleet::health_sample s{node, {}};
  s.health.version = 1;
  s.health.launches = launches;
  s.health.launch_failures = failures;
  s.health.healthy = healthy;
  return s;
}

TEST(WaveAnalysis, ACanaryWorseThanTheBaselineFailsAndADipEverywhereHaltsForReview) {
  fleet::health_limits limits;
  limits.max_failure_rate = 0.01;
  const std::vector canaries{sample("c1", 1000, 50)};
  const std::vector good_baseline{sample("b1", 2000, 1), sample("b2", 2000, 0)};
  const std::map<std::string, fleet::counter_mark, std::less<>> start{{"b1", {1000, 1}},
                                                                      {"b2", {1000, 0}}};
  auto v = fleet::analyse_wave(canaries, good_baseline, start, limits);
  EXPECT_TRUE(v.failed);
  EXPECT_EQ(v.signal, halt_signal::failure_rate);
  EXPECT_EQ(v.node, "c1");
  EXPECT_DOUBLE_EQ(v.canary.at("failure_rate"), 0.05);
  EXPECT_DOUBLE_EQ(v.baseline.at("failure_rate"), 0.0);  // the window's: nothing new failed
  // The baseline as bad over the same window: not the candidate's fault, but nothing to judge it
  // against either: halted for review by default, baked on when the limits say so.
  const std::vector bad_baseline{sample("b1", 2000, 61), sample("b2", 2000, 40)};
  v = fleet::analyse_wave(canaries, bad_baseline, start, limits);
  EXPECT_TRUE(v.failed);
  EXPECT_EQ(v.signal, halt_signal::baseline_unhealthy);
  EXPECT_NE(v.reason.find("the baseline is unhealthy"), std::string::npos) << v.reason;
  EXPECT_NE(v.reason.find("b1, b2"), std::string::npos) << v.reason;
  EXPECT_DOUBLE_EQ(v.baseline.at("failure_rate"), 0.05);  // the median of 0.06 and 0.04
  auto bake_on = limits;
  bake_on.baseline_breach_halts = false;
  v = fleet::analyse_wave(canaries, bad_baseline, start, bake_on);
  EXPECT_FALSE(v.failed) << v.reason;
  EXPECT_EQ(v.baseline_breaching, (std::vector<std::string>{"b1", "b2"}));
  // A baseline node that restarted (counters went down) counts from zero.
  const std::vector restarted{sample("b1", 10, 0), sample("b2", 2000, 0)};
  v = fleet::analyse_wave(canaries, restarted, start, limits);
  EXPECT_TRUE(v.failed);
  EXPECT_DOUBLE_EQ(v.baseline.at("failure_rate"), 0.0);
}

TEST(WaveAnalysis, StickyErrorsAndProbesCountAlwaysAndMetricsOnAverage) {
  auto sticky = sample("c1", 10, 1);
  sticky.health.sticky_error = "CUDA_ERROR_ILLEGAL_ADDRESS";
  auto v = fleet::analyse_wave(std::vector{sticky}, std::vector{sample("b1", 10, 0)}, {}, {});
  EXPECT_TRUE(v.failed);
  EXPECT_EQ(v.signal, halt_signal::sticky_error);
  EXPECT_NE(v.reason.find("CUDA_ERROR_ILLEGAL_ADDRESS"), std::string::npos);
  v = fleet::analyse_wave(std::vector{sample("c1", 10, 0, false)}, {}, {}, {});
  EXPECT_TRUE(v.failed);  // no baseline: the canary alone
  EXPECT_EQ(v.signal, halt_signal::probe);
  fleet::health_limits limits;
  limits.max_metrics["p99_us"] = 500;
  auto slow = sample("c1", 10, 0);
  slow.health.values["p99_us"] = 900;
  auto fast = sample("c2", 10, 0);
  fast.health.values["p99_us"] = 200;
  v = fleet::analyse_wave(std::vector{slow, fast}, {}, {}, limits);
  EXPECT_TRUE(v.failed);  // 550 on average
  EXPECT_EQ(v.signal, halt_signal::metric);
  EXPECT_EQ(v.metric, "p99_us");
  EXPECT_EQ(v.node, "c1");
  fast.health.values["p99_us"] = 100;
  v = fleet::analyse_wave(std::vector{slow, fast}, {}, {}, limits);
  EXPECT_FALSE(v.failed) << v.reason;  // 500: at the limit
}

// A canary whose heartbeat says its process is poisoned breaches as a sticky error, even when no
// launch of the module saw the error (its counters are clean); a baseline node that says so is
// trimmed like any single node.
TEST(WaveAnalysis, APoisonedCanaryBreachesAsAStickyError) {
  auto poisoned = sample("c1", 10, 0);
  poisoned.poisoned = fleet::poison_report{"CUDA_ERROR_ILLEGAL_ADDRESS", "cuStreamSynchronize",
                                           std::chrono::sys_days{std::chrono::year{2026} / 12 / 6}};
  const std::vector baseline{sample("b1", 10, 0), sample("b2", 10, 0), sample("b3", 10, 0)};
  auto v = fleet::analyse_wave(std::vector{poisoned, sample("c2", 10, 0)}, baseline, {}, {});
  EXPECT_TRUE(v.failed);
  EXPECT_EQ(v.signal, halt_signal::sticky_error);
  EXPECT_EQ(v.node, "c1");
  EXPECT_NE(v.reason.find("canary c1 is poisoned (CUDA_ERROR_ILLEGAL_ADDRESS seen by "
                          "cuStreamSynchronize)"),
            std::string::npos)
      << v.reason;
  EXPECT_DOUBLE_EQ(v.canary.at("sticky"), 0.5);
  // One poisoned baseline node is trimmed: the canary still fails against the others.
  auto broken = baseline;
  broken[0].poisoned = poisoned.poisoned;
  v = fleet::analyse_wave(std::vector{poisoned}, broken, {}, {});
  EXPECT_TRUE(v.failed);
  EXPECT_EQ(v.signal, halt_signal::sticky_error);
  EXPECT_DOUBLE_EQ(v.baseline.at("sticky"), 0.0);
  // Healthy canaries pass.
  v = fleet::analyse_wave(std::vector{sample("c1", 10, 0)}, baseline, {}, {});
  EXPECT_FALSE(v.failed) << v.reason;
}

// The samples of a wave carry each node's poisoned state from its last heartbeat.
TEST(WaveSamples, CarryTheHeartbeatsPoisonedState) {
  using namespace std::chrono_literals;
  const auto since = std::chrono::system_clock::now() - 10s;
  fleet::desired_state state;
  state.module = "filters";
  state.stable = fleet::bundle_ref{1, std::string(64, 'a'), 10, "sm_90"};
  state.waves = fleet::wave_plan{};
  state.waves->candidate = fleet::bundle_ref{2, std::string(64, 'b'), 10, "sm_90"};
  state.canaries = {"c1"};
  const auto node = [&](const std::string& id, std::uint64_t version, bool poisoned) {
    fleet::node_state n;
    n.node = id;
    n.live = true;
    n.received = since + 5s;
    n.beat = fleet::heartbeat{};
    n.beat->node = id;
    n.beat->health["filters"].version = version;
    if (poisoned)
      n.beat->poisoned = fleet::poison_report{"CUDA_ERROR_LAUNCH_FAILED", "cuLaunchKernel",
                                              std::chrono::floor<std::chrono::seconds>(since)};
    return n;
  };
  const auto samples =
      fleet::sample_wave(state, {node("c1", 2, true), node("b1", 1, false)}, since);
  ASSERT_EQ(samples.canaries.size(), 1u);
  ASSERT_TRUE(samples.canaries[0].poisoned);
  EXPECT_EQ(samples.canaries[0].poisoned->error, "CUDA_ERROR_LAUNCH_FAILED");
  ASSERT_EQ(samples.baseline.size(), 1u);
  EXPECT_FALSE(samples.baseline[0].poisoned);
  const auto v = fleet::analyse_wave(samples.canaries, samples.baseline, {}, {});
  EXPECT_EQ(v.signal, halt_signal::sticky_error) << v.reason;
}

// One baseline node that lies (a stolen key, or broken) cannot mask a failing canary: its
// figure is one of the median's, or trimmed from a share.
TEST(WaveAnalysis, OneLyingBaselineNodeDoesNotMaskAFailingCanary) {
  fleet::health_limits limits;
  limits.max_metrics["wrong_answers"] = 0;
  limits.max_failure_rate = 0.01;
  auto bad_canary = sample("c1", 1000, 100, false);
  bad_canary.health.values["wrong_answers"] = 7;
  bad_canary.health.detail = "7 wrong answers";
  const auto honest = [](const std::string& node) {
    auto b = sample(node, 1000, 0);
    b.health.values["wrong_answers"] = 0;
    return b;
  };
  // A metric of 1e9 and a failure rate of 1 from one of three baseline nodes.
  auto liar = sample("b3", 1000, 1000);
  liar.health.values["wrong_answers"] = 1e9;
  std::vector baseline{honest("b1"), honest("b2"), liar};
  auto v = fleet::analyse_wave(std::vector{bad_canary}, baseline, {}, limits);
  EXPECT_TRUE(v.failed);
  EXPECT_EQ(v.signal, halt_signal::probe) << v.reason;
  EXPECT_EQ(v.node, "c1");
  EXPECT_DOUBLE_EQ(v.baseline.at("metric:wrong_answers"), 0.0);
  EXPECT_DOUBLE_EQ(v.baseline.at("failure_rate"), 0.0);
  EXPECT_EQ(v.baseline_breaching, (std::vector<std::string>{}));  // the median node breaches not
  // Without the probe's verdict, the metric and the failure rate still fail the canary.
  bad_canary.health.healthy = true;
  v = fleet::analyse_wave(std::vector{bad_canary}, baseline, {}, limits);
  EXPECT_TRUE(v.failed);
  EXPECT_EQ(v.signal, halt_signal::failure_rate) << v.reason;
  limits.max_failure_rate = -1;
  v = fleet::analyse_wave(std::vector{bad_canary}, baseline, {}, limits);
  EXPECT_TRUE(v.failed);
  EXPECT_EQ(v.signal, halt_signal::metric);
  EXPECT_EQ(v.metric, "wrong_answers") << v.reason;
  // "Unhealthy" always from one baseline node of three, with a sticky error besides.
  bad_canary.health.healthy = false;
  baseline[2] = honest("b3");
  baseline[2].health.healthy = false;
  baseline[2].health.sticky_error = "CUDA_ERROR_ILLEGAL_ADDRESS";
  v = fleet::analyse_wave(std::vector{bad_canary}, baseline, {}, limits);
  EXPECT_TRUE(v.failed);
  EXPECT_EQ(v.signal, halt_signal::probe) << v.reason;
  EXPECT_DOUBLE_EQ(v.baseline.at("unhealthy"), 0.0);  // b3 trimmed
  // A healthy canary against the same lying node passes: the liar halts nothing either.
  v = fleet::analyse_wave(std::vector{honest("c1")}, baseline, {}, limits);
  EXPECT_FALSE(v.failed) << v.reason;
  // A baseline of that one node alone is the baseline breaching on its own: halted for review,
  // never a pass for the bad canary.
  v = fleet::analyse_wave(std::vector{bad_canary}, std::vector{baseline[2]}, {}, limits);
  EXPECT_TRUE(v.failed);
  EXPECT_EQ(v.signal, halt_signal::baseline_unhealthy) << v.reason;
  EXPECT_EQ(v.node, "b3");
}

TEST(WaveAnalysis, TheTrimIsATenthOfTheBaselineAndAtLeastOneNode) {
  EXPECT_EQ(fleet::baseline_trim(1), 1u);
  EXPECT_EQ(fleet::baseline_trim(19), 1u);
  EXPECT_EQ(fleet::baseline_trim(20), 2u);
  EXPECT_EQ(fleet::baseline_trim(1000), 100u);
}

TEST(WaveSizes, AreCheckedCumulativeAndEndWithEveryNode) {
  EXPECT_EQ(fleet::checked_waves({"1", "10%", "50%"}),
            (std::vector<std::string>{"1", "10%", "50%", "100%"}));
  EXPECT_EQ(fleet::wave_counts({"1", "10%", "50%", "100%"}, 4),
            (std::vector<std::size_t>{1, 2, 3, 4}));
  EXPECT_EQ(fleet::wave_counts({"1", "10%", "50%", "100%"}, 100),
            (std::vector<std::size_t>{1, 10, 50, 100}));
  EXPECT_EQ(fleet::wave_counts({"5", "100%"}, 2), (std::vector<std::size_t>{2, 2}));
  for (const auto& bad : std::vector<std::vector<std::string>>{{},
                                                               {"0"},
                                                               {"-1"},
                                                               {"0%"},
                                                               {"101%"},
                                                               {"50%", "10%"},
                                                               {"1.5"},
                                                               {"x"},
                                                               {"100%", "1"},
                                                               {"01"}})
    EXPECT_THROW((void)fleet::checked_waves(bad), cubridge::error) << (bad.empty() ? "" : bad[0]);
}

}  // namespace
