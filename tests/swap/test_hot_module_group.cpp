// hot_module_group on a GPU: one promote across every member, all or nothing; rollback of every
// member; launches routed by their stream's context; pinned generations across a swap; a swap
// under load with a serving thread per member. The members are contexts of their own: one per
// device where the machine has several GPUs (MultiGpu tests, skipped with one GPU), and several
// contexts of device 0 otherwise, which exercises the same logic on one GPU.
#include <cubridge/core/context.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/core/stream.hpp>
#include <cubridge/swap/hot_module_group.hpp>

#include "hot_module_fixture.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

using cubridge::testing::hot_image;
using cubridge::testing::read_back;

/// One member's side: its context, a stream of it and a buffer the kernel writes into.
struct member_side {
  cubridge::context ctx;
  cubridge::stream stream;
  cubridge::driver_buffer<unsigned> out;
};

member_side make_side(cubridge::device dev) {
  auto ctx = cubridge::context::create(dev);
  cubridge::scoped_current current(ctx);
  auto stream = cubridge::stream::create(ctx);
  auto out = cubridge::driver_buffer<unsigned>::allocate(ctx, 256);
  return {std::move(ctx), std::move(stream), std::move(out)};
}

/// What write_version wrote into `side`'s buffer after the stream's work (element 255).
unsigned written(member_side& side) {
  cubridge::scoped_current current(side.ctx);
  side.stream.synchronize();
  return read_back(side.out, 255);
}

/// `members` contexts (on devices 0, 1, ... when `per_device`, else all on device 0) and the
/// group "versions" loaded from v1 over them.
class HotModuleGroup : public ::testing::Test {
 protected:
  void make(std::size_t members, bool per_device) {
    for (std::size_t i = 0; i < members; ++i)
      sides_.push_back(make_side(cubridge::device::get(per_device ? static_cast<int>(i) : 0)));
    std::vector<cubridge::context_arg> contexts;
    for (auto& s : sides_) contexts.emplace_back(s.ctx);
    group_.emplace(cubridge::hot_module_group::load("versions", contexts, hot_image("v1")));
  }
  void SetUp() override {
    CUBRIDGE_REQUIRE_GPU();
    if (cubridge::device::get(0).capability().major != 9) GTEST_SKIP() << "test images are sm_90";
  }
  /// Launches write_version on member `i`'s stream through the group; returns the version id
  /// the launch reported and checks that the GPU wrote it.
  std::uint64_t launch_on(std::size_t i) {
    auto k = group_->get_kernel("write_version");
    const auto id = k.launch({.block = {256}, .stream = sides_[i].stream}, sides_[i].out.span());
    const auto tag = tags_.find(id);
    EXPECT_EQ(written(sides_[i]), tag == tags_.end() ? id : tag->second) << "member " << i;
    return id;
  }
  std::vector<std::uint64_t> launch_on_all() {
    std::vector<std::uint64_t> ids;
    for (std::size_t i = 0; i < sides_.size(); ++i) ids.push_back(launch_on(i));
    return ids;
  }
  std::vector<member_side> sides_;
  std::optional<cubridge::hot_module_group> group_;
  /// What write_version of a version writes, where it is not the version's id (the image's
  /// VERSION: v1 staged again as version 3 writes 1).
  std::map<std::uint64_t, unsigned> tags_;
};

using ids = std::vector<std::uint64_t>;

TEST_F(HotModuleGroup, PromoteSwitchesEveryMemberAndRollbackReturnsEvery) {
  make(3, false);
  EXPECT_EQ(group_->size(), 3u);
  EXPECT_EQ(launch_on_all(), (ids{1, 1, 1}));
  EXPECT_EQ(group_->promote(group_->stage(hot_image("v2"))), 2u);
  EXPECT_EQ(launch_on_all(), (ids{2, 2, 2}));
  EXPECT_EQ(group_->serving(), (cubridge::generation{2, {2, 2, 2}}));
  EXPECT_EQ(group_->rollback(), 1u);
  EXPECT_EQ(launch_on_all(), (ids{1, 1, 1}));
  const auto stats = group_->stats();
  EXPECT_EQ(stats.promotions, 2u);
  EXPECT_EQ(stats.rollbacks, 1u);
  ASSERT_EQ(stats.members.size(), 3u);
  for (const auto& m : stats.members) EXPECT_EQ(m.current_id, 1u);
  // Each member is named for messages by its index and device.
  EXPECT_EQ(group_->member(2).name(), "versions [member 2, device 0]");
}

