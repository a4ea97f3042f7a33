// Tests of the compare-and-apply between an update and a swap (swap_target.hpp) on a GPU: a
// version's label is compared with the serving one's inside the promote's lock, so a push, a
// fleet apply and a hot reloader racing one another never make a lower version serve after a
// higher one did.
#include <cubridge/bundle/bundle.hpp>
#include <cubridge/swap/hot_module_group.hpp>
#include <cubridge/swap/hot_reload.hpp>
#include <cubridge/update/update_gate.hpp>
#include <cubridge/update_swap/hot_module_sink.hpp>

#include "eventually.hpp"
#include "hot_module_fixture.hpp"
#include "temp_dir.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>
#include <utility>
#include <vector>

namespace {

using cubridge::apply_outcome;
using cubridge::promote_condition;
using cubridge::testing::hot_image;

class CompareAndApply : public cubridge::testing::hot_module_fixture {
 protected:
  void SetUp() override {
    hot_module_fixture::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    hot_.emplace(
        cubridge::hot_module::load(*ctx_, "versions", hot_image("v1"), {.origin = {.label = 1}}));
  }
  [[nodiscard]] std::vector<std::byte> signed_bundle(std::uint64_t version) const {
    cubridge::bundle_manifest_input in{"versions", version, "sm_90", cubridge::payload_kind::cubin};
    return cubridge::sign_bundle(in, hot_image(version % 2 ? "v1" : "v2"), keys_.secret_key);
  }
  cubridge::keypair keys_ = cubridge::generate_keypair();
};

TEST_F(CompareAndApply, AHotModuleRefusesALabelNotAboveTheServingOne) {
  const auto v2 = hot_image("v2");
  auto r =
      hot_->stage_and_promote(v2, nullptr, {.label = 5}, promote_condition::label_above_serving);
  EXPECT_EQ(r.outcome, apply_outcome::promoted);
  EXPECT_EQ(r.serving_label, 5u);
  EXPECT_EQ(run_write_version(), 2u);

  for (const std::uint64_t label : {3u, 5u}) {
    r = hot_->stage_and_promote(hot_image("v1"), nullptr, {.label = label},
                                promote_condition::label_above_serving);
    EXPECT_EQ(r.outcome, apply_outcome::not_newer) << label;
    EXPECT_EQ(r.serving_label, 5u) << "the refusal names what kept serving";
    EXPECT_EQ(run_write_version(), 2u) << "nothing switched";
  }
  EXPECT_EQ(hot_->stats().rejected, 0u) << "not newer is no bad version";

  // An operator's word goes below.
  r = hot_->stage_and_promote(hot_image("v1"), nullptr, {.label = 2}, promote_condition::always);
  EXPECT_EQ(r.outcome, apply_outcome::promoted);
  EXPECT_EQ(hot_->versions().serving.origin.label, 2u);
  EXPECT_EQ(run_write_version(), 1u);
}

TEST_F(CompareAndApply, AGroupComparesForEveryMember) {
  auto group = cubridge::hot_module_group::load("grouped", {*ctx_}, hot_image("v1"),
                                                {.origin = {.label = 4}});
  cubridge::swap_target& target = group;  // the one face the sink holds
  auto r = target.stage_and_promote(hot_image("v2"), nullptr, {.label = 4},
                                    promote_condition::label_above_serving);
  EXPECT_EQ(r.outcome, apply_outcome::not_newer);
  EXPECT_EQ(r.serving_label, 4u);
  r = target.stage_and_promote(hot_image("v2"), nullptr, {.label = 6},
                               promote_condition::label_above_serving);
  EXPECT_EQ(r.outcome, apply_outcome::promoted);
  EXPECT_EQ(group.member(0).versions().serving.origin.label, 6u);
  EXPECT_EQ(target.counters().promotions, 1u);
}

TEST_F(CompareAndApply, ASinkNamesTheVersionThatKeptServing) {
  auto sink = std::make_shared<cubridge::hot_module_sink>();
  sink->add(*hot_);
  const cubridge::trusted_keys keys{keys_.public_key};
  auto r = sink->apply(cubridge::verify_bundle(signed_bundle(6), keys),
                       cubridge::apply_rule::above_serving);
  ASSERT_EQ(r.reason, cubridge::gate_reason::none) << r.detail;
  EXPECT_EQ(r.serving_version, 6u);
  r = sink->apply(cubridge::verify_bundle(signed_bundle(4), keys),
                  cubridge::apply_rule::above_serving);
  EXPECT_EQ(r.reason, cubridge::gate_reason::older_version);
  EXPECT_EQ(r.serving_version, 6u);
  EXPECT_NE(r.detail.find("v6"), std::string::npos) << r.detail;
  r = sink->apply(cubridge::verify_bundle(signed_bundle(6), keys),
                  cubridge::apply_rule::above_serving);
  EXPECT_EQ(r.reason, cubridge::gate_reason::replayed_version);
}

// Three promoters at once: the update endpoint's push and the fleet agent's apply (both through
// one gate, the agent's with the desired state's authority) and a hot reloader (past the gate),
// each offering its share of versions 2..40 in a shuffled order. Every switch the module makes
// is watched: the labels only ever grow, and the highest one serves at the end.
TEST_F(CompareAndApply, APushAFleetApplyAndAHotReloaderNeverGoBack) {
  constexpr std::uint64_t last = 40;
  auto sink = std::make_shared<cubridge::hot_module_sink>();
  sink->add(*hot_);
  cubridge::update_gate_options options;
  options.keys.add(keys_.public_key);
  options.persist_state = false;
  const auto gate = cubridge::update_gate::create(sink, options);
  gate->start();

  const cubridge::testing::temp_dir dir;
  const auto watched = dir.path / "watched";
  std::filesystem::create_directories(watched);
  std::atomic<int> reloads_done{0};
  cubridge::hot_reloader::options reload;
  reload.debounce = std::chrono::milliseconds(20);
  reload.on_promoted = [&](const auto&, std::uint64_t) { ++reloads_done; };
  reload.on_refused = [&](const auto&, std::exception_ptr) { ++reloads_done; };
  cubridge::hot_reloader reloader(*hot_, watched, reload);

  std::vector<std::uint64_t> pushed, applied, reloaded;
  for (std::uint64_t v = 2; v <= last; ++v)
    (v % 3 == 0 ? pushed : v % 3 == 1 ? applied : reloaded).push_back(v);
  std::mt19937 shuffle{20261206};
  for (auto* list : {&pushed, &applied, &reloaded})
    std::shuffle(list->begin(), list->end(), shuffle);

  std::atomic<bool> done{false};
  std::vector<std::pair<std::uint64_t, std::uint64_t>> switches;  // (chain id, label)
  std::thread watcher([&] {
    std::uint64_t seen = 0;
    while (!done.load()) {
      const auto serving = hot_->versions().serving;
      if (serving.id != seen) switches.emplace_back(seen = serving.id, serving.origin.label);
    }
  });
  std::thread push([&] {
    for (const auto v : pushed) (void)gate->push(signed_bundle(v), "versions");
  });
  std::thread fleet([&] {
    for (const auto v : applied) {
      const cubridge::push_authority authority{v, false, "a desired state"};
      (void)gate->push(signed_bundle(v), "versions", &authority);
    }
  });
  for (const auto v : reloaded) {
    const auto name = "versions.v" + std::to_string(v) + ".cubin";
    const auto bytes = hot_image(v % 2 ? "v1" : "v2");
    std::ofstream(dir.path / name, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
    std::filesystem::rename(dir.path / name, watched / name);  // whole, never half-written
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  push.join();
  fleet.join();
  ASSERT_TRUE(cubridge::testing::eventually(
      [&] { return reloads_done.load() == static_cast<int>(reloaded.size()); },
      std::chrono::seconds(60)))
      << reloads_done.load() << " of " << reloaded.size() << " files handled";
  done = true;
  watcher.join();

  ASSERT_FALSE(switches.empty());
  for (std::size_t i = 1; i < switches.size(); ++i)
    EXPECT_GT(switches[i].second, switches[i - 1].second)
        << "version " << switches[i].second << " (chain id " << switches[i].first
        << ") served after version " << switches[i - 1].second;
  EXPECT_EQ(hot_->versions().serving.origin.label, last);
  EXPECT_EQ(gate->serving("versions"), last);
  EXPECT_EQ(hot_->stats().rollbacks, 0u);
}

}  // namespace
