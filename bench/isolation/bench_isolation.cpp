// What isolation costs (issue 5): a guest call (enter + leave, with and without the sticky-error
// synchronize) against a plain call; a sandbox round trip for a small request; a worker restart;
// and a kernel in the sandbox worker on a shared 1 GiB buffer in place against the same work with
// the buffer copied through (pinned, shared) host memory to the worker and back. Ratios: side by
// side in one run.
//   bench_isolation [benchmark flags]   (77 without a GPU)
#include <cubridge/core/driver.hpp>
#include <cubridge/core/primary_context.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/core/shared_device_memory.hpp>
#include <cubridge/isolation/guest_context.hpp>
#include <cubridge/isolation/sandbox.hpp>

#include <benchmark/benchmark.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

namespace {

constexpr std::size_t GiB = std::size_t{1} << 30;

struct fixture {
  cubridge::device dev = cubridge::device::get(0);
  cubridge::primary_context primary = cubridge::primary_context::retain(dev);
};

fixture& get() {
  static fixture f;
  return f;
}

cubridge::sandbox start_sandbox() {
  return cubridge::sandbox::start({.library = CUBRIDGE_BENCH_ISOLATION_LIBRARY,
                                   .worker = CUBRIDGE_BENCH_SANDBOX_WORKER,
                                   .call_timeout = std::chrono::minutes(2)});
}

// A call the compiler cannot see through.
int (*volatile library_call)() = [] { return 0; };

void BM_plain_call(benchmark::State& state) {
  cubridge::scoped_current current(get().primary);
  for (auto _ : state) benchmark::DoNotOptimize(library_call());
}

// range(0): 1 = synchronize the guest context after the call (the default), 0 = not.
void BM_guest_call(benchmark::State& state) {
  auto& f = get();
  cubridge::scoped_current current(f.primary);
  auto guest = cubridge::guest_context::create(
      f.dev, {.name = "bench", .synchronize_after_call = state.range(0) != 0});
  for (auto _ : state) benchmark::DoNotOptimize(guest.call([] { return library_call(); }));
}

void BM_sandbox_round_trip(benchmark::State& state) {
  auto box = start_sandbox();
  const std::string request(64, 'r');
  const auto bytes = std::as_bytes(std::span(request));
  for (auto _ : state) benchmark::DoNotOptimize(box.call("bench_noop", {.bytes = bytes}).status);
}

// What a fault costs the caller after detection: a fresh worker, CUDA initialised in it, ready to
// take calls (the same restart the sandbox makes after a crash, abort, hang or CUDA fault).
void BM_sandbox_restart(benchmark::State& state) {
  auto box = start_sandbox();
  for (auto _ : state) {
    box.restart();
    if (box.call("bench_noop", {}).status != 0) state.SkipWithError("bench_noop failed");
  }
  state.counters["worker_start_ms"] =
      std::chrono::duration<double, std::milli>(box.last_start_duration()).count();
}

void BM_sandbox_kernel_shared_1GiB(benchmark::State& state) {
  auto& f = get();
  cubridge::scoped_current current(f.primary);
  auto memory =
      cubridge::shared_device_memory::allocate(f.dev, GiB, cubridge::memory_export::posix_fd);
  cubridge::driver::api().cuMemsetD32(memory.address(), 0, memory.size_bytes() / 4);
  auto box = start_sandbox();
  auto share = box.share(memory);
  if (box.call("bench_add_one", {.buffers = {share}}).status != 0)
    state.SkipWithError("bench_add_one failed");
  for (auto _ : state)
    if (box.call("bench_add_one", {.buffers = {share}}).status != 0)
      state.SkipWithError("bench_add_one failed");
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * memory.size_bytes()));
}

void BM_sandbox_kernel_copied_through_host_1GiB(benchmark::State& state) {
  auto& f = get();
  cubridge::scoped_current current(f.primary);
  const auto& cu = cubridge::driver::api();
  auto memory = cubridge::shared_device_memory::allocate(f.dev, GiB);
  cu.cuMemsetD32(memory.address(), 0, memory.size_bytes() / 4);
  // The staging area both processes see: POSIX shared memory, pinned on each side.
  const std::string name = "/cubridge-bench-" + std::to_string(::getpid());
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_RDWR | O_EXCL, 0600);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(memory.size_bytes())) != 0) {
    state.SkipWithError("shm_open failed");
    return;
  }
  void* host = ::mmap(nullptr, memory.size_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  cu.cuMemHostRegister(host, memory.size_bytes(), 0);
  auto box = start_sandbox();
  const std::string request = name + ":" + std::to_string(memory.size_bytes());
  const auto bytes = std::as_bytes(std::span(request));
  const auto staging = reinterpret_cast<CUdeviceptr>(host);
  auto round = [&] {
    cu.cuMemcpy(staging, memory.address(), memory.size_bytes());  // out to host memory
    const int status = box.call("bench_add_one_staged", {.bytes = bytes}).status;
    cu.cuMemcpy(memory.address(), staging, memory.size_bytes());  // and back
    return status;
  };
  if (round() != 0) state.SkipWithError("bench_add_one_staged failed");
  for (auto _ : state)
    if (round() != 0) state.SkipWithError("bench_add_one_staged failed");
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * memory.size_bytes()));
  cu.cuMemHostUnregister(host);
  ::munmap(host, memory.size_bytes());
  ::shm_unlink(name.c_str());
}

BENCHMARK(BM_plain_call)->Unit(benchmark::kNanosecond);
BENCHMARK(BM_guest_call)->Arg(0)->Arg(1)->Unit(benchmark::kNanosecond);
BENCHMARK(BM_sandbox_round_trip)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_sandbox_restart)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(5);
BENCHMARK(BM_sandbox_kernel_shared_1GiB)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_sandbox_kernel_copied_through_host_1GiB)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  if (!cubridge::driver::available()) {
    std::printf("bench_isolation: no GPU: %s\n", cubridge::driver::unavailable_reason().c_str());
    return 77;
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
