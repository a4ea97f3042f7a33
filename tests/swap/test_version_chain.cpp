// The hot-swap bookkeeping, without a GPU: versions, leases, tokens, retirement.
#include <cubridge/swap/version_chain.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

/// A payload that knows whether it is alive: a module that must not be unloaded under a launch.
struct tracked {
  explicit tracked(int v, std::shared_ptr<std::atomic<int>> live)
      : value(v), alive(std::make_shared<std::atomic<bool>>(true)), live_count(std::move(live)) {
    live_count->fetch_add(1);
  }
  tracked(tracked&& other) noexcept = default;
  tracked& operator=(tracked&&) = delete;
  ~tracked() {
    if (alive) {
      alive->store(false);
      live_count->fetch_sub(1);
    }
  }
  int value;
  std::shared_ptr<std::atomic<bool>> alive;  // outlives the payload, for checks after the fact
  std::shared_ptr<std::atomic<int>> live_count;
};

using token = std::shared_ptr<std::atomic<bool>>;  // "event": true once the GPU work completed
using chain = cubridge::version_chain<tracked, int, token>;

bool done(const token& t) {
  return t->load();
}
token pending_token() {
  return std::make_shared<std::atomic<bool>>(false);
}

TEST(VersionChain, PromoteMakesTheNewVersionCurrentAndKeepsTheOldForRollback) {
  auto live = std::make_shared<std::atomic<int>>(0);
  chain c(tracked(1, live));
  EXPECT_EQ(c.acquire().id(), 1u);
  EXPECT_FALSE(c.previous_id());
  EXPECT_EQ(c.promote(tracked(2, live)), 2u);
  EXPECT_EQ(c.acquire().payload().value, 2);
  EXPECT_EQ(c.previous_id(), 1u);
  EXPECT_EQ(c.rollback(), 1u);
  EXPECT_EQ(c.acquire().payload().value, 1);
  EXPECT_EQ(c.previous_id(), 2u);
  EXPECT_EQ(c.rollback(), 2u);
  EXPECT_EQ(live->load(), 2) << "current and rollback target stay loaded";
  EXPECT_EQ(c.get_stats().retired, 0u);
}

TEST(VersionChain, RollbackWithoutPreviousIsAPreconditionError) {
  auto live = std::make_shared<std::atomic<int>>(0);
  chain c(tracked(1, live));
  try {
    c.rollback();
    FAIL() << "no throw";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::precondition));
  }
}

TEST(VersionChain, RetiredVersionWaitsForItsLeases) {
  auto live = std::make_shared<std::atomic<int>>(0);
  chain c(tracked(1, live));
  auto in_flight = c.acquire();  // a launch of version 1 still on the host side
  c.promote(tracked(2, live));
  c.promote(tracked(3, live));  // version 1 is now retired
  EXPECT_EQ(c.get_stats().retired, 1u);
  EXPECT_EQ(c.reclaim(done), 0u) << "a lease pins version 1";
  EXPECT_TRUE(in_flight.payload().alive->load());
  in_flight = c.acquire();  // the launch finished; the slot now pins version 3
  EXPECT_EQ(c.reclaim(done), 1u);
  EXPECT_EQ(live->load(), 2);
  EXPECT_EQ(c.get_stats().reclaimed, 1u);
}

TEST(VersionChain, RetiredVersionWaitsForItsGpuWork) {
  auto live = std::make_shared<std::atomic<int>>(0);
  chain c(tracked(1, live));
  auto t_stream_a = pending_token();
  auto t_stream_b = pending_token();
  {
    auto l = c.acquire();
    l.record(/*stream*/ 7, t_stream_a);
    l.record(/*stream*/ 8, t_stream_b);
  }
  c.promote(tracked(2, live));
  c.promote(tracked(3, live));
  EXPECT_EQ(c.reclaim(done), 0u);
  t_stream_a->store(true);
  EXPECT_EQ(c.reclaim(done), 0u) << "stream 8 still runs version 1";
  t_stream_b->store(true);
  EXPECT_EQ(c.reclaim(done), 1u);
}

TEST(VersionChain, OnlyTheLatestTokenPerStreamIsKept) {
  auto live = std::make_shared<std::atomic<int>>(0);
  chain c(tracked(1, live));
  auto last = pending_token();
  {
    auto l = c.acquire();
    for (int i = 0; i < 1000; ++i) l.record(3, pending_token());  // older launches on stream 3
    l.record(3, last);
  }
  c.promote(tracked(2, live));
  c.promote(tracked(3, live));
  // The 1000 older tokens never complete in this test: only the latest one may matter, since
  // a stream completes its work in order.
  last->store(true);
  EXPECT_EQ(c.reclaim(done), 1u);
}

