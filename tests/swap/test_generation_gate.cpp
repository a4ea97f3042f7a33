// generation_gate without a GPU: a group's switch is all or nothing, members switch only after
// every member's checks passed, rollback returns every member, and a pin never sees two
// generations at once, with switches running beside it.
#include <cubridge/swap/generation_gate.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using cubridge::generation;
using cubridge::generation_gate;

/// A member as a hot module behaves in a group switch: its checks may fail (`refuse`), it
/// switches only after `inner` returned, and it undoes its work (counted) if `inner` throws.
struct fake_member {
  mutable std::mutex mutex;  // as a version chain's current pointer
  std::uint64_t serving = 1;
  std::uint64_t previous = 0;
  std::uint64_t next_id = 2;
  bool refuse = false;
  int undone = 0;
  std::vector<std::string>* log = nullptr;
  std::string name;

  std::uint64_t read() const {
    std::lock_guard lock(mutex);
    return serving;
  }
  std::uint64_t switch_to(std::uint64_t id, const std::function<void()>& inner) {
    if (log) log->push_back(name + " checked");
    if (refuse) throw std::runtime_error(name + " refuses");
    try {
      inner();
    } catch (...) {
      ++undone;
      throw;
    }
    std::lock_guard lock(mutex);
    previous = serving;
    serving = id;
    if (log) log->push_back(name + " switched");
    // Widens the window in which the members disagree, for the pin test to look into.
    std::this_thread::yield();
    return id;
  }
  std::uint64_t promote(const std::function<void()>& inner) {
    const auto id = switch_to(next_id, inner);
    ++next_id;
    return id;
  }
  std::uint64_t rollback(const std::function<void()>& inner) { return switch_to(previous, inner); }
};

struct group {
  explicit group(std::size_t n) : members(n), gate(std::vector<std::uint64_t>(n, 1)) {
    for (std::size_t i = 0; i < n; ++i) members[i].name = "m" + std::to_string(i);
  }
  generation promote() {
    return gate.promote([this](std::size_t i, const std::function<void()>& inner) {
      return members[i].promote(inner);
    });
  }
  std::optional<generation> rollback() {
    return gate.rollback([this](std::size_t i, const std::function<void()>& inner) {
      return members[i].rollback(inner);
    });
  }
  std::vector<std::uint64_t> serving() const {
    std::vector<std::uint64_t> out;
    out.reserve(members.size());
    for (const auto& m : members) out.push_back(m.read());
    return out;
  }
  std::vector<fake_member> members;
  generation_gate gate;
};

TEST(GenerationGate, EveryMemberIsCheckedBeforeAnySwitchesAndTheLastSwitchesFirst) {
  group g(3);
  std::vector<std::string> log;
  for (auto& m : g.members) m.log = &log;
  const auto next = g.promote();
  EXPECT_EQ(next, (generation{2, {2, 2, 2}}));
  EXPECT_EQ(log, (std::vector<std::string>{"m0 checked", "m1 checked", "m2 checked", "m2 switched",
                                           "m1 switched", "m0 switched"}));
  EXPECT_EQ(g.gate.current(), next);
  EXPECT_EQ(g.gate.previous(), (generation{1, {1, 1, 1}}));
  EXPECT_EQ(g.gate.switches(), 1u);
}

TEST(GenerationGate, OneMemberRefusingSwitchesNoneAndTheOthersUndo) {
  for (std::size_t refusing = 0; refusing < 4; ++refusing) {
    SCOPED_TRACE("member " + std::to_string(refusing) + " refuses");
    group g(4);
    g.members[refusing].refuse = true;
    EXPECT_THROW((void)g.promote(), std::runtime_error);
    EXPECT_EQ(g.serving(), (std::vector<std::uint64_t>{1, 1, 1, 1}));
    for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(g.members[i].undone, i < refusing ? 1 : 0);
    EXPECT_EQ(g.gate.current(), (generation{1, {1, 1, 1, 1}}));
    EXPECT_FALSE(g.gate.previous().has_value());
    EXPECT_EQ(g.gate.switches(), 0u);
    // The gate is open again: a pin does not wait, and the next promote works.
    g.members[refusing].refuse = false;
    EXPECT_EQ(g.gate.pin([&] { return g.serving(); }).second, 1u);
    EXPECT_EQ(g.promote().id, 2u);
    EXPECT_EQ(g.serving(), (std::vector<std::uint64_t>{2, 2, 2, 2}));
  }
}

TEST(GenerationGate, RollbackReturnsEveryMemberAndNeedsAPreviousGeneration) {
  group g(2);
  EXPECT_FALSE(g.rollback().has_value());  // nothing to go back to: no step ran
  EXPECT_EQ(g.members[0].undone + g.members[1].undone, 0);
  (void)g.promote();
  (void)g.promote();
  EXPECT_EQ(g.serving(), (std::vector<std::uint64_t>{3, 3}));
  const auto back = g.rollback();
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(*back, (generation{2, {2, 2}}));
  EXPECT_EQ(g.serving(), (std::vector<std::uint64_t>{2, 2}));
  EXPECT_EQ(g.gate.previous(), (generation{3, {3, 3}}));
  // A refused rollback leaves both where they were.
  g.members[1].refuse = true;
  EXPECT_THROW((void)g.rollback(), std::runtime_error);
  EXPECT_EQ(g.serving(), (std::vector<std::uint64_t>{2, 2}));
  EXPECT_EQ(g.gate.current().id, 2u);
}

TEST(GenerationGate, APinNeverSeesTwoGenerationsWhileSwitchesRun) {
  group g(4);
  std::atomic<bool> stop{false};
  std::atomic<long> pins{0}, mixed{0}, wrong_id{0};
  std::vector<std::thread> readers;
  readers.reserve(3);
  for (int r = 0; r < 3; ++r)
    readers.emplace_back([&] {
      while (!stop.load()) {
        const auto [seen, id] = g.gate.pin([&] { return g.serving(); });
        for (const auto v : seen)
          if (v != seen[0]) ++mixed;
        // Every member's version id is the generation's id here (as in a hot_module_group).
        if (seen[0] != id) ++wrong_id;
        ++pins;
      }
    });
  // Promotes and rollbacks, mixed; the readers' pins interleave with them.
  constexpr int switches = 2000;
  for (int i = 0; i < switches; ++i) {
    if (i % 3 == 2)
      (void)g.rollback();
    else
      (void)g.promote();
  }
  // Let the readers pin a while after the last switch too.
  const auto seen_at_end = pins.load();
  while (pins.load() < seen_at_end + 100) std::this_thread::yield();
  stop = true;
  for (auto& r : readers) r.join();
  EXPECT_EQ(mixed.load(), 0);
  EXPECT_EQ(wrong_id.load(), 0);
  EXPECT_GT(pins.load(), 100);
  EXPECT_EQ(g.gate.switches(), static_cast<std::uint64_t>(switches));
}

}  // namespace
