// Probation on mirrored live launches (swap/probation.hpp): a serving loop launches the serving
// version on real data on its own thread while a candidate is staged with a probation; a
// correct candidate passes, a faulting one is refused with this process untouched, a wrong one
// is refused naming the buffer and the first differing offset, and a launch over the byte budget
// is said to be not mirrorable. Each test runs in its own process (ctest), and no fault ever
// happens in this one: that is what is tested.
#include <cubridge/compile/compile.hpp>
#include <cubridge/core/context.hpp>
#include <cubridge/core/copy.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/process_health.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/core/stream.hpp>
#include <cubridge/swap/hot_module.hpp>
#include <cubridge/swap/probation.hpp>

#include "gpu_test.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;

// BAD 0: correct. 1: an illegal address on every launch. 2: element 37 wrong.
std::vector<std::byte> scale_image(int bad) {
  const std::string text = R"(
extern "C" __global__ void scale(float* out, const float* in, float factor, unsigned n) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
#if BAD == 1
  if (i == 0) *(volatile float*)(0x10) = 1.0f;
#endif
  float v = in[i] * factor;
#if BAD == 2
  if (i == 37) v += 1.0f;
#endif
  out[i] = v;
})";
  cubridge::compile_options o;
  o.architecture = "sm_" + std::to_string(cubridge::device::get(0).capability().major) +
                   std::to_string(cubridge::device::get(0).capability().minor);
  o.defines["BAD"] = std::to_string(bad);
  return cubridge::nvrtc_compile({.name = "scale.cu", .text = text}, o).cubin;
}

class Probation : public ::testing::Test {
 protected:
  static constexpr unsigned n = 1u << 20;  // 4 MiB a buffer: over a 2 MiB budget

  void SetUp() override {
    CUBRIDGE_REQUIRE_GPU();
    ctx_.emplace(cubridge::context::create(cubridge::device::get(0)));
    current_.emplace(*ctx_);
    hot_.emplace(cubridge::hot_module::load(*ctx_, "scaler", scale_image(0)));
    stream_.emplace(cubridge::stream::create(*ctx_));
    in_.emplace(cubridge::driver_buffer<float>::allocate(*ctx_, n));
    out_.emplace(cubridge::driver_buffer<float>::allocate(*ctx_, n));
    std::vector<float> host(n);
    for (unsigned i = 0; i < n; ++i) host[i] = static_cast<float>(i) * 0.5f;
    cubridge::copy(in_->span(), std::span<const float>(host));
  }

  void TearDown() override {
    stop_serving();
    if (ctx_) {
      EXPECT_FALSE(cubridge::process_poisoned()) << "the serving process was poisoned";
    }
  }

  // The serving loop: launches the serving version and checks what it wrote, until stopped.
  void start_serving() {
    serving_ = std::thread([this] {
      cubridge::scoped_current c(*ctx_);
      auto k = hot_->get_kernel("scale");
      std::vector<float> back(64);
      while (!stop_.load()) {
        (void)k.launch({.grid = {n / 256}, .block = {256}, .stream = *stream_}, out_->span(),
                       cubridge::device_span<const float>(in_->span()), 2.0f, n);
        stream_->synchronize();
        cubridge::copy(std::span<float>(back),
                       cubridge::device_span<const float>(out_->span()).subspan(0, back.size()));
        if (back[37] != 37 * 0.5f * 2.0f) wrong_.fetch_add(1);
        served_.fetch_add(1);
      }
    });
  }
  void stop_serving() {
    stop_.store(true);
    if (serving_.joinable()) serving_.join();
  }

  cubridge::stage_options on_probation(std::uint32_t required = 4) const {
    cubridge::stage_options o;
    o.source_name = "candidate";
    o.probation = cubridge::probation_policy{};
    o.probation->required_launches = required;
    o.probation->sample_every = 3;
    o.probation->deadline = 60s;
    return o;
  }

  std::optional<cubridge::context> ctx_;
  std::optional<cubridge::scoped_current> current_;
  std::optional<cubridge::hot_module> hot_;
  std::optional<cubridge::stream> stream_;
  std::optional<cubridge::driver_buffer<float>> in_;
  std::optional<cubridge::driver_buffer<float>> out_;
  std::thread serving_;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> served_{0};
  std::atomic<std::uint64_t> wrong_{0};
};

