// What isolation costs (issue 5): a guest call (enter + leave, with and without the sticky-error
// synchronize) against a plain call; a sandbox round trip for a small request; a worker restart;
// and a kernel in the sandbox worker on a shared 1 GiB buffer in place against the same work with
// the buffer copied through (pinned, shared) host memory to the worker and back. Ratios: side by
// side in one run.
// What a failure costs with and without a ready spare (issue 15), side by side: the failing
// call's exception after the failure was seen, the replacement, the next call
// (BM_sandbox_failure/standby/kind); and calls in parallel through 1, 2, 4, 8 workers, trivial
// and with a kernel (BM_sandbox_pool_*).
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

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

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

// Without spares unless asked: the figures of issue 5 were taken with one worker and no other.
cubridge::sandbox start_sandbox(std::size_t standby = 0, std::size_t workers = 1) {
  return cubridge::sandbox::start({.library = CUBRIDGE_BENCH_ISOLATION_LIBRARY,
                                   .worker = CUBRIDGE_BENCH_SANDBOX_WORKER,
                                   .call_timeout = std::chrono::minutes(2),
                                   .workers = workers,
                                   .standby = standby});
}

double ms(std::chrono::nanoseconds d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
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
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(memory.size_bytes()));
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
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(memory.size_bytes()));
  cu.cuMemHostUnregister(host);
  ::munmap(host, memory.size_bytes());
  ::shm_unlink(name.c_str());
}

// range(0): standby (0: the failed worker is replaced by a start before the call throws; 1: a
// ready spare takes over). range(1): what fails (failure_entries). Per failure, each counter a
// median over the iterations: seen_to_exception_ms (the failure seen by the host -> the failing
// call's exception caught; target with a spare: <= 5 ms), replacement_ms (seen -> a worker in
// place: the spare's promotion or the restart), next_call_ms (the call after, a no-op), and
// spare_promoted (the fraction of failures a spare took over). Time: the failing call, whole.
constexpr const char* failure_entries[] = {"bench_crash", "bench_fault", "bench_reset",
                                           "bench_hang"};

void BM_sandbox_failure(benchmark::State& state) {
  const auto standby = static_cast<std::size_t>(state.range(0));
  const char* entry = failure_entries[state.range(1)];
  state.SetLabel(std::string(entry + 6) + (standby ? ", ready spare" : ", no spare"));
  auto box = start_sandbox(standby);
  std::vector<double> seen_to_exception, replacement, next_call, promoted;
  for (auto _ : state) {
    if (standby && !box.wait_for_standby(std::chrono::minutes(1)))
      state.SkipWithError("the spare did not start");
    const auto called = std::chrono::steady_clock::now();
    try {
      (void)box.call(entry, {.timeout = std::chrono::milliseconds(50)});  // bench_hang's
      state.SkipWithError("the failure did not fail");
    } catch (const cubridge::sandbox_error& e) {
      const auto caught = std::chrono::steady_clock::now();
      state.SetIterationTime(std::chrono::duration<double>(caught - called).count());
      seen_to_exception.push_back(ms(caught - e.seen_at()));
      replacement.push_back(ms(e.restart_duration()));
      promoted.push_back(e.recovery() == cubridge::sandbox_recovery::spare_promoted);
    }
    const auto next = std::chrono::steady_clock::now();
    if (box.call("bench_noop").status != 0) state.SkipWithError("bench_noop failed");
    next_call.push_back(ms(std::chrono::steady_clock::now() - next));
  }
  state.counters["seen_to_exception_ms"] = median(seen_to_exception);
  state.counters["replacement_ms"] = median(replacement);
  state.counters["next_call_ms"] = median(next_call);
  state.counters["spare_promoted"] =
      promoted.empty()
          ? 0
          : std::count(promoted.begin(), promoted.end(), 1.0) / double(promoted.size());
}

// range(0) workers, as many threads calling at once: calls per second through the pool, for a
// no-op and for a kernel on a 16 MiB shared buffer (each thread its own), in items_per_second.
std::unique_ptr<cubridge::sandbox> pool_box;  // one per run, made by thread 0 before the loop
std::vector<cubridge::shared_device_memory> pool_memory;
std::vector<cubridge::sandbox_share> pool_shares;

void start_pool(benchmark::State& state, bool with_buffers) {
  if (state.thread_index() != 0) return;  // the others wait at the loop's start
  pool_box = std::make_unique<cubridge::sandbox>(
      start_sandbox(0, static_cast<std::size_t>(state.range(0))));
  if (!with_buffers) return;
  auto& f = get();
  cubridge::scoped_current current(f.primary);
  for (int t = 0; t < state.threads(); ++t) {
    pool_memory.push_back(cubridge::shared_device_memory::allocate(
        f.dev, std::size_t{16} << 20, cubridge::memory_export::posix_fd));
    cubridge::driver::api().cuMemsetD32(pool_memory.back().address(), 0,
                                        pool_memory.back().size_bytes() / 4);
    pool_shares.push_back(pool_box->share(pool_memory.back()));
  }
}

void end_pool(benchmark::State& state) {
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
  if (state.thread_index() != 0) return;  // all threads left the loop (its end waits for them)
  pool_shares.clear();
  pool_box.reset();
  pool_memory.clear();
}

void BM_sandbox_pool_trivial_call(benchmark::State& state) {
  start_pool(state, false);
  for (auto _ : state)
    if (pool_box->call("bench_noop").status != 0) state.SkipWithError("bench_noop failed");
  end_pool(state);
}

void BM_sandbox_pool_kernel_call(benchmark::State& state) {
  start_pool(state, true);
  for (auto _ : state) {
    const auto& share = pool_shares[static_cast<std::size_t>(state.thread_index())];
    if (pool_box->call("bench_add_one", {.buffers = {share}}).status != 0)
      state.SkipWithError("bench_add_one failed");
  }
  end_pool(state);
}

BENCHMARK(BM_plain_call)->Unit(benchmark::kNanosecond);
BENCHMARK(BM_guest_call)->Arg(0)->Arg(1)->Unit(benchmark::kNanosecond);
BENCHMARK(BM_sandbox_round_trip)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_sandbox_restart)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(5);
BENCHMARK(BM_sandbox_kernel_shared_1GiB)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_sandbox_kernel_copied_through_host_1GiB)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_sandbox_failure)
    ->ArgsProduct({{0, 1}, {0, 1, 2, 3}})
    ->ArgNames({"standby", "kind"})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime()
    ->Iterations(7);
BENCHMARK(BM_sandbox_pool_trivial_call)->Arg(1)->Threads(1)->UseRealTime()->ArgName("workers");
BENCHMARK(BM_sandbox_pool_trivial_call)->Arg(2)->Threads(2)->UseRealTime()->ArgName("workers");
BENCHMARK(BM_sandbox_pool_trivial_call)->Arg(4)->Threads(4)->UseRealTime()->ArgName("workers");
BENCHMARK(BM_sandbox_pool_trivial_call)->Arg(8)->Threads(8)->UseRealTime()->ArgName("workers");
BENCHMARK(BM_sandbox_pool_kernel_call)->Arg(1)->Threads(1)->UseRealTime()->ArgName("workers");
BENCHMARK(BM_sandbox_pool_kernel_call)->Arg(2)->Threads(2)->UseRealTime()->ArgName("workers");
BENCHMARK(BM_sandbox_pool_kernel_call)->Arg(4)->Threads(4)->UseRealTime()->ArgName("workers");
BENCHMARK(BM_sandbox_pool_kernel_call)->Arg(8)->Threads(8)->UseRealTime()->ArgName("workers");

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
