// Swap under load (issue 4, "Measure"): serving threads launch ~20 us kernels back to back
// through a cubridge::hot_module while a swapper thread stages and promotes precompiled cubins;
// in the same run, the same serving load under a bare cuModuleLoadData of the cubins and under
// the naive way (driver JIT of PTX + immediate cuModuleUnload of the old module).
//
// For each serving-thread count (--threads, default 1,4,8), one context, one hot_module, and
// four phases in turn, each on a cleared device log:
//   steady     servers only, for --steady-ms;
//   hot-swap   the swapper makes --cycles stage + promote cycles of the cubins v1, v2, v3 in turn;
//   bare-load+unload  as bare-load, each load followed by the unload of the module loaded two
//              cycles before: the driver's own cost of what a swap does (a reference);
//   module+function+unload, library+function+unload  the same with the served kernel looked up
//              (loaded into the context, as stage() does), through a module or a CUlibrary;
//   bare-load  the swapper makes --bare-cycles cuModuleLoadData of the same cubins (kept loaded,
//              unloaded after the servers stopped); the servers launch as in steady;
//   naive-ptx  the servers launch a raw CUfunction taken under a mutex; the swapper makes
//              --naive-cycles: cuModuleLoadData of the PTX (driver JIT, cache disabled unless
//              --jit-cache), cuModuleGetFunction, swap under the mutex, cuModuleUnload of the old
//              module as soon as no launch call of it is in progress (no wait for its GPU work).
//
// What is timed where:
//   - each serving thread (own stream, context pushed) loops: wait for the event of its launch
//     `depth` launches ago (so at most --depth kernels are queued per stream and the launch call
//     never blocks on a full queue), take a slot from a host atomic counter, read the "promoted"
//     counter (id of the last promote that had returned), then steady_clock around the launch
//     call alone (hot_kernel::launch, or mutex + cuLaunchKernel for naive), then record an event.
//   - the kernel (serve_kernel.cu): block 0 thread 0 reads %globaltimer, every thread spins
//     --spin-us, block 0 thread 0 writes {image tag, start, end} to log[slot].
//   - the swapper thread: steady_clock around stage() and promote() separately (around the load,
//     or the JIT load, get-function, swap and unload for the references); after each promote it
//     publishes the new id to the "promoted" counter; before each cycle it samples
//     hot_module::stats() (outside the timed spans) for the unload bounds.
//   - the measured window of a phase is the swapper's run (or the steady sleep), starting once
//     every server has made `depth` launches; latencies and gaps count launches begun inside it;
//     the must-be-zero checks count every launch of the phase.
//   - GPU idle gaps: the kernels' [start, end] of all streams sorted by start; gap = next start
//     - latest end so far, 0 when overlapped (stats.hpp).
//   - the host and GPU clocks are related by launching a %globaltimer read between two host
//     reads (best of 32) before and after each phase, offset interpolated linearly; used only to
//     place GPU holes against swapper operations and unload times against kernel starts, with
//     the calibration uncertainty + --slack-us as tolerance.
//
// Must be zero (exit status 1 otherwise; reference phase naive-ptx reported, not gated):
//   failed launches; launches whose kernel never wrote its slot; launches that ran a retired
//   version (the tag the kernel wrote is not the tag of the image of the version id launch()
//   returned, or the kernel started on the GPU after its version was certainly unloaded: after
//   a stats() sample showed it retired with nothing waiting, mapped to the GPU clock, + tolerance);
//   launches begun after promote(P) returned that got a version < P; swapper operations that threw.
//   (A kernel of version R that merely starts after promote(R + 2) retired R is not one: it was
//   launched before and is still queued, and hot_module waits for it before unloading R. Those
//   are counted, as extra "kernels_started_after_their_version_retired_in_flight".)
// Targets (printed, in the JSON, not in the exit status): hot-swap max GPU gap <= 1.5x bare-load
// max GPU gap; hot-swap p99 launch latency <= 1.5x steady p99.
//
//   swap_under_load [--threads 1,4,8] [--cycles 1000] [--json PATH] ...   (--help lists all)
// Exit: 0 all must-be-zero counts are 0; 1 some are not; 2 usage; 3 harness error;
//       77 no usable GPU ("swap_under_load: no GPU: <reason>").
#include "harness_common.hpp"
#include "stats.hpp"

#include <cubridge/core/context.hpp>
#include <cubridge/core/device.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/event.hpp>
#include <cubridge/core/module.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/core/stream.hpp>
#include <cubridge/swap/hot_module.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

namespace fs = std::filesystem;
using hotswap::check;
using hotswap::finite_or_null;
using hotswap::gpu_record;
using hotswap::launch_entry;
using hotswap::now_ns;
using hotswap::to_json;
using hotswap::us_between;
using json = nlohmann::json;

constexpr int image_count = 3;  // serve_v1..v3, as bench/CMakeLists.txt builds them
constexpr double target_limit = 1.5;

// ------------------------------------------------------------------------------------------
// Options

struct options {
  std::vector<int> threads{1, 4, 8};
  std::uint64_t cycles = 1000;
  std::uint64_t bare_cycles = 1000;
  std::uint64_t naive_cycles = 50;
  bool naive = true;
  double steady_ms = 2000;
  double spin_us = 20;
  unsigned depth = 8;
  unsigned blocks = 1;
  unsigned block_threads = 32;
  std::uint64_t log_slots = 1ull << 23;
  double swap_pause_us = 0;
  double max_phase_s = 120;
  double slack_us = 20;
  bool jit_cache = false;
  std::string json_path;
  std::string images_dir;
};

