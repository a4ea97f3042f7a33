// What probation costs the serving path (swap/probation.hpp), side by side in one run:
//   1. host time of a hot launch that is not sampled: no probation vs a probation armed (a
//      launch that reads the rate and counts itself), per launch, over async launches;
//   2. the latency of a serving request (launch + synchronize, 2 x 4 MiB buffers) without
//      probation vs with 1% of its launches mirrored into the worker, p50 and p99.
// Each figure is the median of --repeats repeats; the order of the variants alternates.
// Goals (issue 35): unsampled host cost unchanged; p99 with 1% mirrored at most 1.1x.
//   bench_probation [--repeats 5] [--launches 200000] [--requests 3000]
#include <cubridge/compile/compile.hpp>
#include <cubridge/core/context.hpp>
#include <cubridge/core/copy.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/core/stream.hpp>
#include <cubridge/swap/hot_module.hpp>
#include <cubridge/swap/probation.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr unsigned n = 1u << 20;

const char* kernel_source = R"(
extern "C" __global__ void scale(float* out, const float* in, float factor, unsigned n) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] * factor;
}
extern "C" __global__ void nothing(float* out, unsigned n) {
  if (n == 0xffffffffu) out[0] = 1.0f;
})";

std::vector<std::byte> image(const char* variant) {
  cubridge::compile_options o;
  const auto cc = cubridge::device::get(0).capability();
  o.architecture = "sm_" + std::to_string(cc.major) + std::to_string(cc.minor);
  o.defines["VARIANT"] = variant;  // a different image for the candidate, same code
  return cubridge::nvrtc_compile({.name = "probation_bench.cu", .text = kernel_source}, o).cubin;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(p * static_cast<double>(v.size() - 1))];
}

struct bench {
  cubridge::context ctx = cubridge::context::create(cubridge::device::get(0));
  cubridge::scoped_current current{ctx};
  cubridge::hot_module hot = cubridge::hot_module::load(ctx, "bench", image("1"));
  std::vector<std::byte> candidate = image("2");
  cubridge::stream s = cubridge::stream::create(ctx);
  cubridge::driver_buffer<float> in = cubridge::driver_buffer<float>::allocate(ctx, n);
  cubridge::driver_buffer<float> out = cubridge::driver_buffer<float>::allocate(ctx, n);
  std::thread probation;
  std::atomic<bool> armed{false};

  // A probation that never ends while measured: it asks for more passes than will come and
  // ends at its deadline (incomplete), which the bench expects.
  void arm(std::uint32_t sample_every, std::chrono::seconds deadline) {
    armed = false;
    probation = std::thread([this, sample_every, deadline] {
      cubridge::stage_options o;
      o.probation = cubridge::probation_policy{};
      o.probation->required_launches = 1u << 30;
      o.probation->sample_every = sample_every;
      o.probation->deadline = deadline;
      armed = true;
      try {
        (void)hot.stage(candidate, o);
      } catch (const cubridge::probation_error& e) {
        std::fprintf(stderr, "  (probation ended: %s; %u mirrored launches passed)\n",
                     std::string(to_string(e.result().verdict)).c_str(), e.result().passed);
      }
    });
    while (!armed) std::this_thread::sleep_for(1ms);
    std::this_thread::sleep_for(1500ms);  // the worker started, the session armed
  }
  void disarm() {
    if (probation.joinable()) probation.join();
  }

  // Host nanoseconds per launch of `nothing`, async, `count` launches in batches of 256 (the
  // stream synchronized between batches, untimed), so that a full launch queue never blocks.
  double host_ns_per_launch(std::size_t count) {
    auto k = hot.get_kernel("nothing");
    double ns = 0;
    for (std::size_t done = 0; done < count; done += 256) {
      const auto t0 = clock_type::now();
      for (std::size_t i = 0; i < 256; ++i)
        (void)k.launch({.grid = {1}, .block = {32}, .stream = s}, out.span(), 0u);
      ns += std::chrono::duration<double, std::nano>(clock_type::now() - t0).count();
      s.synchronize();
    }
    return ns / static_cast<double>((count + 255) / 256 * 256);
  }