TEST_F(HotModuleGroup, OneMemberRefusingTheStageStagesNothingAnywhere) {
  make(3, false);
  const CUcontext refusing = sides_[2].ctx.get();
  std::atomic<int> tested{0};
  cubridge::stage_options options;
  options.smoke_test = [&](const cubridge::module& staged) {
    ++tested;
    if (staged.context().get() == refusing) throw std::runtime_error("wrong answers here");
  };
  try {
    (void)group_->stage(hot_image("v2"), options);
    FAIL() << "the stage was not refused";
  } catch (const cubridge::version_rejected_error& e) {
    EXPECT_NE(std::string(e.what()).find("member 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("wrong answers here"), std::string::npos) << e.what();
  }
  EXPECT_EQ(tested.load(), 3);  // staged on every member at once, then dropped on all
  EXPECT_EQ(launch_on_all(), (ids{1, 1, 1}));
  EXPECT_EQ(group_->stats().rejected, 1u);
  for (std::size_t i = 0; i < 3; ++i) {
    const auto held = group_->member(i).versions();
    EXPECT_EQ(held.serving.id, 1u);
    EXPECT_FALSE(held.rollback_target.has_value());
    EXPECT_TRUE(held.retired.empty());
  }
  // A version that every member takes is staged and promoted afterwards.
  EXPECT_EQ(group_->promote(group_->stage(hot_image("v2"))), 2u);
  EXPECT_EQ(launch_on_all(), (ids{2, 2, 2}));
}

TEST_F(HotModuleGroup, OneMemberRefusingThePromoteSwitchesNone) {
  make(3, false);
  // v2 with at most 128 threads per block is staged while the launches fit it...
  auto k = group_->get_kernel("write_version");
  for (std::size_t i = 0; i < 3; ++i)
    (void)k.launch({.block = {128}, .stream = sides_[i].stream}, sides_[i].out.span());
  auto small = group_->stage(hot_image("small"));
  // ... then member 1 alone launches with 256: that member refuses the promote.
  EXPECT_EQ(launch_on(1), 1u);
  try {
    (void)group_->promote(std::move(small));
    FAIL() << "the promote was not refused";
  } catch (const cubridge::version_rejected_error& e) {
    EXPECT_NE(std::string(e.what()).find("member 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("256 threads per block"), std::string::npos) << e.what();
  }
  EXPECT_EQ(launch_on_all(), (ids{1, 1, 1}));
  EXPECT_EQ(group_->serving().id, 1u);
  EXPECT_EQ(group_->stats().rejected, 1u);
  EXPECT_THROW((void)group_->rollback(), cubridge::error);  // no generation before this one
}

TEST_F(HotModuleGroup, AStreamOfAContextOutsideTheGroupIsRefused) {
  make(2, false);
  auto outsider = make_side(cubridge::device::get(0));
  auto k = group_->get_kernel("write_version");
  try {
    (void)k.launch({.block = {256}, .stream = outsider.stream}, outsider.out.span());
    FAIL() << "a launch outside the group was taken";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::precondition)) << e.what();
    EXPECT_NE(std::string(e.what()).find("has no member in"), std::string::npos) << e.what();
  }
  // The legacy default stream goes to the member whose context is current.
  {
    cubridge::scoped_current current(sides_[1].ctx);
    EXPECT_EQ(k.launch({.block = {256}, .stream = cubridge::stream_ref::legacy_default()},
                       sides_[1].out.span()),
              1u);
    EXPECT_EQ(cubridge::driver::api().cuCtxSynchronize(), CUDA_SUCCESS);
    EXPECT_EQ(read_back(sides_[1].out, 255), 1u);
  }
  EXPECT_EQ(group_->member_of(sides_[1].ctx), 1u);
  // A context given twice is refused at load.
  std::vector<cubridge::context_arg> twice = {sides_[0].ctx, sides_[0].ctx};
  EXPECT_THROW((void)cubridge::hot_module_group::load("twice", twice, hot_image("v1")),
               cubridge::error);
}

TEST_F(HotModuleGroup, APinnedGenerationServesThroughAPromoteAndIsUnloadedAfter) {
  make(2, false);
  auto k = group_->get_kernel("write_version");
  std::optional<cubridge::pinned_generation> step(group_->pin());
  EXPECT_EQ(step->id(), 1u);
  EXPECT_EQ(group_->promote(group_->stage(hot_image("v2"))), 2u);
  EXPECT_EQ(group_->promote(group_->stage(hot_image("v1"))), 3u);
  tags_[3] = 1;
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(k.launch(*step, {.block = {256}, .stream = sides_[i].stream}, sides_[i].out.span()),
              1u);
    EXPECT_EQ(written(sides_[i]), 1u);
  }
  EXPECT_EQ(launch_on_all(), (ids{3, 3}));  // v1's bytes as version 3
  // Version 1 is retired on both members (v2 is the rollback target) but pinned: still loaded.
  group_->reclaim();
  for (std::size_t i = 0; i < 2; ++i) EXPECT_EQ(group_->member(i).stats().retired_waiting, 1u);
  step.reset();
  for (auto& s : sides_) written(s);  // the pinned launches completed
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (group_->stats().members[0].retired_waiting + group_->stats().members[1].retired_waiting >
             0 &&
         std::chrono::steady_clock::now() < deadline) {
    group_->reclaim();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(group_->member(i).stats().retired_waiting, 0u);
    EXPECT_EQ(group_->member(i).stats().unloaded, 1u);
  }
  // A generation pinned from another group is refused.
  std::vector<cubridge::context_arg> contexts = {sides_[0].ctx};
  auto other = cubridge::hot_module_group::load("other", contexts, hot_image("v1"));
  EXPECT_THROW((void)k.launch(other.pin(), {.block = {256}, .stream = sides_[0].stream},
                              sides_[0].out.span()),
               cubridge::error);
}

/// A swap under load: one serving thread per member launching unpinned, one thread running
/// multi-member steps (a pinned generation launched on every member, every launch must report
/// the generation's id), and a promoter switching versions back and forth. Returns a summary.
struct load_result {
  long launches = 0, failed = 0, steps = 0, mixed = 0, wrong_output = 0;
  std::vector<long> per_member;
  int switches = 0;
  double max_gap_ms = 0;  // the longest a serving thread waited between two launches
};

/// The switches swap_under_load makes: every fourth a rollback, the others promotes of v2 and v1
/// in turn. Returns what write_version writes for each version id (index: id) they make.
std::vector<unsigned> planned_tags(int switches) {
  std::vector<unsigned> tags = {0, 1};  // id 0 unused; id 1: the v1 loaded first
  for (int i = 0; i < switches; ++i)
    if (i % 4 != 3) tags.push_back(i % 2 == 0 ? 2 : 1);
  return tags;
}

load_result swap_under_load(cubridge::hot_module_group& group, std::vector<member_side>& sides,
                            int switches) {
  const auto tags = planned_tags(switches);
  load_result r;
  r.per_member.assign(sides.size(), 0);
  std::atomic<bool> stop{false};
  std::mutex mutex;
  auto k = group.get_kernel("write_version");
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < sides.size(); ++i)
    threads.emplace_back([&, i] {
      cubridge::scoped_current current(sides[i].ctx);
      auto stream = cubridge::stream::create(sides[i].ctx);
      auto out = cubridge::driver_buffer<unsigned>::allocate(sides[i].ctx, 256);
      long launches = 0, failed = 0, wrong = 0;
      double max_gap = 0;
      auto last = std::chrono::steady_clock::now();
      while (!stop.load()) {
        try {
          const auto id = k.launch({.block = {256}, .stream = stream}, out.span());
          stream.synchronize();
          if (id >= tags.size() || read_back(out, 255) != tags[id]) ++wrong;
          ++launches;
        } catch (const std::exception&) {
          ++failed;
        }
        const auto now = std::chrono::steady_clock::now();
        max_gap = std::max(max_gap, std::chrono::duration<double, std::milli>(now - last).count());
        last = now;
      }
      std::lock_guard lock(mutex);
      r.launches += launches;
      r.failed += failed;
      r.wrong_output += wrong;
      r.per_member[i] = launches;
      r.max_gap_ms = std::max(r.max_gap_ms, max_gap);
    });
  threads.emplace_back([&] {
    long steps = 0, mixed = 0, failed = 0;
    while (!stop.load()) {
      try {
        const auto step = group.pin();
        for (std::size_t i = 0; i < sides.size(); ++i) {
          const auto id =
              k.launch(step, {.block = {256}, .stream = sides[i].stream}, sides[i].out.span());
          if (id != step.id()) ++mixed;
        }
        ++steps;
      } catch (const std::exception&) {
        ++failed;
      }
    }
    std::lock_guard lock(mutex);
    r.steps = steps;
    r.mixed = mixed;
    r.failed += failed;
  });
  const auto v1 = hot_image("v1");
  const auto v2 = hot_image("v2");
  for (int i = 0; i < switches; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if (i % 4 == 3)
      (void)group.rollback();
    else
      (void)group.promote(group.stage(i % 2 == 0 ? v2 : v1));
    ++r.switches;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  stop = true;
  for (auto& t : threads) t.join();
  return r;
}

void expect_clean(const load_result& r, std::size_t members) {
  std::printf("group swap under load: %d switches, %ld launches (", r.switches, r.launches);
  for (std::size_t i = 0; i < members; ++i) std::printf("%s%ld", i ? " / " : "", r.per_member[i]);
  std::printf(
      " per member), %ld failed, %ld wrong outputs; %ld pinned steps, %ld mixed; longest "
      "gap between launches %.2f ms\n",
      r.failed, r.wrong_output, r.steps, r.mixed, r.max_gap_ms);
  EXPECT_EQ(r.failed, 0);
  EXPECT_EQ(r.wrong_output, 0);
  EXPECT_EQ(r.mixed, 0);
  EXPECT_GT(r.steps, 0);
  for (std::size_t i = 0; i < members; ++i) EXPECT_GT(r.per_member[i], 0) << "member " << i;
}

TEST_F(HotModuleGroup, SwapUnderLoadFailsNoLaunchAndMixesNoGeneration) {
  make(3, false);
  const auto r = swap_under_load(*group_, sides_, 60);
  expect_clean(r, 3);
  // Every member's retired versions are unloaded once their work is done.
  for (auto& s : sides_) written(s);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  std::size_t waiting = 0;
  do {
    group_->reclaim();
    waiting = 0;
    for (const auto& m : group_->stats().members) waiting += m.retired_waiting;
  } while (waiting > 0 && std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(waiting, 0u);
}

// On a machine with two or more GPUs: the same with one member per device.
TEST_F(HotModuleGroup, MultiGpu_SwapUnderLoadWithAMemberPerDevice) {
  const int devices = cubridge::device::count();
  if (devices < 2) GTEST_SKIP() << "needs two GPUs; this machine has " << devices;
  for (int d = 0; d < devices; ++d)
    if (cubridge::device::get(d).capability().major != 9)
      GTEST_SKIP() << "test images are sm_90; device " << d << " is not";
  make(static_cast<std::size_t>(devices), true);
  EXPECT_EQ(launch_on_all(), ids(static_cast<std::size_t>(devices), 1));
  const auto r = swap_under_load(*group_, sides_, 60);
  expect_clean(r, static_cast<std::size_t>(devices));
}

}  // namespace