TEST_F(Probation, ACorrectCandidatePassesOnMirroredLaunchesAndIsPromoted) {
  start_serving();
  auto staged = hot_->stage(scale_image(0), on_probation());
  (void)hot_->promote(std::move(staged));
  stop_serving();
  EXPECT_GT(served_.load(), 0u);
  EXPECT_EQ(wrong_.load(), 0u);
  EXPECT_EQ(hot_->versions().serving.origin.source, "candidate");
}

TEST_F(Probation, AFaultingCandidateIsRefusedAndTheServingProcessNeverNotices) {
  start_serving();
  try {
    (void)hot_->stage(scale_image(1), on_probation());
    ADD_FAILURE() << "a faulting candidate passed its probation";
  } catch (const cubridge::probation_error& e) {
    EXPECT_EQ(e.result().verdict, cubridge::probation_verdict::faulted) << e.what();
    EXPECT_EQ(e.result().kernel, "scale");
    EXPECT_EQ(e.result().launch, 1u);
    EXPECT_NE(std::string(e.what()).find("faulted_in_probation"), std::string::npos) << e.what();
  }
  const auto before = served_.load();
  std::this_thread::sleep_for(100ms);
  stop_serving();
  EXPECT_GT(served_.load(), before) << "the serving loop stopped";
  EXPECT_EQ(wrong_.load(), 0u);
  EXPECT_FALSE(cubridge::process_poisoned());
  EXPECT_EQ(hot_->versions().serving.id, 1u);
}

TEST_F(Probation, AWrongCandidateIsRefusedNamingTheBufferAndTheOffset) {
  start_serving();
  try {
    (void)hot_->stage(scale_image(2), on_probation());
    ADD_FAILURE() << "a wrong candidate passed its probation";
  } catch (const cubridge::probation_error& e) {
    EXPECT_EQ(e.result().verdict, cubridge::probation_verdict::mismatch) << e.what();
    EXPECT_EQ(e.result().parameter, 0u);  // out
    // The first differing byte lies in element 37 (which byte depends on the float's bits).
    EXPECT_EQ(e.result().offset / sizeof(float), 37u) << e.result().offset;
  }
  stop_serving();
  EXPECT_EQ(hot_->versions().serving.id, 1u);
}

TEST_F(Probation, ALaunchOverTheByteBudgetIsNotMirrorableAndTheProbationIsIncomplete) {
  start_serving();
  auto o = on_probation();
  // Rounded up to the allocation granularity (2 MiB here), still below one 4 MiB buffer.
  o.probation->max_snapshot_bytes = 1024;
  o.probation->deadline = 3s;
  try {
    (void)hot_->stage(scale_image(0), o);
    ADD_FAILURE() << "a probation whose launches were all over the budget passed";
  } catch (const cubridge::probation_error& e) {
    EXPECT_EQ(e.result().verdict, cubridge::probation_verdict::incomplete) << e.what();
    EXPECT_GT(e.result().not_mirrorable, 0u) << e.what();
    EXPECT_NE(e.result().detail.find("max_snapshot_bytes"), std::string::npos) << e.what();
  }
  stop_serving();
}

TEST_F(Probation, AKernelDeclaredNeverMirrorIsSaidSoAndNothingPasses) {
  start_serving();
  auto o = on_probation();
  o.probation->checks.push_back({.kernel = "scale", .check = cubridge::output_check::never_mirror});
  o.probation->deadline = 2s;
  try {
    (void)hot_->stage(scale_image(0), o);
    ADD_FAILURE() << "a probation with no mirrorable launch passed";
  } catch (const cubridge::probation_error& e) {
    EXPECT_EQ(e.result().verdict, cubridge::probation_verdict::incomplete) << e.what();
    EXPECT_NE(e.result().detail.find("never_mirror"), std::string::npos) << e.what();
  }
  stop_serving();
}

// The smoke test in the worker: replays built by the user, no serving traffic needed.
cubridge::probation_policy replays_only() {
  std::vector<float> in(1024);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i);
  const std::vector<float> out(1024, 0.0f);
  cubridge::replay_launch r;
  r.kernel = "scale";
  r.grid = {4};
  r.block = {256};
  r.arguments = {cubridge::replay_argument::buffer_of(std::span<const float>(out)),
                 cubridge::replay_argument::buffer_of(std::span<const float>(in)),
                 cubridge::replay_argument::scalar_of(3.0f),
                 cubridge::replay_argument::scalar_of(1024u)};
  cubridge::probation_policy p;
  p.replays = {r, r};
  p.required_launches = 0;
  return p;
}

