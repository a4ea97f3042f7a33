// event / event_ref: record, wait, time; one handle for both APIs.
#include <cubridge/core/context.hpp>
#include <cubridge/core/copy.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/error.hpp>
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
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using cubridge::testing::as_address;
using cubridge::testing::cu;
using cubridge::testing::make_context;
using cubridge::testing::raw_current;

using cubridge::event;
using cubridge::event_ref;
using cubridge::stream;

// Moves, release and the moved-from state: test_owning_handles.cpp, for every owning type.
static_assert(std::is_convertible_v<const event&, event_ref>);
static_assert(!std::is_constructible_v<event_ref, std::nullptr_t>);

/// A context with the test kernels loaded.
struct gpu {
  cubridge::context ctx = make_context();
  cubridge::module module = cubridge::module::load_file(ctx, cubridge::testing::test_cubin_path());
  cubridge::kernel fill = module.get_kernel("fill_u32");

  /// Enqueues fill_u32(out, value, n) on `s`; the caller has `ctx` current.
  void fill_on(const stream& s, cubridge::device_span<unsigned> out, unsigned value) const {
    const auto blocks = static_cast<unsigned>((out.size() + 255) / 256);
    fill.launch(cubridge::launch_config{.grid = {blocks}, .block = {256}, .stream = s}, out, value,
                std::size_t{out.size()});
  }
};

TEST(Event, CreatedInAContext) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  auto e = event::create(ctx);
  EXPECT_NE(e.get(), nullptr);
  EXPECT_EQ(e.runtime_handle(), e.get());
  EXPECT_EQ(raw_current(), nullptr) << "create must leave the context stack alone";
  EXPECT_TRUE(e.ready()) << "an event never recorded counts as complete";
}

TEST(Event, RecordSynchronizeReady) {
  CUBRIDGE_REQUIRE_GPU();
  gpu g;
  auto s = stream::create(g.ctx);
  auto e = event::create(g.ctx);
  constexpr std::size_t n = 1 << 22;
  auto buffer = cubridge::driver_buffer<unsigned>::allocate(g.ctx, n);
  std::mt19937 gen(401);
  const auto value = static_cast<unsigned>(gen() | 1u);
  cubridge::scoped_current guard(g.ctx);
  g.fill_on(s, buffer, value);
  e.record(s);
  e.synchronize();
  EXPECT_TRUE(e.ready());
  std::vector<unsigned> output(n, 0);
  CUBRIDGE_ASSERT_CU(
      cu().cuMemcpy(as_address(output.data()), buffer.address(), buffer.size_bytes()));
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(output[i], value) << "at " << i;
}

TEST(Event, UsableAsACudaEvent) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  auto s = stream::create(ctx);
  auto e = event::create(ctx);
  cubridge::scoped_current guard(ctx);
  ASSERT_EQ(cudaEventRecord(e.runtime_handle(), s.runtime_handle()), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(e.runtime_handle()), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(e.runtime_handle()), cudaSuccess);
  EXPECT_TRUE(e.ready());
  // And the other way: a cubridge record seen by the runtime.
  e.record(s);
  ASSERT_EQ(cudaStreamWaitEvent(s.runtime_handle(), e.runtime_handle(), 0), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s.runtime_handle()), cudaSuccess);
}

