// stream / stream_ref: one handle for both APIs, created in (and keeping alive) a context.
#include <cubridge/core/context.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/event.hpp>
#include <cubridge/core/module.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/core/stream.hpp>

#include "driver_helpers.hpp"
#include "gpu_test.hpp"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using cubridge::testing::as_address;
using cubridge::testing::cu;
using cubridge::testing::make_context;
using cubridge::testing::raw_current;

using cubridge::stream;
using cubridge::stream_ref;

// Moves, release and the moved-from state: test_owning_handles.cpp, for every owning type.
static_assert(std::is_convertible_v<const stream&, stream_ref>);
static_assert(!std::is_constructible_v<stream_ref, std::nullptr_t>);
static_assert(!std::is_constructible_v<stream_ref, int>);
static_assert(stream_ref::from_native(nullptr) == stream_ref::legacy_default());

std::vector<unsigned char> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<unsigned char> v(n);
  for (auto& x : v) x = static_cast<unsigned char>(gen());
  return v;
}

// Without a GPU: the handles stream_ref tells apart, and the moved-from sentinel it refuses.
TEST(StreamRef, TellsTheDefaultStreamsApart) {
  EXPECT_EQ(stream_ref::legacy_default().get(), nullptr);
  EXPECT_TRUE(stream_ref::legacy_default().is_legacy());
  EXPECT_TRUE(stream_ref::from_native(CU_STREAM_LEGACY).is_legacy());
  EXPECT_FALSE(stream_ref::from_native(CU_STREAM_LEGACY).is_per_thread());
  EXPECT_TRUE(stream_ref::from_native(CU_STREAM_PER_THREAD).is_per_thread());
  EXPECT_TRUE(stream_ref::from_native(cudaStreamPerThread).is_per_thread());
  EXPECT_FALSE(stream_ref::from_native(CU_STREAM_PER_THREAD).is_legacy());
  // Any other handle is a stream of its own (this one is never used).
  const auto other = stream_ref::from_native(reinterpret_cast<CUstream>(std::uintptr_t{0x1000}));
  EXPECT_FALSE(other.is_legacy());
  EXPECT_FALSE(other.is_per_thread());
  EXPECT_FALSE(other.is_moved_from());
  EXPECT_EQ(other.get(), reinterpret_cast<CUstream>(std::uintptr_t{0x1000}));
}

TEST(StreamRef, TheMovedFromSentinelIsRefusedNotTakenForTheLegacyStream) {
  const auto gone = stream_ref::from_native(cubridge::detail::moved_from_stream());
  EXPECT_TRUE(gone.is_moved_from());
  EXPECT_FALSE(gone.is_legacy());
  EXPECT_FALSE(gone.is_per_thread());
  EXPECT_NE(gone, stream_ref::legacy_default());
  for (const auto& use :
       {+[](stream_ref s) { (void)s.get(); }, +[](stream_ref s) { (void)s.runtime_handle(); },
        +[](stream_ref s) { s.synchronize(); }, +[](stream_ref s) { (void)s.ready(); }}) {
    try {
      use(gone);
      ADD_FAILURE() << "a moved-from stream was used";
    } catch (const cubridge::error& e) {
      EXPECT_TRUE(e.is(cubridge::errc::precondition)) << e.what();
      EXPECT_NE(std::string(e.what()).find("moved from"), std::string::npos) << e.what();
    }
  }
}

TEST(Stream, CreatedInItsContext) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  auto s = stream::create(ctx);
  EXPECT_NE(s.get(), nullptr);
  EXPECT_EQ(s.runtime_handle(), s.get());
  EXPECT_EQ(s.context(), ctx.ref());
  EXPECT_EQ(raw_current(), nullptr) << "create must leave the context stack alone";
}

TEST(Stream, StreamsOfTwoContextsKnowTheirOwn) {
  CUBRIDGE_REQUIRE_GPU();
  auto a = make_context();
  auto b = make_context();
  auto in_a = stream::create(a);
  auto in_b = stream::create(b, CU_STREAM_DEFAULT);
  EXPECT_NE(in_a.get(), in_b.get());
  EXPECT_EQ(in_a.context(), a.ref());
  EXPECT_EQ(in_b.context(), b.ref());
  // context() answers with another context current.
  cubridge::scoped_current guard(b);
  EXPECT_EQ(in_a.context(), a.ref());
  EXPECT_EQ(raw_current(), b.get());
}

TEST(Stream, CreateLeavesAnotherCurrentContextCurrent) {
  CUBRIDGE_REQUIRE_GPU();
  auto a = make_context();
  auto b = make_context();
  cubridge::scoped_current guard(b);
  auto s = stream::create(a);
  EXPECT_EQ(raw_current(), b.get());
  EXPECT_EQ(s.context(), a.ref());
}

