// First launch after prewarm vs first launch without it vs a steady launch (issue #3).
//
// A first launch happens once per process, so Google Benchmark's loop cannot measure it: each
// sample is a fresh child process (this program re-executed with --child MODE), which loads the
// module, optionally prewarms, and times one launch + synchronize with a steady clock. The steady
// launch is timed the same way (launch + synchronize) after warm-up, in the parent.
//   bench_prewarm [--samples N]   (prints medians and the ratios; target: prewarmed <= 2x steady)
#include <cubridge/core/context.hpp>
#include <cubridge/core/detail/child_process.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/module.hpp>
#include <cubridge/core/prewarm.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/core/unique_fd.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

namespace {

using clock_type = std::chrono::steady_clock;

/// Microseconds of one launch of fill_u32 + synchronize in `ctx`.
double timed_launch(const cubridge::kernel& fill, cubridge::driver_buffer<unsigned>& out) {
  const auto start = clock_type::now();
  fill.launch({.grid = {4}, .block = {256}, .stream = cubridge::stream_ref::legacy_default()},
              out.span(), 1u, std::size_t{1024});
  if (cubridge::driver::api().cuCtxSynchronize() != CUDA_SUCCESS) return -1;
  return std::chrono::duration<double, std::micro>(clock_type::now() - start).count();
}

int child(std::string_view mode) {
  auto ctx = cubridge::context::create(cubridge::device::get(0));
  auto m = cubridge::module::load_file(ctx, CUBRIDGE_BENCH_CUBIN);
  auto fill = m.get_kernel("fill_u32");
  auto out = cubridge::driver_buffer<unsigned>::allocate(ctx, 1024);
  cubridge::prewarm_plan plan;
  if (mode != "cold") plan.kernel(fill);
  // The warm-up a service would name: the same kernel on its scratch buffer.
  if (mode == "prewarmed-launch")
    plan.launch(fill,
                {.grid = {4}, .block = {256}, .stream = cubridge::stream_ref::legacy_default()},
                out.span(), 0u, std::size_t{1024});
  (void)plan.run(ctx);
  cubridge::scoped_current current(ctx);
  std::printf("%.3f\n", timed_launch(fill, out));
  return 0;
}

/// Runs this program with --child MODE and returns the number it printed (-1 if it failed).
double sample(const char* self, const char* mode) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return -1;
  cubridge::unique_fd read_end(pipe_fds[0]);
  cubridge::unique_fd write_end(pipe_fds[1]);
  auto child = cubridge::detail::child_process::spawn(
      {.program = self,
       .args = {"--child", mode},
       .environment = cubridge::detail::current_environment(),
       .fds = {{STDOUT_FILENO, write_end.get()}}});
  write_end.reset();  // the child holds the only write end: read() ends when it exits
  char buffer[64] = {};
  const auto n = read(read_end.get(), buffer, sizeof buffer - 1);
  const auto ended = child.wait();
  if (n <= 0 || !ended.exited() || ended.exit_code != 0) return -1;
  return std::atof(buffer);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (!cubridge::driver::available()) {
    std::printf("bench_prewarm: no GPU: %s\n", cubridge::driver::unavailable_reason().c_str());
    return 77;
  }
  if (argc == 3 && std::strcmp(argv[1], "--child") == 0) return child(argv[2]);
  int samples = 15;
  if (argc == 3 && std::strcmp(argv[1], "--samples") == 0)
    samples = std::max(1, std::atoi(argv[2]));

  std::vector<double> cold, prewarmed, launched, steady;
  for (int i = 0; i < samples; ++i) {  // alternate, so drift hits all alike
    cold.push_back(sample("/proc/self/exe", "cold"));
    prewarmed.push_back(sample("/proc/self/exe", "prewarmed"));
    launched.push_back(sample("/proc/self/exe", "prewarmed-launch"));
  }
  {
    auto ctx = cubridge::context::create(cubridge::device::get(0));
    auto m = cubridge::module::load_file(ctx, CUBRIDGE_BENCH_CUBIN);
    auto fill = m.get_kernel("fill_u32");
    auto out = cubridge::driver_buffer<unsigned>::allocate(ctx, 1024);
    cubridge::scoped_current current(ctx);
    for (int i = 0; i < 100; ++i) (void)timed_launch(fill, out);  // warm-up
    for (int i = 0; i < 200; ++i) steady.push_back(timed_launch(fill, out));
  }
  if (std::count(cold.begin(), cold.end(), -1.0) ||
      std::count(prewarmed.begin(), prewarmed.end(), -1.0) ||
      std::count(launched.begin(), launched.end(), -1.0)) {
    std::fprintf(stderr, "bench_prewarm: a child failed\n");
    return 1;
  }
  const double c = median(cold), p = median(prewarmed), l = median(launched), s = median(steady);
  std::printf("launch + synchronize, median of %d fresh processes (steady: of 200 launches)\n",
              samples);
  std::printf("  first launch, no prewarm                         %10.1f us  %6.2fx steady\n", c,
              c / s);
  std::printf("  first launch after prewarm, kernels loaded       %10.1f us  %6.2fx steady\n", p,
              p / s);
  std::printf(
      "  first launch after prewarm with a warm-up launch %10.1f us  %6.2fx steady  (target <= "
      "2x)\n",
      l, l / s);
  std::printf("  steady launch                                    %10.1f us\n", s);
  return 0;
}