TEST(Event, TimingEventsMeasureAKernel) {
  CUBRIDGE_REQUIRE_GPU();
  gpu g;
  auto s = stream::create(g.ctx);
  auto start = event::create(g.ctx, CU_EVENT_DEFAULT);
  auto stop = event::create(g.ctx, CU_EVENT_DEFAULT);
  constexpr std::size_t n = 1 << 24;
  auto buffer = cubridge::driver_buffer<unsigned>::allocate(g.ctx, n);
  cubridge::scoped_current guard(g.ctx);
  start.record(s);
  for (int i = 0; i < 4; ++i) g.fill_on(s, buffer, static_cast<unsigned>(i + 1));
  stop.record(s);
  stop.synchronize();
  EXPECT_TRUE(start.ready());
  EXPECT_TRUE(stop.ready());
  const float ms = stop.elapsed_ms_since(start);
  EXPECT_GE(ms, 0.0f);
  EXPECT_LT(ms, 60'000.0f) << "four fills of 64 MiB take far less than a minute";
  std::vector<unsigned> output(n, 0);
  CUBRIDGE_ASSERT_CU(
      cu().cuMemcpy(as_address(output.data()), buffer.address(), buffer.size_bytes()));
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(output[i], 4u) << "at " << i;
}

TEST(Event, ElapsedTimeOfNonTimingEventsThrows) {
  CUBRIDGE_REQUIRE_GPU();
  auto ctx = make_context();
  auto s = stream::create(ctx);
  auto start = event::create(ctx);  // CU_EVENT_DISABLE_TIMING by default
  auto stop = event::create(ctx);
  start.record(s);
  stop.record(s);
  stop.synchronize();
  try {
    const float ms = stop.elapsed_ms_since(start);
    ADD_FAILURE() << "elapsed time of non-timing events gave " << ms;
  } catch (const cubridge::error& e) {
    EXPECT_EQ(e.source(), cubridge::error_source::driver);
    EXPECT_EQ(e.code(), CUDA_ERROR_INVALID_HANDLE) << e.what();
  }
}

TEST(Event, StreamWaitOrdersWorkAcrossStreams) {
  CUBRIDGE_REQUIRE_GPU();
  gpu g;
  auto producer = stream::create(g.ctx);
  auto consumer = stream::create(g.ctx);
  auto done = event::create(g.ctx);
  constexpr std::size_t n = 1 << 24;  // big enough that the copy would overtake an unordered fill
  auto source = cubridge::driver_buffer<unsigned>::allocate(g.ctx, n);
  auto destination = cubridge::driver_buffer<unsigned>::allocate(g.ctx, n);
  std::mt19937 gen(402);
  const auto old_value = static_cast<unsigned>(gen() | 1u);
  const auto new_value = old_value ^ 0xffff0000u;
  cubridge::scoped_current guard(g.ctx);
  // Both buffers start as old_value, visible to every stream.
  g.fill_on(producer, source, old_value);
  g.fill_on(producer, destination, old_value);
  producer.synchronize();

  for (int round = 0; round < 3; ++round) {
    const unsigned value = round % 2 == 0 ? new_value : old_value;
    for (int i = 0; i < 4; ++i) g.fill_on(producer, source, value);
    done.record(producer);
    consumer.wait(done);
    cubridge::copy_async<unsigned>(destination, source, consumer);
    consumer.synchronize();
    std::vector<unsigned> output(n, 0);
    CUBRIDGE_ASSERT_CU(
        cu().cuMemcpy(as_address(output.data()), destination.address(), destination.size_bytes()));
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(output[i], value) << "round " << round << ", element " << i
                                  << ": the copy did not wait for the fill";
  }
}

TEST(Event, WaitAcrossContextsOfOneDevice) {
  CUBRIDGE_REQUIRE_GPU();
  gpu a;
  auto b = make_context();
  auto in_a = stream::create(a.ctx);
  auto in_b = stream::create(b);
  auto done = event::create(a.ctx);
  constexpr std::size_t n = 1 << 22;
  auto source = cubridge::driver_buffer<unsigned>::allocate(a.ctx, n);
  auto destination = cubridge::driver_buffer<unsigned>::allocate(b, n);
  const unsigned value = 0x600dcafeu;
  {
    cubridge::scoped_current guard(a.ctx);
    a.fill_on(in_a, source, value);
    done.record(in_a);
  }
  {
    cubridge::scoped_current guard(b);
    in_b.wait(done);
    cubridge::copy_async<unsigned>(destination, source, in_b);
    in_b.synchronize();
    std::vector<unsigned> output(n, 0);
    CUBRIDGE_ASSERT_CU(
        cu().cuMemcpy(as_address(output.data()), destination.address(), destination.size_bytes()));
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(output[i], value) << "at " << i;
  }
}

}  // namespace