TEST(VersionChain, TenThousandSwapsStayBounded) {
  auto live = std::make_shared<std::atomic<int>>(0);
  chain c(tracked(0, live));
  for (int i = 1; i <= 10000; ++i) {
    auto t = pending_token();
    c.acquire().record(0, t);
    c.promote(tracked(i, live));
    t->store(true);
    c.reclaim(done);
    ASSERT_LE(live->load(), 3) << "current, rollback target and at most one retired";
  }
  EXPECT_EQ(c.get_stats().promotions, 10000u);
  EXPECT_EQ(c.get_stats().reclaimed, 9999u);
}

// Serving threads launch while a swapper promotes and a reclaimer reclaims. Checks, for every
// launch: the version it uses is alive for the whole launch; a launch that starts after promote()
// returned uses that version or a newer one; nothing leaks at the end. Run under TSan by
// `scripts/sanitize thread`.
void serve_swap_and_reclaim(bool with_rollbacks) {
  auto live = std::make_shared<std::atomic<int>>(0);
  constexpr int serving_threads = 8;
  constexpr int swaps = 2000;
  {
    chain c(tracked(0, live));
    std::atomic<std::uint64_t> promoted_id{1};
    std::atomic<bool> stop{false};
    std::atomic<long> launches{0}, violations{0}, dead_uses{0};
    // The "GPU": completes tokens a little later, in order.
    std::mutex gpu_mutex;
    std::vector<token> gpu_queue;

    std::vector<std::thread> servers;
    for (int s = 0; s < serving_threads; ++s)
      servers.emplace_back([&, s] {
        while (!stop.load()) {
          const auto floor = promoted_id.load(std::memory_order_acquire);
          auto l = c.acquire();
          if (l.id() < floor) violations.fetch_add(1);
          if (!l.payload().alive->load()) dead_uses.fetch_add(1);
          auto t = pending_token();
          l.record(s, t);
          {
            std::lock_guard lock(gpu_mutex);
            gpu_queue.push_back(t);
          }
          if (!l.payload().alive->load()) dead_uses.fetch_add(1);
          launches.fetch_add(1);
        }
      });
    std::thread gpu([&] {
      while (!stop.load()) {
        std::vector<token> batch;
        {
          std::lock_guard lock(gpu_mutex);
          batch.swap(gpu_queue);
        }
        for (auto& t : batch) t->store(true);
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    });
    std::thread reclaimer([&] {
      while (!stop.load()) {
        c.reclaim(done);
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    });
    // Swap only while the servers are launching, and let them run between swaps.
    while (launches.load() < 100 * serving_threads) std::this_thread::yield();
    const long launches_before = launches.load();
    for (int i = 1; i <= swaps; ++i) {
      if (i % 20 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
      const auto id = c.promote(tracked(i, live));
      promoted_id.store(id, std::memory_order_release);
      if (with_rollbacks && i % 97 == 0) {
        c.rollback();
        c.rollback();  // and back
      }
    }
    const long launches_during_swaps = launches.load() - launches_before;
    stop.store(true);
    for (auto& t : servers) t.join();
    gpu.join();
    reclaimer.join();
    {
      std::lock_guard lock(gpu_mutex);
      for (auto& t : gpu_queue) t->store(true);
    }
    c.reclaim(done);
    EXPECT_GT(launches_during_swaps, 1000) << "the swaps must overlap real serving";
    // A rollback legitimately makes an older version current for a moment.
    if (!with_rollbacks) {
      EXPECT_EQ(violations.load(), 0) << "a launch after promote() returned used an older version";
    }
    EXPECT_EQ(dead_uses.load(), 0) << "a launch used a version that was already destroyed";
    EXPECT_EQ(c.get_stats().retired, 0u);
    EXPECT_EQ(live->load(), 2) << "current and rollback target";
  }
  EXPECT_EQ(live->load(), 0) << "every version destroyed with the chain";
}

TEST(VersionChain, ConcurrentServingSwappingAndReclaiming) {
  serve_swap_and_reclaim(false);
}
TEST(VersionChain, ConcurrentServingWithRollbacks) {
  serve_swap_and_reclaim(true);
}

}  // namespace

namespace {

TEST(VersionChain, NotedStreamsGetTheirTokenOnceUnpinned) {
  auto live = std::make_shared<std::atomic<int>>(0);
  chain c(tracked(1, live));
  std::vector<int> made_for;
  std::vector<token> made;
  auto make = [&](const int& stream) {
    made_for.push_back(stream);
    made.push_back(pending_token());
    return made.back();
  };
  {
    auto l = c.acquire();
    l.note(4);
    l.note(5);
    l.note(4);  // the same stream again: still one entry
    c.promote(tracked(2, live));
    c.promote(tracked(3, live));
    EXPECT_EQ(c.reclaim(done, make), 0u);
    EXPECT_TRUE(made_for.empty()) << "no token while a lease can still queue work";
  }
  EXPECT_EQ(c.reclaim(done, make), 0u);
  ASSERT_EQ(made_for, (std::vector<int>{4, 5}));
  made[0]->store(true);
  EXPECT_EQ(c.reclaim(done, make), 0u);
  made[1]->store(true);
  EXPECT_EQ(c.reclaim(done, make), 1u);
  EXPECT_EQ(made_for.size(), 2u) << "tokens are made once";
}

TEST(VersionChain, ANoteAfterARecordNeedsAFreshToken) {
  auto live = std::make_shared<std::atomic<int>>(0);
  chain c(tracked(1, live));
  auto early = pending_token();
  early->store(true);
  {
    auto l = c.acquire();
    l.record(9, early);
    l.note(9);  // later work on the same stream: the early token no longer covers it
  }
  c.promote(tracked(2, live));
  c.promote(tracked(3, live));
  auto late = pending_token();
  EXPECT_EQ(c.reclaim(done, [&](const int&) { return late; }), 0u);
  late->store(true);
  EXPECT_EQ(c.reclaim(done), 1u);
}

TEST(VersionChain, ASealedStreamNeedsNoTokenLater) {
  auto live = std::make_shared<std::atomic<int>>(0);
  chain c(tracked(1, live));
  {
    auto l = c.acquire();
    l.note(6);
    l.note(7);
  }
  std::vector<int> sealed;
  auto last = pending_token();
  // Stream 6 is about to be destroyed: versions 1 (current now) and none other noted it.
  c.seal_stream(6, [&](const int& stream) {
    sealed.push_back(stream);
    return last;
  });
  EXPECT_EQ(sealed, (std::vector<int>{6}));
  c.promote(tracked(2, live));
  c.promote(tracked(3, live));
  std::vector<int> made_for;
  auto make = [&](const int& stream) {
    made_for.push_back(stream);
    auto t = pending_token();
    t->store(true);
    return t;
  };
  EXPECT_EQ(c.reclaim(done, make), 0u) << "stream 6's sealed work still runs";
  EXPECT_EQ(made_for, (std::vector<int>{7})) << "only the live stream gets a token made later";
  last->store(true);
  EXPECT_EQ(c.reclaim(done, make), 1u);
  EXPECT_EQ(made_for.size(), 1u);
  EXPECT_EQ(live->load(), 2);
}

TEST(VersionChain, SealingReachesCurrentPreviousAndRetiredVersions) {
  auto live = std::make_shared<std::atomic<int>>(0);
  chain c(tracked(1, live));
  std::vector<chain::lease> held;
  for (int v = 2; v <= 4; ++v) {
    held.push_back(c.acquire());
    held.back().note(3);
    c.promote(tracked(v, live));
  }
  held.push_back(c.acquire());
  held.back().note(3);  // versions 1 (retired), 2 (retired), 3 (previous), 4 (current)
  held.back().note(8);
  std::vector<int> sealed;  // the stream each token was made for
  c.seal_stream(3, [&](const int& stream) {
    sealed.push_back(stream);
    return pending_token();
  });
  EXPECT_EQ(sealed, (std::vector<int>{3, 3, 3, 3}));
}

/// A payload that runs a callback when destroyed (moved-from copies run nothing).
struct on_destroy {
  explicit on_destroy(std::function<void()> f) : run(std::move(f)) {}
  on_destroy(on_destroy&& other) noexcept : run(std::exchange(other.run, nullptr)) {}
  on_destroy& operator=(on_destroy&&) = delete;
  ~on_destroy() {
    if (run) run();
  }
  std::function<void()> run;
};

TEST(VersionChain, AVersionBeingDestroyedStillCountsAsRetired) {
  using probe_chain = cubridge::version_chain<on_destroy, int, token>;
  std::optional<probe_chain> c;
  probe_chain::stats seen{};
  bool destroyed = false;
  c.emplace(on_destroy([] {}));
  c->promote(on_destroy([&] {
    seen = c->get_stats();  // from inside the destructor: reclaim() holds no lock here
    destroyed = true;
  }));
  c->promote(on_destroy([] {}));
  c->promote(on_destroy([] {}));  // the callback version is retired now
  EXPECT_EQ(c->reclaim(done), 2u);
  ASSERT_TRUE(destroyed);
  EXPECT_EQ(seen.retired, 2u) << "versions being destroyed still count as retired";
  EXPECT_EQ(seen.reclaimed, 0u) << "reclaimed counts versions already destroyed";
  EXPECT_EQ(c->get_stats().retired, 0u);
  EXPECT_EQ(c->get_stats().reclaimed, 2u);
}

}  // namespace

// All or nothing (issue 11, item 13): what can fail runs before the switch, and a failure there
// leaves the chain as it was.
namespace {

TEST(VersionChain, AFailedPromotePrepareSwitchesNothing) {
  auto live = std::make_shared<std::atomic<int>>(0);
  chain c(tracked(1, live));
  c.promote(tracked(2, live));
  c.promote(tracked(3, live));  // current 3, rollback target 2, version 1 retired
  const auto before = c.get_stats();
  std::pair<std::uint64_t, std::uint64_t> seen{0, 0};
  int seen_value = 0;
  EXPECT_THROW(c.promote(tracked(4, live),
                         [&](const chain::version& from, const chain::version& to) {
                           seen = {from.id, to.id};
                           seen_value = to.payload.value;
                           EXPECT_EQ(c.acquire().id(), 3u) << "the new version is not visible yet";
                           throw std::runtime_error("a graph update failed");
                         }),
               std::runtime_error);
  EXPECT_EQ(seen, (std::pair<std::uint64_t, std::uint64_t>{3, 4}));
  EXPECT_EQ(seen_value, 4);
  EXPECT_EQ(c.acquire().id(), 3u);
  EXPECT_EQ(c.previous_id(), 2u);
  const auto after = c.get_stats();
  EXPECT_EQ(after.promotions, before.promotions);
  EXPECT_EQ(after.retired, before.retired);
  EXPECT_EQ(live->load(), 3) << "the refused payload is destroyed, versions 1-3 are untouched";
  EXPECT_EQ(c.promote(tracked(5, live)), 4u) << "the refused version's id is not used";
}

TEST(VersionChain, AFailedRollbackPrepareSwitchesNothing) {
  auto live = std::make_shared<std::atomic<int>>(0);
  chain c(tracked(1, live));
  c.promote(tracked(2, live));
  std::pair<std::uint64_t, std::uint64_t> seen{0, 0};
  EXPECT_THROW(c.rollback([&](const chain::version& from, const chain::version& to) {
    seen = {from.id, to.id};
    throw std::runtime_error("version 1 is too narrow");
  }),
               std::runtime_error);
  EXPECT_EQ(seen, (std::pair<std::uint64_t, std::uint64_t>{2, 1}));
  EXPECT_EQ(c.acquire().id(), 2u);
  EXPECT_EQ(c.previous_id(), 1u);
  EXPECT_EQ(c.get_stats().promotions, 1u);
  EXPECT_EQ(c.rollback([](const chain::version&, const chain::version&) {}), 1u);
  EXPECT_EQ(c.acquire().id(), 1u);
}

TEST(VersionChain, RollbackWithoutPreviousRunsNoPrepare) {
  auto live = std::make_shared<std::atomic<int>>(0);
  chain c(tracked(1, live));
  bool ran = false;
  try {
    c.rollback([&](const chain::version&, const chain::version&) { ran = true; });
    FAIL() << "no throw";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::precondition));
  }
  EXPECT_FALSE(ran);
}

// Reclaim failures (item 16): one version that cannot be checked does not hold back the others,
// and the caller hears about it.
TEST(VersionChain, AVersionWhoseTokenCannotBeMadeStaysRetiredAndTheOthersGo) {
  auto live = std::make_shared<std::atomic<int>>(0);
  chain c(tracked(1, live));
  c.acquire().note(5);  // version 1 launched on stream 5
  c.promote(tracked(2, live));
  c.acquire().note(6);  // version 2 on stream 6
  c.promote(tracked(3, live));
  c.promote(tracked(4, live));  // versions 1 and 2 retired, in that order
  auto completed = [](const int&) {
    auto t = pending_token();
    t->store(true);
    return t;
  };
  auto no_event_for_5 = [&](const int& stream) -> token {
    if (stream == 5) throw std::runtime_error("no event for stream 5");
    return completed(stream);
  };
  std::vector<std::pair<std::uint64_t, std::string>> failures;
  auto on_failure = [&](std::uint64_t id, std::exception_ptr e) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      failures.emplace_back(id, x.what());
    }
  };
  EXPECT_EQ(c.reclaim(done, no_event_for_5, on_failure), 1u)
      << "version 2 is reclaimed although version 1, before it, failed";
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0], (std::pair<std::uint64_t, std::string>{1, "no event for stream 5"}));
  EXPECT_EQ(c.get_stats().retired, 1u);
  EXPECT_EQ(live->load(), 3);
  // Without a failure handler the failure propagates, as before.
  EXPECT_THROW(c.reclaim(done, no_event_for_5), std::runtime_error);
  // Once the failure passes, a later call reclaims version 1.
  EXPECT_EQ(c.reclaim(done, completed, on_failure), 1u);
  EXPECT_EQ(failures.size(), 1u);
  EXPECT_EQ(c.get_stats().retired, 0u);
  EXPECT_EQ(live->load(), 2);
}

