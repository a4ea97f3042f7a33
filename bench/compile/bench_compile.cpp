// Compiling with NVRTC every time vs a hit in the on-disk compile cache, measured side by side in
// one run on the CPU (NVRTC and nvJitLink need no GPU):
//   BM_compile_nvrtc      a small kernel source compiled to an sm_90 cubin each iteration (no
//   cache) BM_compile_cache_hit  the same source and options through compile_cache::get_or_compile,
//   a hit BM_compile_cache_key  only the key of that lookup (hashing source, options, versions)
//   BM_link_nvjitlink     PTX of the same source linked to an sm_90 cubin each iteration
//   BM_link_cache_hit     the same PTX through compile_cache::get_or_link, a hit
// Run with --benchmark_repetitions=N (e.g. 10); bench/report_compile.py prints the medians and the
// hit speed-ups from the JSON output (--benchmark_out=FILE --benchmark_out_format=json).
#include <cubridge/compile/compile.hpp>
#include <cubridge/compile/compile_cache.hpp>

#include <benchmark/benchmark.h>

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace {

const cubridge::cuda_source source{.name = "bench_kernels.cu", .text = R"(
extern "C" __global__ void scale(float* data, float factor, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] *= factor;
}

template <typename T>
__global__ void axpy(T a, const T* x, T* y, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    y[i] = a * x[i] + y[i];
}
)"};

const cubridge::compile_options options{.architecture = "sm_90",
                                        .defines = {{"BLOCK", "256"}},
                                        .name_expressions = {"axpy<float>", "axpy<double>"},
                                        .extra_options = {"-std=c++17"}};

/// A fresh cache directory for this run, removed at exit.
struct bench_cache {
  std::filesystem::path directory;
  cubridge::compile_cache cache;

  static std::filesystem::path make_directory() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "cubridge-bench-cache-XXXXXX").string();
    return ::mkdtemp(pattern.data());
  }
  bench_cache() : directory(make_directory()), cache(cubridge::compile_cache::open(directory)) {}
  ~bench_cache() {
    std::error_code ec;
    std::filesystem::remove_all(directory, ec);
  }
};

bench_cache& get_cache() {
  static bench_cache c;
  return c;
}

const std::string& ptx() {
  static const std::string text =
      cubridge::nvrtc_compile_ptx(
          source, {.architecture = "compute_90", .name_expressions = options.name_expressions})
          .ptx;
  return text;
}

void BM_compile_nvrtc(benchmark::State& state) {
  std::size_t bytes = 0;
  for (auto _ : state) {
    auto image = cubridge::nvrtc_compile(source, options);
    bytes = image.cubin.size();
    benchmark::DoNotOptimize(image);
  }
  state.counters["cubin_bytes"] = static_cast<double>(bytes);
}

void BM_compile_cache_hit(benchmark::State& state) {
  auto& cache = get_cache().cache;
  (void)cache.get_or_compile(source, options);  // the miss that fills the entry
  const auto before = cache.stats();
  for (auto _ : state) {
    auto image = cache.get_or_compile(source, options);
    benchmark::DoNotOptimize(image);
  }
  const auto after = cache.stats();
  if (after.misses != before.misses) state.SkipWithError("a lookup missed");
}

void BM_compile_cache_key(benchmark::State& state) {
  auto& cache = get_cache().cache;
  for (auto _ : state) {
    auto key = cache.key_for(source, options);
    benchmark::DoNotOptimize(key);
  }
}

void BM_link_nvjitlink(benchmark::State& state) {
  const auto& text = ptx();
  for (auto _ : state) {
    auto image = cubridge::ptx_to_cubin(text, {.architecture = "sm_90", .name = "bench.ptx"});
    benchmark::DoNotOptimize(image);
  }
}

void BM_link_cache_hit(benchmark::State& state) {
  auto& cache = get_cache().cache;
  const auto& text = ptx();
  const cubridge::ptx_link_options link{.architecture = "sm_90", .name = "bench.ptx"};
  (void)cache.get_or_link(text, link);
  const auto before = cache.stats();
  for (auto _ : state) {
    auto image = cache.get_or_link(text, link);
    benchmark::DoNotOptimize(image);
  }
  if (cache.stats().misses != before.misses) state.SkipWithError("a lookup missed");
}

BENCHMARK(BM_compile_nvrtc)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_compile_cache_hit)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_compile_cache_key)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_link_nvjitlink)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_link_cache_hit)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
