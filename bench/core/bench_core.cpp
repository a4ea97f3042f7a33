// Core overheads against the raw driver, measured side by side in one run:
//   BM_launch_raw vs BM_launch_checked / BM_launch_typed (same empty kernel, same stream);
//   BM_push_pop_raw vs BM_scoped_current;
//   BM_share_view vs BM_copy_through_host (a runtime buffer handed to driver code).
// bench/report.py turns the JSON output into the ratios the issue asks for.
#include <cubridge/core/context.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/event.hpp>
#include <cubridge/core/module.hpp>
#include <cubridge/core/pinned_buffer.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/core/stream.hpp>

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <optional>

namespace {

struct fixture {
  cubridge::context ctx = cubridge::context::create(cubridge::device::get(0));
  cubridge::module module = cubridge::module::load_file(ctx, CUBRIDGE_BENCH_CUBIN);
  cubridge::kernel empty = module.get_kernel("empty_kernel");
  cubridge::kernel add = module.get_kernel("add_f32");
  cubridge::stream stream = cubridge::stream::create(ctx);
};

fixture& get() {
  static fixture f;
  return f;
}

// Launch queues fill up: drain every this many launches, the same way for every variant.
constexpr int drain_every = 512;

void BM_launch_raw(benchmark::State& state) {
  auto& f = get();
  cubridge::scoped_current current(f.ctx);
  const auto& cu = cubridge::driver::api();
  CUfunction fn = f.empty.launch_handle();
  int i = 0;
  for (auto _ : state) {
    if (cu.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, f.stream.get(), nullptr, nullptr) !=
        CUDA_SUCCESS)
      state.SkipWithError("cuLaunchKernel failed");
    if (++i % drain_every == 0) cu.cuStreamSynchronize(f.stream.get());
  }
  cu.cuStreamSynchronize(f.stream.get());
}

void BM_launch_checked(benchmark::State& state) {
  auto& f = get();
  cubridge::scoped_current current(f.ctx);
  const cubridge::launch_config config{.grid = {1}, .block = {32}, .stream = f.stream};
  int i = 0;
  for (auto _ : state) {
    f.empty.launch(config);
    if (++i % drain_every == 0) f.stream.synchronize();
  }
  f.stream.synchronize();
}

void BM_launch_typed(benchmark::State& state) {
  auto& f = get();
  cubridge::scoped_current current(f.ctx);
  const auto k = f.empty.typed<>();
  const cubridge::launch_config config{.grid = {1}, .block = {32}, .stream = f.stream};
  int i = 0;
  for (auto _ : state) {
    k.launch(config);
    if (++i % drain_every == 0) f.stream.synchronize();
  }
  f.stream.synchronize();
}

// With arguments: the raw driver call and the typed launch both pass three parameters.
void BM_launch_raw_args(benchmark::State& state) {
  auto& f = get();
  cubridge::scoped_current current(f.ctx);
  auto buffer = cubridge::driver_buffer<float>::allocate(f.ctx, 32);
  const auto& cu = cubridge::driver::api();
  CUfunction fn = f.add.launch_handle();
  float* data = buffer.data();
  float addend = 1.0f;
  std::size_t n = 32;
  int i = 0;
  for (auto _ : state) {
    void* args[] = {&data, &addend, &n};
    if (cu.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, f.stream.get(), args, nullptr) != CUDA_SUCCESS)
      state.SkipWithError("cuLaunchKernel failed");
    if (++i % drain_every == 0) cu.cuStreamSynchronize(f.stream.get());
  }
  cu.cuStreamSynchronize(f.stream.get());
}

void BM_launch_typed_args(benchmark::State& state) {
  auto& f = get();
  cubridge::scoped_current current(f.ctx);
  auto buffer = cubridge::driver_buffer<float>::allocate(f.ctx, 32);
  const auto k = f.add.typed<float*, float, std::size_t>();
  const cubridge::launch_config config{.grid = {1}, .block = {32}, .stream = f.stream};
  int i = 0;
  for (auto _ : state) {
    k.launch(config, buffer.data(), 1.0f, std::size_t{32});
    if (++i % drain_every == 0) f.stream.synchronize();
  }
  f.stream.synchronize();
}

void BM_launch_checked_args(benchmark::State& state) {
  auto& f = get();
  cubridge::scoped_current current(f.ctx);
  auto buffer = cubridge::driver_buffer<float>::allocate(f.ctx, 32);
  const cubridge::launch_config config{.grid = {1}, .block = {32}, .stream = f.stream};
  int i = 0;
  for (auto _ : state) {
    f.add.launch(config, buffer.span(), 1.0f, std::size_t{32});
    if (++i % drain_every == 0) f.stream.synchronize();
  }
  f.stream.synchronize();
}