const char* usage_text =
    "usage: swap_under_load [options]\n"
    "  --threads LIST      serving thread counts, run in turn (default 1,4,8)\n"
    "  --cycles N          hot-swap stage+promote cycles (default 1000)\n"
    "  --bare-cycles N     bare cuModuleLoadData cycles (default 1000)\n"
    "  --naive-cycles N    naive PTX JIT load + unload cycles (default 50; ~25-110 ms each)\n"
    "  --no-naive          skip the naive reference\n"
    "  --steady-ms MS      steady-state window (default 2000)\n"
    "  --spin-us US        serving kernel duration (default 20)\n"
    "  --depth N           kernels queued per stream at most (default 8)\n"
    "  --blocks N          serving kernel grid (default 1)\n"
    "  --block-threads N   serving kernel block (default 32)\n"
    "  --log-slots N       device log capacity in launches per phase (default 8388608)\n"
    "  --swap-pause-us US  pause between swapper cycles (default 0: back to back)\n"
    "  --max-phase-s S     cut a swapper phase after S seconds (default 120)\n"
    "  --slack-us US       tolerance added to clock-mapped comparisons (default 20)\n"
    "  --jit-cache         leave the driver's JIT cache on (default: CUDA_CACHE_DISABLE=1)\n"
    "  --json PATH         write every number as JSON (rewritten after each thread count)\n"
    "  --images DIR        where serve_v{1,2,3}.sm_90.cubin / .compute_90.ptx are\n"
    "                      (default: the program's directory, then the build directory)\n";

/// Parses argv; returns an exit code to stop with (0 after --help, 2 on error), or nullopt.
std::optional<int> parse(int argc, char** argv, options& o) {
  auto fail = [](const std::string& why) {
    std::fprintf(stderr, "swap_under_load: %s\n%s", why.c_str(), usage_text);
    return 2;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(usage_text, stdout);
      return 0;
    }
    if (a == "--no-naive") {
      o.naive = false;
      continue;
    }
    if (a == "--jit-cache") {
      o.jit_cache = true;
      continue;
    }
    if (i + 1 >= argc) return fail("missing value after " + a);
    const std::string v = argv[++i];
    try {
      std::size_t used = 0;
      auto number = [&](double min) {
        const double x = std::stod(v, &used);
        if (used != v.size() || !(x >= min)) throw std::invalid_argument(v);
        return x;
      };
      auto count = [&](std::uint64_t min) {
        const auto x = std::stoull(v, &used);
        if (used != v.size() || x < min || v[0] == '-') throw std::invalid_argument(v);
        return x;
      };
      if (a == "--threads") {
        o.threads.clear();
        std::size_t start = 0;
        while (start <= v.size()) {
          const auto comma = v.find(',', start);
          const auto item =
              v.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
          const int n = std::stoi(item, &used);
          if (used != item.size() || n < 1 || n > 256) throw std::invalid_argument(item);
          o.threads.push_back(n);
          if (comma == std::string::npos) break;
          start = comma + 1;
        }
      } else if (a == "--cycles") {
        o.cycles = count(1);
      } else if (a == "--bare-cycles") {
        o.bare_cycles = count(1);
      } else if (a == "--naive-cycles") {
        o.naive_cycles = count(1);
      } else if (a == "--steady-ms") {
        o.steady_ms = number(1);
      } else if (a == "--spin-us") {
        o.spin_us = number(0);
      } else if (a == "--depth") {
        o.depth = static_cast<unsigned>(count(1));
      } else if (a == "--blocks") {
        o.blocks = static_cast<unsigned>(count(1));
      } else if (a == "--block-threads") {
        o.block_threads = static_cast<unsigned>(count(1));
      } else if (a == "--log-slots") {
        o.log_slots = count(1024);
      } else if (a == "--swap-pause-us") {
        o.swap_pause_us = number(0);
      } else if (a == "--max-phase-s") {
        o.max_phase_s = number(0.001);
      } else if (a == "--slack-us") {
        o.slack_us = number(0);
      } else if (a == "--json") {
        o.json_path = v;
      } else if (a == "--images") {
        o.images_dir = v;
      } else {
        return fail("unknown option " + a);
      }
    } catch (const std::exception&) {
      return fail("bad value '" + v + "' for " + a);
    }
  }
  return std::nullopt;
}

// ------------------------------------------------------------------------------------------
// Images

struct images {
  fs::path dir;
  std::vector<std::vector<std::byte>> cubins;  // tag = index + 1
  std::vector<std::vector<std::byte>> ptx;     // NUL-terminated, as cuModuleLoadData wants
};

images load_images(const options& o) {
  images im;
  im.dir = hotswap::find_serve_image_dir(o.images_dir, CUBRIDGE_SERVE_IMAGE_DIR);
  for (int v = 1; v <= image_count; ++v) {
    const auto stem = im.dir / ("serve_v" + std::to_string(v));
    im.cubins.push_back(hotswap::read_image(stem.string() + ".sm_90.cubin"));
    auto ptx = hotswap::read_image(stem.string() + ".compute_90.ptx");
    ptx.push_back(std::byte{0});
    im.ptx.push_back(std::move(ptx));
  }
  return im;
}

// ------------------------------------------------------------------------------------------
// The GPU side shared by all phases

/// Reads %globaltimer between two host reads.
struct clock_probe {
  clock_probe(const cubridge::context& ctx, std::span<const std::byte> cubin)
      : loaded(cubridge::module::load(ctx, cubin, {.name = "serve (clock probe)"})),
        stamp(loaded.get_kernel("stamp")),
        out(cubridge::driver_buffer<unsigned long long>::allocate(ctx, 1)),
        stream(cubridge::stream::create(ctx)) {}

  /// Best (narrowest) of `samples`; the caller has the context current and the GPU otherwise idle.
  hotswap::clock_sample calibrate(int samples = 32) {
    hotswap::clock_sample best{
        .host_ns = 0, .gpu_ns = 0, .uncertainty_ns = std::numeric_limits<std::int64_t>::max()};
    for (int i = 0; i < samples + 2; ++i) {
      const auto t0 = now_ns();
      stamp.launch({.stream = stream}, out.data());
      stream.synchronize();
      const auto t1 = now_ns();
      unsigned long long gpu = 0;
      check(cubridge::driver::api().cuMemcpy(reinterpret_cast<CUdeviceptr>(&gpu), out.address(),
                                             sizeof gpu),
            "cuMemcpy (clock probe)");
      if (i < 2) continue;  // warm-up
      const auto half = (t1 - t0 + 1) / 2;
      if (half < best.uncertainty_ns)
        best = {.host_ns = t0 + (t1 - t0) / 2, .gpu_ns = gpu, .uncertainty_ns = half};
    }
    return best;
  }

