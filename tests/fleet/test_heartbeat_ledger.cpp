// The control side's heartbeat ledger (heartbeat_ledger.hpp), without a server: heartbeats that
// go back change nothing, a restart is seen, and liveness comes from the server's receive time.
#include <cubridge/fleet/heartbeat_ledger.hpp>

#include <gtest/gtest.h>

namespace {

using namespace std::chrono_literals;
using cubridge::fleet::heartbeat;
using cubridge::fleet::heartbeat_ledger;
using cubridge::fleet::heartbeat_verdict;
using time_point = std::chrono::system_clock::time_point;

const time_point t0 = std::chrono::sys_seconds(std::chrono::seconds(1'800'000'000));

heartbeat beat(std::string boot, std::uint64_t sequence, time_point started, bool healthy = true) {
  heartbeat h;
  h.node = "n1";
  h.interval = 1000ms;
  h.boot = std::move(boot);
  h.sequence = sequence;
  h.started = std::chrono::floor<std::chrono::seconds>(started);
  h.time = std::chrono::floor<std::chrono::seconds>(started);
  h.health["m"].healthy = healthy;
  return h;
}

const std::string run_a = "00000000000000aa", run_b = "00000000000000bb";

TEST(HeartbeatLedger, AnOlderHeartbeatOfTheSameRunWrittenBackChangesNothing) {
  heartbeat_ledger ledger;
  EXPECT_EQ(ledger.take(beat(run_a, 1, t0), t0), heartbeat_verdict::taken);
  EXPECT_EQ(ledger.take(beat(run_a, 2, t0, false), t0 + 1s), heartbeat_verdict::taken);
  // The attacker writes the healthy one back after each fresh one.
  EXPECT_EQ(ledger.take(beat(run_a, 1, t0), t0 + 1100ms), heartbeat_verdict::replayed);
  EXPECT_EQ(ledger.take(beat(run_a, 2, t0, false), t0 + 1200ms), heartbeat_verdict::replayed);
  const auto* e = ledger.find("n1");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->beat.sequence, 2u);
  EXPECT_FALSE(e->beat.health.at("m").healthy);  // the canary's truth stands
  EXPECT_EQ(e->received, t0 + 1s);               // and its liveness: the replays are not it
  EXPECT_EQ(e->refused, 2u);
  EXPECT_EQ(e->restarts, 0u);
}

TEST(HeartbeatLedger, ARestartIsSeenAndTheEarlierRunIsRefusedAfterIt) {
  heartbeat_ledger ledger;
  (void)ledger.take(beat(run_a, 5, t0), t0 + 5s);
  EXPECT_EQ(ledger.take(beat(run_b, 1, t0 + 6s), t0 + 7s), heartbeat_verdict::restarted);
  EXPECT_EQ(ledger.take(beat(run_a, 5, t0), t0 + 8s), heartbeat_verdict::earlier_run);
  EXPECT_EQ(ledger.take(beat(run_a, 9, t0), t0 + 8s), heartbeat_verdict::earlier_run);
  EXPECT_EQ(ledger.take(beat(run_b, 2, t0 + 6s), t0 + 8s), heartbeat_verdict::taken);
  const auto* e = ledger.find("n1");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->beat.boot, run_b);
  EXPECT_EQ(e->restarts, 1u);
}

TEST(HeartbeatLedger, AnOlderRunSeenFirstIsRefusedWhileTheCurrentOneBeats) {
  heartbeat_ledger ledger;
  (void)ledger.take(beat(run_b, 3, t0 + 60s), t0 + 70s);
  // A run that started before the current one, written back while the current one is live.
  EXPECT_EQ(ledger.take(beat(run_a, 40, t0), t0 + 71s), heartbeat_verdict::earlier_run);
  // A node whose clock went back across a restart: taken once the current run fell silent.
  EXPECT_EQ(ledger.take(beat(run_a, 1, t0), t0 + 75s), heartbeat_verdict::restarted);
}

TEST(HeartbeatLedger, LivenessIsTheServersReceiveTimeNotTheNodesClock) {
  heartbeat_ledger ledger;
  auto ahead = beat(run_a, 1, t0 + 3h);  // a node whose clock runs 3 h ahead
  (void)ledger.take(ahead, t0);
  const auto* e = ledger.find("n1");
  ASSERT_TRUE(e);
  EXPECT_TRUE(heartbeat_ledger::live(e->received, e->beat.interval, t0 + 3s));
  EXPECT_FALSE(heartbeat_ledger::live(e->received, e->beat.interval, t0 + 5s));  // dead is dead
  auto behind = beat(run_b, 1, t0 - 3h);  // and one 3 h behind is live while it beats
  heartbeat_ledger other;
  (void)other.take(behind, t0);
  EXPECT_TRUE(heartbeat_ledger::live(other.find("n1")->received, 1000ms, t0 + 1s));
}

TEST(HeartbeatLedger, NodesThatPredateBootIdsAreTakenInStreamOrder) {
  heartbeat_ledger ledger;
  EXPECT_EQ(ledger.take(beat("", 0, t0), t0), heartbeat_verdict::taken);
  EXPECT_EQ(ledger.take(beat("", 0, t0), t0 + 1s), heartbeat_verdict::taken);
  EXPECT_EQ(ledger.find("n1")->received, t0 + 1s);
  EXPECT_EQ(to_string(heartbeat_verdict::earlier_run), "earlier_run");
}

}  // namespace