void BM_push_pop_raw(benchmark::State& state) {
  auto& f = get();
  const auto& cu = cubridge::driver::api();
  CUcontext popped = nullptr;
  for (auto _ : state) {
    cu.cuCtxPushCurrent(f.ctx.get());
    cu.cuCtxPopCurrent(&popped);
    benchmark::DoNotOptimize(popped);
  }
}

void BM_scoped_current(benchmark::State& state) {
  auto& f = get();
  for (auto _ : state) {
    cubridge::scoped_current guard(f.ctx);
    benchmark::ClobberMemory();
  }
}

// A buffer the runtime allocated, consumed by a driver-loaded kernel: through a zero-copy view
// (what cubridge does) or by copying it out through pinned host memory into a driver buffer and
// back (what code that cannot share a pointer across the APIs does).
void BM_share_view(benchmark::State& state) {
  auto& f = get();
  const std::size_t n = static_cast<std::size_t>(state.range(0)) / sizeof(float);
  cubridge::scoped_current current(f.ctx);
  auto runtime_memory = cubridge::runtime_buffer<float>::allocate(f.ctx, n);
  cubridge::event start = cubridge::event::create(f.ctx, CU_EVENT_DEFAULT);
  cubridge::event stop = cubridge::event::create(f.ctx, CU_EVENT_DEFAULT);
  for (auto _ : state) {
    start.record(f.stream);
    cubridge::device_span<float> view = runtime_memory;  // no copy: the same address
    f.add.launch(
        {.grid = {static_cast<unsigned>((n + 255) / 256)}, .block = {256}, .stream = f.stream},
        view, 1.0f, n);
    stop.record(f.stream);
    stop.synchronize();
    state.SetIterationTime(stop.elapsed_ms_since(start) / 1e3);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}

void BM_copy_through_host(benchmark::State& state) {
  auto& f = get();
  const std::size_t n = static_cast<std::size_t>(state.range(0)) / sizeof(float);
  cubridge::scoped_current current(f.ctx);
  auto runtime_memory = cubridge::runtime_buffer<float>::allocate(f.ctx, n);
  auto driver_memory = cubridge::driver_buffer<float>::allocate(f.ctx, n);
  auto staging = cubridge::pinned_buffer<float>::allocate(f.ctx, n);
  const auto& cu = cubridge::driver::api();
  cubridge::event start = cubridge::event::create(f.ctx, CU_EVENT_DEFAULT);
  cubridge::event stop = cubridge::event::create(f.ctx, CU_EVENT_DEFAULT);
  const std::size_t bytes = n * sizeof(float);
  for (auto _ : state) {
    start.record(f.stream);
    cu.cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(staging.data()), runtime_memory.address(), bytes,
                     f.stream.get());
    cu.cuMemcpyAsync(driver_memory.address(), reinterpret_cast<CUdeviceptr>(staging.data()), bytes,
                     f.stream.get());
    f.add.launch(
        {.grid = {static_cast<unsigned>((n + 255) / 256)}, .block = {256}, .stream = f.stream},
        driver_memory.span(), 1.0f, n);
    cu.cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(staging.data()), driver_memory.address(), bytes,
                     f.stream.get());
    cu.cuMemcpyAsync(runtime_memory.address(), reinterpret_cast<CUdeviceptr>(staging.data()), bytes,
                     f.stream.get());
    stop.record(f.stream);
    stop.synchronize();
    state.SetIterationTime(stop.elapsed_ms_since(start) / 1e3);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}

constexpr std::int64_t MiB = 1 << 20;

BENCHMARK(BM_launch_raw)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_launch_checked)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_launch_typed)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_launch_raw_args)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_launch_checked_args)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_launch_typed_args)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_push_pop_raw)->Unit(benchmark::kNanosecond);
BENCHMARK(BM_scoped_current)->Unit(benchmark::kNanosecond);
BENCHMARK(BM_share_view)->Arg(MiB)->Arg(1024 * MiB)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_copy_through_host)
    ->Arg(MiB)
    ->Arg(1024 * MiB)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  if (!cubridge::driver::available()) {
    std::printf("bench_core: no GPU: %s\n", cubridge::driver::unavailable_reason().c_str());
    return 77;
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