  cubridge::module loaded;
  cubridge::kernel stamp;
  cubridge::driver_buffer<unsigned long long> out;
  cubridge::stream stream;
};

/// State the servers and the swapper of one phase share.
struct phase_shared {
  std::atomic<bool> go{false};
  std::atomic<bool> stop{false};
  std::atomic<bool> log_full{false};
  std::atomic<int> warmed{0};
  std::atomic<std::uint64_t> next_slot{0};
  std::atomic<std::uint64_t> promoted{0};  // id of the last promote that returned
};

struct server_errors {
  std::vector<std::string> messages;
  void add(std::string m) {
    if (messages.size() < 3) messages.push_back(std::move(m));
  }
};

/// What one swapper run produced.
struct swapper_output {
  std::int64_t begin_ns = 0;
  std::int64_t end_ns = 0;
  std::vector<std::pair<std::int64_t, std::int64_t>> windows;  // host, one per operation cycle
  std::deque<hotswap::op_timing> ops;  // a deque: op() hands out references that must stay valid
  std::vector<hotswap::chain_sample> samples;                        // hot-swap only
  std::unordered_map<std::uint64_t, std::int64_t> unloaded_host_ns;  // naive: id -> unload returned
  std::unordered_map<std::uint64_t, std::int64_t>
      promoted_host_ns;  // hot-swap: id -> promote returned
  std::uint64_t cycles_requested = 0;
  std::uint64_t cycles_done = 0;
  std::uint64_t cycles_failed = 0;
  bool time_limited = false;
  std::vector<std::string> errors;
  std::vector<std::pair<std::string, double>> extra;

  hotswap::op_timing& op(const std::string& name) {
    for (auto& o : ops)
      if (o.name == name) return o;
    ops.push_back({.name = name, .samples_us = {}, .us = {}});
    return ops.back();
  }
  void error(std::string m) {
    ++cycles_failed;
    if (errors.size() < 5) errors.push_back(std::move(m));
  }
};

/// Everything of one serving-thread count.
struct bench {
  const options& opt;
  const images& im;
  cubridge::context& ctx;
  cubridge::driver_buffer<gpu_record>& log;  // device, opt.log_slots
  std::vector<launch_entry>& entries;        // host, indexed by slot, opt.log_slots
  clock_probe& probe;
  int threads;
  std::vector<cubridge::stream> streams;
  std::vector<std::vector<cubridge::event>> rings;  // per server, opt.depth events
  phase_shared shared;

  bench(const options& o, const images& i, cubridge::context& c,
        cubridge::driver_buffer<gpu_record>& l, std::vector<launch_entry>& e, clock_probe& p, int n)
      : opt(o), im(i), ctx(c), log(l), entries(e), probe(p), threads(n) {
    for (int s = 0; s < n; ++s) {
      streams.push_back(cubridge::stream::create(ctx));
      rings.emplace_back();
      for (unsigned d = 0; d < opt.depth; ++d) rings.back().push_back(cubridge::event::create(ctx));
    }
  }

  [[nodiscard]] cubridge::launch_config config(std::size_t server) const {
    return {.grid = {opt.blocks}, .block = {opt.block_threads}, .stream = streams[server]};
  }
  [[nodiscard]] unsigned long long spin_ns() const {
    return static_cast<unsigned long long>(std::llround(opt.spin_us * 1e3));
  }

  /// One serving thread. `launch(config, slot)` launches and returns the version id that ran.
  template <class Launch>
  void serve(std::uint32_t index, Launch& launch, server_errors& errors) {
    bool counted_warm = false;
    try {
      cubridge::scoped_current current(ctx);
      const auto cfg = config(index);
      auto& ring = rings[index];
      std::vector<std::uint64_t> ring_slots(ring.size());  // slot of the launch each event follows
      while (!shared.go.load(std::memory_order_acquire)) std::this_thread::yield();
      std::uint64_t n = 0;
      while (!shared.stop.load(std::memory_order_relaxed)) {
        auto& done = ring[n % ring.size()];
        if (n >= ring.size()) {
          done.synchronize();  // at most `depth` kernels queued
          entries[ring_slots[n % ring.size()]].host_done_ns = now_ns();
        }
        const auto slot = shared.next_slot.fetch_add(1, std::memory_order_relaxed);
        if (slot >= entries.size()) {
          shared.log_full.store(true);
          break;
        }
        launch_entry e{.slot = slot,
                       .returned_id = 0,
                       .promoted_before = 0,
                       .host_start_ns = 0,
                       .host_end_ns = 0,
                       .host_done_ns = 0,
                       .thread = index,
                       .failed = false};
        e.promoted_before = shared.promoted.load(std::memory_order_acquire);
        const auto t0 = now_ns();
        try {
          e.returned_id = launch(cfg, slot);
        } catch (const std::exception& ex) {
          e.failed = true;
          errors.add(std::string("launch: ") + ex.what());
        }
        const auto t1 = now_ns();
        e.host_start_ns = t0;
        e.host_end_ns = t1;
        entries[slot] = e;
        done.record(streams[index]);
        ring_slots[n % ring.size()] = slot;
        if (++n == ring.size()) {
          shared.warmed.fetch_add(1);
          counted_warm = true;
        }
      }
      streams[index].synchronize();
    } catch (const std::exception& ex) {
      errors.add(std::string("server ") + std::to_string(index) + ": " + ex.what());
      shared.stop.store(true);
    }
    if (!counted_warm) shared.warmed.fetch_add(1);  // never keep the main thread waiting
  }