// The background reclaimer's loop (item 11). Its old form looked at the retired count, then
// waited with no predicate, and promote() notified without its mutex: a promotion between the
// look and the wait was never seen, and the retired version stayed loaded until the next one.
using cubridge::detail::reclaim_pass;
using cubridge::detail::reclaim_signal;
using cubridge::detail::run_reclaimer;
using namespace std::chrono_literals;

/// Polls `condition` for up to 20 s (generous: it is about a lost wake-up, not speed).
template <class Condition>
bool eventually(Condition condition) {
  for (int i = 0; i < 2000; ++i) {
    if (condition()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return condition();
}

TEST(Reclaimer, APromotionBetweenItsLookAndItsWaitStillWakesIt) {
  auto live = std::make_shared<std::atomic<int>>(0);
  chain c(tracked(1, live));
  c.promote(tracked(2, live));  // nothing retired yet: the reclaimer will sleep with no timeout
  reclaim_signal signal;
  bool promoted = false;  // the reclaimer thread's own
  std::thread reclaimer([&] {
    run_reclaimer(
        signal,
        [&] {
          c.reclaim(done);
          return reclaim_pass{c.get_stats().retired != 0, false};
        },
        1ms, 100ms,
        [&] {
          // The first pass found nothing to do; before it waits, version 1 is retired and the
          // reclaimer told, exactly in the window where the wake-up used to be lost.
          if (promoted) return;
          promoted = true;
          c.promote(tracked(3, live));
          signal.notify();
        });
  });
  const bool reclaimed = eventually([&] { return c.get_stats().reclaimed == 1; });
  signal.stop();
  reclaimer.join();
  EXPECT_TRUE(reclaimed) << "the notify() between the reclaimer's look and its wait was lost";
  EXPECT_EQ(live->load(), 2);
}

TEST(Reclaimer, SleepsUntilNotifiedAndStopsWhenTold) {
  reclaim_signal signal;
  std::atomic<int> passes{0};
  std::thread reclaimer([&] {
    run_reclaimer(
        signal,
        [&] {
          passes.fetch_add(1);
          return reclaim_pass{};
        },
        1ms, 100ms, [] {});
  });
  ASSERT_TRUE(eventually([&] { return passes.load() == 1; }));
  signal.notify();
  EXPECT_TRUE(eventually([&] { return passes.load() == 2; })) << "a notify() wakes it";
  signal.stop();
  reclaimer.join();  // returns: stop() wakes it too
  EXPECT_EQ(passes.load(), 2);
}

TEST(Reclaimer, PollsWhileVersionsWaitAndBacksOffAfterAFailure) {
  reclaim_signal signal;
  std::atomic<int> passes{0}, failed_passes{0};
  std::atomic<bool> failing{false};
  std::thread reclaimer([&] {
    run_reclaimer(
        signal,
        [&] {
          passes.fetch_add(1);
          const bool failed = failing.load();
          if (failed) failed_passes.fetch_add(1);
          return reclaim_pass{true, failed};
        },
        1ms, std::chrono::hours(1), [] {});
  });
  EXPECT_TRUE(eventually([&] { return passes.load() >= 3; })) << "polls with no notify()";
  failing.store(true);
  ASSERT_TRUE(eventually([&] { return failed_passes.load() == 1; }));
  const int after_failure = passes.load();  // final: the failed pass counted itself first
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(passes.load(), after_failure) << "after a failure it waits failure_poll, not poll";
  EXPECT_EQ(failed_passes.load(), 1);
  signal.notify();  // a promotion still wakes it at once
  EXPECT_TRUE(eventually([&] { return failed_passes.load() == 2; }));
  signal.stop();
  reclaimer.join();
}

// --- where each version came from (version_origin) ---------------------------------------------

using plain_chain = cubridge::version_chain<int, int, int>;

cubridge::version_origin from_bundle(std::uint64_t version) {
  return {version, "00112233aabbccdd", "bundle v" + std::to_string(version),
          std::chrono::system_clock::time_point(std::chrono::seconds(version))};
}

TEST(VersionChainOrigin, EachVersionKeepsItsOriginThroughPromoteAndRollback) {
  plain_chain c(1, from_bundle(1));
  auto held = c.held();
  EXPECT_EQ(held.serving.id, 1u);
  EXPECT_EQ(held.serving.origin.label, 1u);
  EXPECT_FALSE(held.rollback_target.has_value());
  EXPECT_TRUE(held.retired.empty());

  EXPECT_EQ(c.promote(2, from_bundle(7)), 2u);
  held = c.held();
  EXPECT_EQ(held.serving.id, 2u);
  EXPECT_EQ(held.serving.origin.label, 7u);
  EXPECT_EQ(held.serving.origin.signer, "00112233aabbccdd");
  EXPECT_EQ(held.serving.origin.source, "bundle v7");
  EXPECT_EQ(held.serving.origin.staged_at.time_since_epoch(), std::chrono::seconds(7));
  ASSERT_TRUE(held.rollback_target.has_value());
  EXPECT_EQ(held.rollback_target->id, 1u);
  EXPECT_EQ(held.rollback_target->origin.label, 1u);
  EXPECT_EQ(c.acquire().get().origin.label, 7u) << "a lease sees the origin too";

  // A version from no bundle (a watched directory, a direct promote): bundle version 0.
  EXPECT_EQ(c.promote(3, cubridge::version_origin{0, {}, "kernels.cu", {}}), 3u);
  held = c.held();
  EXPECT_EQ(held.serving.origin.label, 0u);
  EXPECT_EQ(held.serving.origin.source, "kernels.cu");
  EXPECT_EQ(held.rollback_target->origin.label, 7u);
  ASSERT_EQ(held.retired.size(), 1u);
  EXPECT_EQ(held.retired[0].id, 1u);
  EXPECT_EQ(held.retired[0].origin.label, 1u);

  // Rollback swaps serving and target, origins with them: whoever rolls back, the chain says
  // what serves now and what came before.
  EXPECT_EQ(c.rollback(), 2u);
  held = c.held();
  EXPECT_EQ(held.serving.id, 2u);
  EXPECT_EQ(held.serving.origin.label, 7u);
  EXPECT_EQ(held.rollback_target->id, 3u);
  EXPECT_EQ(held.rollback_target->origin.source, "kernels.cu");

  // Reclaimed versions leave held().
  EXPECT_EQ(c.reclaim([](int) { return true; }), 1u);
  EXPECT_TRUE(c.held().retired.empty());
}

TEST(VersionChainOrigin, AFailedPromoteLeavesHeldUnchangedAndUnmarkedVersionsHaveNoOrigin) {
  plain_chain c(1);  // no origin given: all defaults
  EXPECT_EQ(c.held().serving.origin.label, 0u);
  EXPECT_TRUE(c.held().serving.origin.source.empty());
  EXPECT_THROW(c.promote(2, from_bundle(9),
                         [](const auto&, const auto&) { throw std::runtime_error("refused"); }),
               std::runtime_error);
  const auto held = c.held();
  EXPECT_EQ(held.serving.id, 1u);
  EXPECT_EQ(held.serving.origin.label, 0u);
  EXPECT_FALSE(held.rollback_target.has_value());
  EXPECT_EQ(c.promote(2), 2u);  // the plain overloads still work: no origin
  EXPECT_EQ(c.held().serving.origin.label, 0u);
  EXPECT_EQ(c.held().rollback_target->id, 1u);
}

}  // namespace