TEST_F(Probation, AReplayedSmokeTestPassesACorrectCandidateWithoutTraffic) {
  cubridge::stage_options o;
  o.source_name = "candidate";
  o.probation = replays_only();
  auto staged = hot_->stage(scale_image(0), o);
  (void)hot_->promote(std::move(staged));
  EXPECT_EQ(hot_->versions().serving.origin.source, "candidate");
}

TEST_F(Probation, ACandidateThatFaultsInItsReplayedSmokeTestIsRefusedAndThisProcessServesOn) {
  cubridge::stage_options o;
  o.probation = replays_only();
  try {
    (void)hot_->stage(scale_image(1), o);
    ADD_FAILURE() << "a faulting candidate passed its smoke test";
  } catch (const cubridge::probation_error& e) {
    EXPECT_EQ(e.result().verdict, cubridge::probation_verdict::faulted) << e.what();
    EXPECT_EQ(e.result().replay, 1u);
    EXPECT_EQ(e.result().replays_passed, 0u);
  }
  start_serving();
  while (served_.load() < 3) std::this_thread::sleep_for(1ms);
  stop_serving();
  EXPECT_EQ(wrong_.load(), 0u);
}

TEST_F(Probation, AWrongCandidateFailsItsReplayNamingTheOffset) {
  cubridge::stage_options o;
  o.probation = replays_only();
  try {
    (void)hot_->stage(scale_image(2), o);
    ADD_FAILURE() << "a wrong candidate passed its smoke test";
  } catch (const cubridge::probation_error& e) {
    EXPECT_EQ(e.result().verdict, cubridge::probation_verdict::mismatch) << e.what();
    EXPECT_EQ(e.result().parameter, 0u);
    // The first differing byte lies in element 37 (which byte depends on the float's bits).
    EXPECT_EQ(e.result().offset / sizeof(float), 37u) << e.result().offset;
  }
}

TEST_F(Probation, AnIgnoredParameterIsCopiedButNotCompared) {
  start_serving();
  auto o = on_probation();
  o.probation->checks.push_back({.kernel = "scale", .ignored_parameters = {0}});
  // The wrong element is in `out` (parameter 0), which is not compared: the candidate passes.
  auto staged = hot_->stage(scale_image(2), o);
  stop_serving();
  EXPECT_EQ(staged.origin().source, "candidate");
}

// Without probation: a fault in the serving process poisons it (FACTS.md). The first cubridge
// call that sees the sticky error marks it, naming the module, its version and the kernel, and
// the exit policy ends it with code 75 for its supervisor to restart. In a child process.
TEST(ProcessHealthOnTheGpu, AFaultInTheServingProcessMarksItAndTheExitPolicyEndsIt) {
  CUBRIDGE_REQUIRE_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        auto ctx = cubridge::context::create(cubridge::device::get(0));
        cubridge::scoped_current current(ctx);
        auto hot =
            cubridge::hot_module::load(ctx, "scaler", scale_image(1), {.origin = {.label = 3}});
        auto out = cubridge::driver_buffer<float>::allocate(ctx, 256);
        auto in = cubridge::driver_buffer<float>::allocate(ctx, 256);
        auto s = cubridge::stream::create(ctx);
        (void)cubridge::exit_when_poisoned({.grace = std::chrono::milliseconds(200)});
        (void)hot.get_kernel("scale").launch({.block = {256}, .stream = s}, out.span(),
                                             cubridge::device_span<const float>(in.span()), 2.0f,
                                             256u);
        try {
          s.synchronize();
        } catch (const cubridge::error&) {
        }
        const auto record = cubridge::process_health();
        if (!record || record->running.empty() || record->running[0].module != "scaler" ||
            record->running[0].label != 3 || record->running[0].kernel != "scale")
          std::_Exit(1);
        std::fprintf(stderr, "%s\n", cubridge::describe(*record).c_str());
        std::this_thread::sleep_for(10s);  // the exit policy ends the process first
        std::_Exit(2);
      },
      ::testing::ExitedWithCode(cubridge::poisoned_exit_code),
      "poisoned by CUDA_ERROR_ILLEGAL_ADDRESS.*scaler v3.*kernel 'scale'");
}

}  // namespace