  /// Runs one phase: servers with `launch`, then `swap(out)` on a swapper thread once they are
  /// warm, then `cleanup(out)` with the servers stopped; analyses everything.
  template <class Launch, class Swap, class Cleanup>
  hotswap::phase_result phase(const std::string& name, bool gated, std::uint64_t promoted_initially,
                              Launch launch, Swap swap, Cleanup cleanup,
                              const std::unordered_map<std::uint64_t, std::uint64_t>& tag_of) {
    shared.go = false;
    shared.stop = false;
    shared.log_full = false;
    shared.warmed = 0;
    shared.next_slot = 0;
    shared.promoted = promoted_initially;
    std::fprintf(stderr, "swap_under_load: %d thread(s): %s ...\n", threads, name.c_str());

    const auto before = probe.calibrate();
    std::vector<server_errors> errors(static_cast<std::size_t>(threads));
    std::vector<std::thread> servers;
    for (int s = 0; s < threads; ++s)
      servers.emplace_back([&, s] {
        serve(static_cast<std::uint32_t>(s), launch, errors[static_cast<std::size_t>(s)]);
      });
    shared.go.store(true, std::memory_order_release);
    const auto warm_deadline = now_ns() + 10'000'000'000ll;
    while (shared.warmed.load() < threads && !shared.stop.load() && now_ns() < warm_deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(100));

    swapper_output out;
    std::thread swapper([&] {
      try {
        cubridge::scoped_current current(ctx);
        swap(out);
      } catch (const std::exception& ex) {
        out.error(std::string("swapper: ") + ex.what());
        if (out.end_ns == 0) out.end_ns = now_ns();
      }
    });
    swapper.join();
    shared.stop.store(true);
    for (auto& t : servers) t.join();
    check(cubridge::driver::api().cuCtxSynchronize(), "cuCtxSynchronize after the phase");
    try {
      cleanup(out);
    } catch (const std::exception& ex) {
      out.error(std::string("cleanup: ") + ex.what());
    }
    const auto after = probe.calibrate();

    // Bring the device log home and clear it for the next phase.
    const auto used = std::min<std::uint64_t>(shared.next_slot.load(), entries.size());
    std::vector<gpu_record> records(used);
    if (used) {
      check(cubridge::driver::api().cuMemcpy(reinterpret_cast<CUdeviceptr>(records.data()),
                                             log.address(), used * sizeof(gpu_record)),
            "cuMemcpy (log)");
      check(cubridge::driver::api().cuMemsetD8(log.address(), 0, used * sizeof(gpu_record)),
            "cuMemsetD8 (log)");
    }
    const std::span<const launch_entry> launches(entries.data(), used);

    hotswap::phase_result r;
    r.name = name;
    r.threads = threads;
    r.gated = gated;
    r.cycles_requested = out.cycles_requested;
    r.cycles_done = out.cycles_done;
    r.cycles_failed = out.cycles_failed;
    r.time_limited = out.time_limited;
    r.log_full = shared.log_full.load();
    r.errors = out.errors;
    for (auto& e : errors)
      for (auto& m : e.messages) r.errors.push_back(m);
    r.extra = out.extra;

    const hotswap::clock_map clocks(before, after);
    const auto tolerance = clocks.uncertainty_ns() + static_cast<std::int64_t>(opt.slack_us * 1e3);
    r.clock_drift_ppm = clocks.drift_ppm();
    r.clock_uncertainty_us = static_cast<double>(clocks.uncertainty_ns()) / 1e3;
    r.clock_tolerance_us = static_cast<double>(tolerance) / 1e3;

    hotswap::version_facts facts;
    facts.tag_of = tag_of;
    auto bounds = out.unloaded_host_ns;
    for (const auto& [id, host] : hotswap::unload_bounds(out.samples)) bounds.emplace(id, host);
    for (const auto& [id, host] : bounds)
      facts.unloaded_by_gpu_ns[id] = clocks.gpu_from_host(host) + tolerance;
    r.versions_with_unload_bound = bounds.size();
    r.checks = hotswap::check_launches(launches, records, facts);
    r.launches_total = launches.size();
    r.clock = hotswap::check_clock(launches, records, clocks, tolerance);
    if (!out.promoted_host_ns.empty()) {
      // Not a violation: kernels of version R that started on the GPU after promote(R + 2)
      // retired R (launched before it, still queued): the work retirement has to wait for.
      std::uint64_t in_flight = 0;
      for (const auto& e : launches) {
        if (e.failed || e.slot >= records.size() || records[e.slot].tag == 0) continue;
        const auto retired = out.promoted_host_ns.find(e.returned_id + 2);
        if (retired != out.promoted_host_ns.end() &&
            static_cast<std::int64_t>(records[e.slot].start_ns) >
                clocks.gpu_from_host(retired->second) + tolerance)
          ++in_flight;
      }
      r.extra.emplace_back("kernels_started_after_their_version_retired_in_flight",
                           static_cast<double>(in_flight));
    }

    // The measured window.
    r.window_s = static_cast<double>(out.end_ns - out.begin_ns) / 1e9;
    const hotswap::window_set ops_windows(out.windows);
    std::vector<double> latency, latency_in_ops;
    std::vector<hotswap::kernel_span> kernels;
    std::vector<double> kernel_us;
    for (const auto& e : launches) {
      if (e.host_start_ns < out.begin_ns || e.host_start_ns > out.end_ns) continue;
      ++r.launches_in_window;
      if (e.failed) continue;
      const double us = us_between(e.host_start_ns, e.host_end_ns);
      latency.push_back(us);
      if (ops_windows.overlaps(e.host_start_ns, e.host_end_ns)) latency_in_ops.push_back(us);
      const auto& rec = records[e.slot];
      if (rec.tag != 0) {
        kernels.push_back({rec.start_ns, rec.end_ns});
        kernel_us.push_back(static_cast<double>(rec.end_ns - rec.start_ns) / 1e3);
      }
    }
    r.launches_per_s = r.window_s > 0 ? static_cast<double>(r.launches_in_window) / r.window_s : 0;
    r.latency_us = hotswap::summarize(std::move(latency));
    r.latency_in_ops_us = hotswap::summarize(std::move(latency_in_ops));
    r.kernel_us = hotswap::summarize(std::move(kernel_us));

    auto gaps = hotswap::analyze_gaps(std::move(kernels));
    for (auto& g : gaps.gaps_ns) g /= 1e3;
    r.gap_us = hotswap::summarize(std::move(gaps.gaps_ns));
    r.gaps_positive = gaps.holes.size();
    r.idle_fraction = gaps.span_ns > 0 ? gaps.idle_ns / gaps.span_ns : 0;
    std::vector<double> in_ops;
    std::vector<std::pair<double, double>> holes;
    for (const auto& h : gaps.holes) {
      const auto begin = clocks.host_from_gpu(h.start_ns);
      const auto end = clocks.host_from_gpu(h.end_ns);
      const double length = static_cast<double>(h.end_ns - h.start_ns) / 1e3;
      if (ops_windows.overlaps(begin - tolerance, end + tolerance)) in_ops.push_back(length);
      holes.emplace_back(us_between(out.begin_ns, begin), length);
    }
    r.gap_in_ops_us = hotswap::summarize(std::move(in_ops));
    std::sort(holes.begin(), holes.end(),
              [](const auto& a, const auto& b) { return a.second > b.second; });
    if (holes.size() > 10) holes.resize(10);
    r.largest_holes_us = std::move(holes);

    for (auto& op : out.ops) {
      op.us = hotswap::summarize(op.samples_us);
      r.ops.push_back(std::move(op));
    }
    return r;
  }