  // Microseconds per request (launch + synchronize), `count` requests.
  std::vector<double> request_latencies_us(std::size_t count) {
    auto k = hot.get_kernel("scale");
    std::vector<double> us;
    us.reserve(count);
    for (std::size_t i = 0; i < count; ++i) {
      const auto t0 = clock_type::now();
      (void)k.launch({.grid = {n / 256}, .block = {256}, .stream = s}, out.span(),
                     cubridge::device_span<const float>(in.span()), 2.0f, n);
      s.synchronize();
      us.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
    }
    return us;
  }
};

}  // namespace

int main(int argc, char** argv) {
  int repeats = 5;
  std::size_t launches = 200'000;
  std::size_t requests = 3'000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--repeats")) repeats = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--launches")) launches = std::strtoull(argv[i + 1], nullptr, 10);
    if (!std::strcmp(argv[i], "--requests")) requests = std::strtoull(argv[i + 1], nullptr, 10);
  }
  try {
    if (cubridge::device::count() == 0) {
      std::puts("bench_probation: no GPU");
      return 77;
    }
  } catch (const std::exception& e) {
    std::printf("bench_probation: no GPU (%s)\n", e.what());
    return 77;
  }
  bench b;
  (void)b.host_ns_per_launch(10'000);  // warm
  (void)b.request_latencies_us(200);

  std::vector<double> host_off, host_on, p50_off, p50_on, p99_off, p99_on, p99_half;
  for (int r = 0; r < repeats; ++r) {
    const bool on_first = r % 2 == 1;
    for (int pass = 0; pass < 2; ++pass) {
      const bool on = (pass == 0) == on_first;
      if (on) {
        // Sampling never hits in the host-cost loop (every 2^30th launch), then 1% for latency.
        b.arm(1u << 30, 4s);
        host_on.push_back(b.host_ns_per_launch(launches));
        b.disarm();
        b.arm(100, std::chrono::seconds(2 + requests / 1000));
        const auto us = b.request_latencies_us(requests);
        b.disarm();
        p50_on.push_back(percentile(us, 0.50));
        p99_on.push_back(percentile(us, 0.99));
        b.arm(200, std::chrono::seconds(2 + requests / 1000));
        p99_half.push_back(percentile(b.request_latencies_us(requests), 0.99));
        b.disarm();
      } else {
        host_off.push_back(b.host_ns_per_launch(launches));
        const auto us = b.request_latencies_us(requests);
        p50_off.push_back(percentile(us, 0.50));
        p99_off.push_back(percentile(us, 0.99));
      }
    }
  }
  const auto gpu = cubridge::device::get(0).name();
  std::printf("bench_probation on %s, medians of %d repeats\n", gpu.c_str(), repeats);
  std::printf("host ns per unsampled hot launch: no probation %.1f, probation armed %.1f (%.2fx)\n",
              median(host_off), median(host_on), median(host_on) / median(host_off));
  std::printf("request p50 us: no probation %.1f, 1%% mirrored %.1f (%.2fx)\n", median(p50_off),
              median(p50_on), median(p50_on) / median(p50_off));
  std::printf("request p99 us: no probation %.1f, 1%% mirrored %.1f (%.2fx; goal <= 1.10x)\n",
              median(p99_off), median(p99_on), median(p99_on) / median(p99_off));
  std::printf("request p99 us: no probation %.1f, 0.5%% mirrored %.1f (%.2fx)\n", median(p99_off),
              median(p99_half), median(p99_half) / median(p99_off));
  // Where the sampled requests sit: the slowest 1% of the 1%-mirrored run.
  std::printf("(a mirrored request waits for the copies of its allocations: 2 x 4 MiB here)\n");
  return 0;
}