TEST(Stream, UsableAsACudaStream) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  auto s = stream::create(ctx);
  constexpr std::size_t n = 1 << 20;
  const auto background = random_bytes(n, 301);
  auto buffer = cubridge::driver_buffer<unsigned char>::allocate(ctx, n);
  std::vector<unsigned char> output(n, 0);
  cubridge::scoped_current guard(ctx);
  CUBRIDGE_ASSERT_CU(cu().cuMemcpy(buffer.address(), as_address(background.data()), n));
  // Runtime work on the cubridge stream: a memset of the middle, then a runtime copy back.
  ASSERT_EQ(cudaMemsetAsync(buffer.data() + 1000, 0xAB, n - 2000, s.runtime_handle()), cudaSuccess);
  ASSERT_EQ(
      cudaMemcpyAsync(output.data(), buffer.data(), n, cudaMemcpyDeviceToHost, s.runtime_handle()),
      cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s.runtime_handle()), cudaSuccess);
  EXPECT_TRUE(s.ready());
  for (std::size_t i = 0; i < n; ++i) {
    const bool in_middle = i >= 1000 && i < n - 1000;
    ASSERT_EQ(output[i], in_middle ? 0xAB : background[i]) << "at " << i;
  }
  EXPECT_EQ(cudaStreamQuery(s.runtime_handle()), cudaSuccess);
}

TEST(Stream, SynchronizeWaitsForDriverWork) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  auto s = stream::create(ctx);
  auto module = cubridge::module::load_file(ctx, cubridge::testing::test_cubin_path());
  const auto fill = module.get_kernel("fill_u32");
  constexpr std::size_t n = 1 << 24;
  auto buffer = cubridge::driver_buffer<unsigned>::allocate(ctx, n);
  std::mt19937 gen(302);
  const auto value = static_cast<unsigned>(gen() | 1u);
  std::vector<unsigned> output(n, 0);
  cubridge::scoped_current guard(ctx);
  EXPECT_TRUE(s.ready()) << "a new stream has no work";
  fill.launch(
      cubridge::launch_config{
          .grid = {static_cast<unsigned>(n / 256)}, .block = {256}, .stream = s},
      buffer.span(), value, std::size_t{n});
  ASSERT_EQ(
      cu().cuMemcpyAsync(as_address(output.data()), buffer.address(), buffer.size_bytes(), s.get()),
      CUDA_SUCCESS);
  s.synchronize();
  EXPECT_TRUE(s.ready());
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(output[i], value) << "at " << i;
}

TEST(Stream, FromNativeAdoptsARuntimeStream) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  cubridge::scoped_current guard(ctx);
  cudaStream_t raw = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking), cudaSuccess);
  const auto adopted = stream_ref::from_native(raw);
  EXPECT_EQ(adopted.get(), raw);
  EXPECT_EQ(adopted.context(), ctx.ref()) << "a runtime stream made in a driver context is in it";
  adopted.synchronize();
  EXPECT_TRUE(adopted.ready());
  EXPECT_EQ(cudaStreamDestroy(raw), cudaSuccess);
}

// A moved-from stream used to hold 0, which every API takes for the legacy default stream: a
// launch on it ran there without a word (issue 11, item 15). Now every use is refused.
TEST(Stream, AMovedFromStreamRefusesEveryUse) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  cubridge::scoped_current guard(ctx);
  auto module = cubridge::module::load_file(ctx, cubridge::testing::test_cubin_path());
  const auto fill = module.get_kernel("fill_u32");
  auto buffer = cubridge::driver_buffer<unsigned>::allocate(ctx, 256);
  CUBRIDGE_ASSERT_CU(cu().cuMemsetD32(buffer.address(), 0, 256));
  auto s = stream::create(ctx);
  auto kept = std::move(s);
  auto expect_refused = [](auto&& use, const char* what) {
    try {
      use();
      ADD_FAILURE() << what << ": no throw";
    } catch (const cubridge::error& e) {
      EXPECT_TRUE(e.is(cubridge::errc::precondition)) << what << ": " << e.what();
    }
  };
  // NOLINTBEGIN(bugprone-use-after-move): the point of the test
  expect_refused([&] { (void)s.get(); }, "get");
  expect_refused([&] { (void)s.runtime_handle(); }, "runtime_handle");
  expect_refused([&] { s.synchronize(); }, "synchronize");
  expect_refused([&] { (void)s.ready(); }, "ready");
  expect_refused([&] { (void)s.context(); }, "context");
  expect_refused([&] { (void)s.release(); }, "release");
  expect_refused(
      [&] { fill.launch({.block = {256}, .stream = s}, buffer.span(), 7u, std::size_t{256}); },
      "a launch");
  expect_refused([&] { cubridge::event::create(ctx).record(s); }, "an event record");
  CUBRIDGE_ASSERT_CU(cu().cuCtxSynchronize());
  std::vector<unsigned> host(256, 1);
  CUBRIDGE_ASSERT_CU(
      cu().cuMemcpy(as_address(host.data()), buffer.address(), 256 * sizeof(unsigned)));
  for (const auto v : host) ASSERT_EQ(v, 0u) << "nothing ran, on the legacy stream or elsewhere";
  // A new stream assigned to it is usable again; the one it was moved to still is.
  s = stream::create(ctx);
  fill.launch({.block = {256}, .stream = s}, buffer.span(), 7u, std::size_t{256});
  s.synchronize();
  kept.synchronize();
  CUBRIDGE_ASSERT_CU(
      cu().cuMemcpy(as_address(host.data()), buffer.address(), 256 * sizeof(unsigned)));
  for (const auto v : host) ASSERT_EQ(v, 7u);
  // NOLINTEND(bugprone-use-after-move)
}

}  // namespace