  /// Should the swapper stop early?
  bool swapper_should_stop(swapper_output& out) const {
    if (shared.log_full.load() || shared.stop.load()) return true;
    if (static_cast<double>(now_ns() - out.begin_ns) / 1e9 > opt.max_phase_s) {
      out.time_limited = true;
      return true;
    }
    return false;
  }
  void pause() const {
    if (opt.swap_pause_us > 0)
      std::this_thread::sleep_for(std::chrono::nanoseconds(std::llround(opt.swap_pause_us * 1e3)));
  }
};

// ------------------------------------------------------------------------------------------
// The naive reference: a raw CUfunction swapped under a mutex

struct naive_generation {
  CUmodule module = nullptr;
  CUfunction function = nullptr;
  std::uint64_t id = 0;
  std::atomic<int> launching{0};  // launch calls of this generation in progress
};

struct naive_state {
  std::mutex mutex;
  naive_generation* current = nullptr;
  std::deque<naive_generation> generations;  // stable addresses for the phase
};

// ------------------------------------------------------------------------------------------
// JSON

json to_json(const hotswap::phase_result& p) {
  json ops = json::object();
  for (const auto& op : p.ops)
    ops[op.name] = {{"us", to_json(op.us)}, {"samples_us", op.samples_us}};
  json holes = json::array();
  for (const auto& [at, length] : p.largest_holes_us)
    holes.push_back({{"at_us", at}, {"us", length}});
  json extra = json::object();
  for (const auto& [k, v] : p.extra) extra[k] = v;
  const auto& c = p.checks;
  return {
      {"phase", p.name},
      {"threads", p.threads},
      {"gated", p.gated},
      {"window_s", p.window_s},
      {"launches_total", p.launches_total},
      {"launches_in_window", p.launches_in_window},
      {"launches_per_s", p.launches_per_s},
      {"must_be_zero",
       {{"failed_launches", c.failed},
        {"missing_records", c.missing_record},
        {"ran_retired_version", c.ran_retired()},
        {"ran_retired_wrong_code", c.wrong_code},
        {"ran_retired_after_unload", c.ran_after_unload},
        {"old_version_after_promote", c.stale_after_promote},
        {"swapper_failures", p.cycles_failed},
        {"total", c.must_be_zero_total() + p.cycles_failed},
        {"examples", c.examples}}},
      {"launches_checked", c.launches},
      {"gpu_gap_us", to_json(p.gap_us)},
      {"gpu_gaps_positive", p.gaps_positive},
      {"gpu_idle_fraction", p.idle_fraction},
      {"gpu_gap_during_ops_us", to_json(p.gap_in_ops_us)},
      {"largest_gpu_holes", holes},
      {"kernel_duration_us", to_json(p.kernel_us)},
      {"launch_latency_us", to_json(p.latency_us)},
      {"launch_latency_during_ops_us", to_json(p.latency_in_ops_us)},
      {"ops", ops},
      {"cycles_requested", p.cycles_requested},
      {"cycles_done", p.cycles_done},
      {"log_full", p.log_full},
      {"time_limited", p.time_limited},
      {"clock",
       {{"drift_ppm", p.clock_drift_ppm},
        {"uncertainty_us", p.clock_uncertainty_us},
        {"tolerance_us", p.clock_tolerance_us},
        {"kernels_checked", p.clock.checked},
        {"kernels_mapped_before_their_launch", p.clock.start_before_launch},
        {"kernels_mapped_after_their_completion", p.clock.end_after_done},
        {"min_launch_to_start_us", finite_or_null(p.clock.min_launch_to_start_us)},
        {"min_end_to_done_us", finite_or_null(p.clock.min_end_to_done_us)}}},
      {"versions_with_unload_bound", p.versions_with_unload_bound},
      {"errors", p.errors},
      {"extra", extra},
  };
}

bool phase_failed(const hotswap::phase_result& p) {
  return p.gated && (p.checks.must_be_zero_total() + p.cycles_failed > 0 || !p.errors.empty());
}

// ------------------------------------------------------------------------------------------
// One serving-thread count: steady, hot-swap, bare-load, naive-ptx

std::vector<hotswap::phase_result> run_threads(const options& opt, const images& im,
                                               cubridge::context& ctx,
                                               cubridge::driver_buffer<gpu_record>& log,
                                               std::vector<launch_entry>& entries,
                                               clock_probe& probe, int threads) {
  bench b(opt, im, ctx, log, entries, probe, threads);
  const auto& cu = cubridge::driver::api();
  gpu_record* const log_ptr = log.data();
  const auto spin = b.spin_ns();
  std::vector<hotswap::phase_result> results;

  // The hot module: v1 first, then v2, v3, v1, ... Version ids are the chain's (1, 2, 3, ...);
  // tag_of maps each id to the image (tag = VERSION) it was loaded from.
  auto hot = cubridge::hot_module::load(ctx, "serve", im.cubins[0]);
  const auto serve = hot.get_kernel("serve");
  std::unordered_map<std::uint64_t, std::uint64_t> hot_tags{{hot.stats().current_id, 1}};
  int hot_image = 0;

  // Warm-up: every stream launches a few kernels (first launch of the function, lazy loading).
  for (int s = 0; s < threads; ++s)
    for (int i = 0; i < 4; ++i)
      (void)serve.launch(b.config(static_cast<std::size_t>(s)), log_ptr, std::uint64_t{0}, spin);
  check(cu.cuCtxSynchronize(), "cuCtxSynchronize (warm-up)");
  check(cu.cuMemsetD8(log.address(), 0, sizeof(gpu_record)), "cuMemsetD8 (warm-up)");

  auto hot_launch = [&](const cubridge::launch_config& c, std::uint64_t slot) {
    return serve.launch(c, log_ptr, slot, spin);
  };
  auto nothing = [](swapper_output&) {};

  // steady
  results.push_back(b.phase(
      "steady", true, hot.stats().current_id, hot_launch,
      [&](swapper_output& out) {
        out.begin_ns = now_ns();
        const auto until = out.begin_ns + static_cast<std::int64_t>(opt.steady_ms * 1e6);
        while (now_ns() < until && !b.shared.log_full.load() && !b.shared.stop.load())
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        out.end_ns = now_ns();
      },
      nothing, hot_tags));

  // hot-swap
  results.push_back(b.phase(
      "hot-swap", true, hot.stats().current_id, hot_launch,
      [&](swapper_output& out) {
        out.cycles_requested = opt.cycles;
        auto& stage_op = out.op("stage");
        auto& promote_op = out.op("promote");
        stage_op.samples_us.reserve(opt.cycles);
        promote_op.samples_us.reserve(opt.cycles);
        out.samples.reserve(opt.cycles + 1);
        out.begin_ns = now_ns();
        for (std::uint64_t k = 0; k < opt.cycles && !b.swapper_should_stop(out); ++k) {
          const auto st = hot.stats();
          out.samples.push_back({now_ns(), st.current_id, st.retired_waiting});
          const int next = (hot_image + 1) % image_count;
          const cubridge::stage_options stage_options{
              .smoke_test = {}, .source_name = "serve_v" + std::to_string(next + 1)};
          try {
            const auto t0 = now_ns();
            auto staged = hot.stage(im.cubins[static_cast<std::size_t>(next)], stage_options);
            const auto t1 = now_ns();
            const auto id = hot.promote(std::move(staged));
            const auto t2 = now_ns();
            b.shared.promoted.store(id, std::memory_order_release);
            out.promoted_host_ns[id] = t2;
            hot_tags[id] = static_cast<std::uint64_t>(next + 1);
            hot_image = next;
            stage_op.samples_us.push_back(us_between(t0, t1));
            promote_op.samples_us.push_back(us_between(t1, t2));
            out.windows.emplace_back(t0, t2);
            ++out.cycles_done;
          } catch (const std::exception& ex) {
            out.error(std::string("stage/promote: ") + ex.what());
          }
          b.pause();
        }
        out.end_ns = now_ns();
      },
      [&](swapper_output& out) {
        // Servers stopped, GPU idle: let the reclaimer finish, then one last sample.
        for (int i = 0; i < 500 && hot.stats().retired_waiting != 0; ++i) {
          (void)hot.reclaim();
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        const auto st = hot.stats();
        out.samples.push_back({now_ns(), st.current_id, st.retired_waiting});
        out.extra = {{"hot_module_promotions", static_cast<double>(st.promotions)},
                     {"hot_module_unloaded", static_cast<double>(st.unloaded)},
                     {"hot_module_rejected", static_cast<double>(st.rejected)},
                     {"hot_module_retired_waiting_at_end", static_cast<double>(st.retired_waiting)},
                     {"hot_module_current_version", static_cast<double>(st.current_id)}};
      },
      hot_tags));

  // The references: what a swap asks of the driver, without cubridge, loading the same cubins.
  //   bare-load                cuModuleLoadData alone, every module kept loaded until the
  //                            servers stopped (the driver's own cost of a load)
  //   bare-load+unload         each load followed by the unload of the module loaded two cycles
  //                            before (a hot module keeps the current and the rollback version)
  //   module+function+unload   as bare-load+unload, and cuModuleGetFunction of the served kernel
  //                            (under lazy loading that loads it into the context, as stage() does)
  //   library+function+unload  the same through a CUlibrary: cuLibraryLoadData, cuLibraryGetKernel,
  //                            cuKernelGetFunction, cuLibraryUnload. Does a library unload wait
  //                            for the context as a module unload does?
  enum class load_kind { module, module_function, library_function };
  struct loaded_code {
    CUmodule module = nullptr;
    CUlibrary library = nullptr;
  };
  auto load_code = [&](load_kind kind, const std::vector<std::byte>& image, loaded_code& code) {
    if (kind == load_kind::library_function) {
      CUkernel k = nullptr;
      CUfunction f = nullptr;
      CUresult rc = cu.cuLibraryLoadData(&code.library, image.data(), nullptr, nullptr, 0, nullptr,
                                         nullptr, 0);
      if (rc == CUDA_SUCCESS) rc = cu.cuLibraryGetKernel(&k, code.library, "serve");
      if (rc == CUDA_SUCCESS) rc = cu.cuKernelGetFunction(&f, k);  // loads it into this context
      return rc;
    }
    CUresult rc = cu.cuModuleLoadDataEx(&code.module, image.data(), 0, nullptr, nullptr);
    if (rc == CUDA_SUCCESS && kind == load_kind::module_function) {
      CUfunction f = nullptr;
      rc = cu.cuModuleGetFunction(&f, code.module, "serve");
    }
    return rc;
  };
  auto unload_code = [&](const loaded_code& code) {
    return code.library ? cu.cuLibraryUnload(code.library) : cu.cuModuleUnload(code.module);
  };
  // `keep`: how many loaded versions stay loaded; the oldest beyond that is unloaded in the cycle
  // (timed as "unload"). Whatever is still loaded is unloaded after the servers stopped.
  auto load_phase = [&](const char* name, load_kind kind, std::size_t keep) {
    std::deque<loaded_code> loaded;
    results.push_back(b.phase(
        name, true, hot.stats().current_id, hot_launch,
        [&](swapper_output& out) {
          out.cycles_requested = opt.bare_cycles;
          auto& load_op = out.op("load");
          load_op.samples_us.reserve(opt.bare_cycles);
          out.begin_ns = now_ns();
          for (std::uint64_t k = 0; k < opt.bare_cycles && !b.swapper_should_stop(out); ++k) {
            loaded_code code;
            const auto t0 = now_ns();
            const auto rc = load_code(kind, im.cubins[(k + 1) % image_count], code);
            const auto t1 = now_ns();
            if (rc != CUDA_SUCCESS) {
              out.error(std::string(name) + ": load failed: " + std::to_string(rc));
              if (code.module || code.library) (void)unload_code(code);
              b.pause();
              continue;
            }
            load_op.samples_us.push_back(us_between(t0, t1));
            out.windows.emplace_back(t0, t1);
            loaded.push_back(code);
            if (loaded.size() > keep) {
              const auto t2 = now_ns();
              const auto urc = unload_code(loaded.front());
              const auto t3 = now_ns();
              loaded.pop_front();
              if (urc != CUDA_SUCCESS)
                out.error(std::string(name) + ": unload failed: " + std::to_string(urc));
              out.op("unload").samples_us.push_back(us_between(t2, t3));
              out.windows.emplace_back(t2, t3);
            }
            ++out.cycles_done;
            b.pause();
          }
          out.end_ns = now_ns();
        },
        [&](swapper_output& out) {
          const auto t0 = now_ns();
          for (const auto& code : loaded) check(unload_code(code), "unload after the phase");
          out.extra = {{"unload_all_after_phase_us", us_between(t0, now_ns())}};
          loaded.clear();
        },
        hot_tags));
  };
  load_phase("bare-load", load_kind::module, std::numeric_limits<std::size_t>::max());
  load_phase("bare-load+unload", load_kind::module, 2);
  load_phase("module+function+unload", load_kind::module_function, 2);
  load_phase("library+function+unload", load_kind::library_function, 2);

  // naive-ptx: driver JIT + immediate unload, launches through a raw CUfunction under a mutex
  if (opt.naive) {
    naive_state naive;
    std::unordered_map<std::uint64_t, std::uint64_t> naive_tags;
    auto load_ptx = [&](int image, naive_generation& g) {
      check(cu.cuModuleLoadDataEx(&g.module, im.ptx[static_cast<std::size_t>(image)].data(), 0,
                                  nullptr, nullptr),
            "cuModuleLoadData (PTX)");
      check(cu.cuModuleGetFunction(&g.function, g.module, "serve"), "cuModuleGetFunction");
    };
    int naive_image = 0;
    {
      auto& first = naive.generations.emplace_back();
      first.id = 1;
      load_ptx(0, first);
      naive.current = &first;
      naive_tags[1] = 1;
    }
    auto naive_launch = [&](const cubridge::launch_config& c, std::uint64_t slot) {
      naive_generation* g = nullptr;
      {
        std::lock_guard lock(naive.mutex);
        g = naive.current;
        g->launching.fetch_add(1, std::memory_order_relaxed);
      }
      gpu_record* log_arg = log_ptr;
      unsigned long long slot_arg = slot;
      unsigned long long spin_arg = spin;
      void* args[] = {&log_arg, &slot_arg, &spin_arg};
      const auto rc = cu.cuLaunchKernel(g->function, c.grid.x, c.grid.y, c.grid.z, c.block.x,
                                        c.block.y, c.block.z, 0, c.stream.get(), args, nullptr);
      g->launching.fetch_sub(1, std::memory_order_release);
      check(rc, "cuLaunchKernel (naive)");
      return g->id;
    };
    results.push_back(b.phase(
        "naive-ptx", false, 1, naive_launch,
        [&](swapper_output& out) {
          out.cycles_requested = opt.naive_cycles;
          auto& jit_op = out.op("jit_load");
          auto& get_op = out.op("get_function");
          auto& swap_op = out.op("swap");
          auto& unload_op = out.op("unload");
          out.begin_ns = now_ns();
          for (std::uint64_t k = 0; k < opt.naive_cycles && !b.swapper_should_stop(out); ++k) {
            const int next = (naive_image + 1) % image_count;
            auto& fresh = naive.generations.emplace_back();
            fresh.id = naive.current->id + 1;
            const auto t0 = now_ns();
            auto rc = cu.cuModuleLoadDataEx(
                &fresh.module, im.ptx[static_cast<std::size_t>(next)].data(), 0, nullptr, nullptr);
            const auto t1 = now_ns();
            if (rc != CUDA_SUCCESS) {
              out.error("cuModuleLoadData (PTX) failed: " + std::to_string(rc));
              continue;
            }
            rc = cu.cuModuleGetFunction(&fresh.function, fresh.module, "serve");
            const auto t2 = now_ns();
            if (rc != CUDA_SUCCESS) {
              out.error("cuModuleGetFunction failed: " + std::to_string(rc));
              cu.cuModuleUnload(fresh.module);
              fresh.module = nullptr;
              continue;
            }
            naive_generation* old = nullptr;
            {
              std::lock_guard lock(naive.mutex);
              old = naive.current;
              naive.current = &fresh;
            }
            // No launch can take `old` any more; wait for launch calls already holding it (host
            // side only, microseconds), not for its GPU work: the unload is immediate.
            while (old->launching.load(std::memory_order_acquire) != 0) std::this_thread::yield();
            const auto t3 = now_ns();
            b.shared.promoted.store(fresh.id, std::memory_order_release);
            naive_tags[fresh.id] = static_cast<std::uint64_t>(next + 1);
            naive_image = next;
            rc = cu.cuModuleUnload(old->module);
            const auto t4 = now_ns();
            old->module = nullptr;
            if (rc != CUDA_SUCCESS) out.error("cuModuleUnload failed: " + std::to_string(rc));
            out.unloaded_host_ns[old->id] = t4;
            jit_op.samples_us.push_back(us_between(t0, t1));
            get_op.samples_us.push_back(us_between(t1, t2));
            swap_op.samples_us.push_back(us_between(t2, t3));
            unload_op.samples_us.push_back(us_between(t3, t4));
            out.windows.emplace_back(t0, t4);
            ++out.cycles_done;
            b.pause();
          }
          out.end_ns = now_ns();
        },
        [&](swapper_output&) {
          for (auto& g : naive.generations)
            if (g.module) {
              check(cu.cuModuleUnload(g.module), "cuModuleUnload (naive, after the phase)");
              g.module = nullptr;
            }
        },
        naive_tags));
  }
  return results;
}

}  // namespace

int main(int argc, char** argv) {
  options opt;
  if (const auto stop = parse(argc, argv, opt)) return *stop;

  // A new version's PTX would never be in the JIT cache: measure the naive way with it off.
  // Must be set before the driver initialises (it reads the variable at cuInit).
  if (!opt.jit_cache) setenv("CUDA_CACHE_DISABLE", "1", 1);

  if (!cubridge::driver::available()) {
    std::printf("swap_under_load: no GPU: %s\n", cubridge::driver::unavailable_reason().c_str());
    return 77;
  }
  try {
    if (cubridge::device::count() == 0) {
      std::printf("swap_under_load: no GPU: the CUDA driver reports no device\n");
      return 77;
    }
    const auto dev = cubridge::device::get(0);
    if (dev.capability().major != 9) {
      std::printf("swap_under_load: no GPU: device 0 (%s) is sm_%d, the images are sm_90\n",
                  dev.name().c_str(), dev.capability().as_int());
      return 77;
    }
  } catch (const std::exception& e) {
    std::printf("swap_under_load: no GPU: %s\n", e.what());
    return 77;
  }

  try {
    const auto im = load_images(opt);
    const auto dev = cubridge::device::get(0);
    auto ctx = cubridge::context::create(dev);
    cubridge::scoped_current current(ctx);
    auto log = cubridge::driver_buffer<gpu_record>::allocate(ctx, opt.log_slots);
    check(cubridge::driver::api().cuMemsetD8(log.address(), 0, log.size_bytes()),
          "cuMemsetD8 (log)");
    std::vector<launch_entry> entries(opt.log_slots);  // touched now, not while serving
    clock_probe probe(ctx, im.cubins[0]);

    CUmoduleLoadingMode mode{};
    const bool lazy = cubridge::driver::api().cuModuleGetLoadingMode(&mode) == CUDA_SUCCESS &&
                      mode == CU_MODULE_LAZY_LOADING;
    json report = {
        {"tool", "swap_under_load"},
        {"device", dev.name()},
        {"driver_version", cubridge::driver::version()},
        {"module_loading", lazy ? "lazy" : "eager"},
        {"jit_cache", opt.jit_cache},
        {"images", im.dir.string()},
        {"config",
         {{"threads", opt.threads},
          {"cycles", opt.cycles},
          {"bare_cycles", opt.bare_cycles},
          {"naive_cycles", opt.naive ? opt.naive_cycles : 0},
          {"steady_ms", opt.steady_ms},
          {"spin_us", opt.spin_us},
          {"depth", opt.depth},
          {"blocks", opt.blocks},
          {"block_threads", opt.block_threads},
          {"log_slots", opt.log_slots},
          {"swap_pause_us", opt.swap_pause_us},
          {"max_phase_s", opt.max_phase_s},
          {"slack_us", opt.slack_us},
          {"target_limit", target_limit}}},
        {"percentile_rule", "linear interpolation between closest ranks (NumPy 'linear')"},
        {"runs", json::array()},
    };
    std::printf(
        "swap_under_load on %s, driver %d, %s module loading, JIT cache %s; kernels %.0f us, "
        "depth %u per stream; %llu hot swaps, %llu bare loads, %llu naive PTX swaps\n\n",
        dev.name().c_str(), cubridge::driver::version(), lazy ? "lazy" : "eager",
        opt.jit_cache ? "on" : "off", opt.spin_us, opt.depth,
        static_cast<unsigned long long>(opt.cycles),
        static_cast<unsigned long long>(opt.bare_cycles),
        static_cast<unsigned long long>(opt.naive ? opt.naive_cycles : 0));
    std::fflush(stdout);

    bool failed = false;
    for (const int n : opt.threads) {
      const auto phases = run_threads(opt, im, ctx, log, entries, probe, n);
      std::fputs(hotswap::format_report(phases, target_limit).c_str(), stdout);
      std::fputs("\n", stdout);
      std::fflush(stdout);
      json run = {{"threads", n}, {"phases", json::array()}};
      const hotswap::phase_result* steady = nullptr;
      const hotswap::phase_result* swap = nullptr;
      const hotswap::phase_result* bare = nullptr;
      for (const auto& p : phases) {
        run["phases"].push_back(to_json(p));
        failed = failed || phase_failed(p);
        if (p.name == "steady") steady = &p;
        if (p.name == "hot-swap") swap = &p;
        if (p.name == "bare-load") bare = &p;
      }
      if (steady && swap && bare) {
        const auto v = hotswap::judge(*steady, *swap, *bare, target_limit);
        run["verdict"] = {{"gap_ratio", finite_or_null(v.gap_ratio)},
                          {"gap_met", v.gap_met},
                          {"latency_ratio", finite_or_null(v.latency_ratio)},
                          {"latency_met", v.latency_met},
                          {"limit", target_limit}};
      }
      report["runs"].push_back(std::move(run));
      report["must_be_zero_ok"] = !failed;
      if (!opt.json_path.empty()) {
        std::ofstream file(opt.json_path, std::ios::trunc);
        file << report.dump(2) << "\n";
        if (!file) throw std::runtime_error("cannot write " + opt.json_path);
      }
    }
    std::printf("swap_under_load: must-be-zero checks %s\n", failed ? "FAILED" : "all 0");
    return failed ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "swap_under_load: error: %s\n", e.what());
    return 3;
  }
}
