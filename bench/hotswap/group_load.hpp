#pragma once
// The load of the group swap-under-load harness (group_swap_under_load.cpp): its members (a
// context each, with a serving and a step stream and a device log), the serving threads, the
// step thread of pinned multi-member steps, one phase run around a swapper, and the analysis of
// each member's log (stats.hpp). What is timed and checked: see group_swap_under_load.cpp.
#include "harness_common.hpp"
#include "stats.hpp"

#include <cubridge/core/context.hpp>
#include <cubridge/core/device.hpp>
#include <cubridge/core/device_buffer.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/event.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/core/stream.hpp>
#include <cubridge/swap/hot_module_group.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace hotswap::group {

struct options {
  int devices = 0;   // --devices N: one context on each of devices 0..N-1
  int contexts = 0;  // --contexts N: N contexts of device 0
  std::uint64_t cycles = 300;
  double steady_ms = 1000;
  double spin_us = 20;
  unsigned depth = 8;
  std::uint64_t log_slots = 1ull << 20;  // per member and phase
  double max_phase_s = 20;
  double swap_pause_us =
      0;  // --swap-pause-us: between cycles, as a service that swaps now and then
  std::string json_path;
  std::string images_dir;
};

/// One member: its context, a serving and a step stream, their event rings, its device log.
struct member {
  member(cubridge::device dev, const options& o)
      : device(dev.ordinal()),
        ctx(cubridge::context::create(dev)),
        serve_stream(cubridge::stream::create(ctx)),
        step_stream(cubridge::stream::create(ctx)),
        log(cubridge::driver_buffer<gpu_record>::allocate(ctx, o.log_slots)),
        entries(o.log_slots) {  // touched now, not while serving
    for (unsigned d = 0; d < o.depth; ++d) {
      serve_ring.push_back(cubridge::event::create(ctx));
      step_ring.push_back(cubridge::event::create(ctx));
    }
  }
  std::optional<std::uint64_t> take_slot() {
    const auto slot = next_slot.fetch_add(1, std::memory_order_relaxed);
    return slot < entries.size() ? std::optional(slot) : std::nullopt;
  }
  void clear_log() {
    cubridge::scoped_current current(ctx);
    check(cubridge::driver::api().cuMemsetD8(log.address(), 0, log.size_bytes()), "clear log");
    check(cubridge::driver::api().cuCtxSynchronize(), "cuCtxSynchronize (log cleared)");
  }

  int device;
  cubridge::context ctx;
  cubridge::stream serve_stream;
  cubridge::stream step_stream;
  cubridge::driver_buffer<gpu_record> log;
  std::vector<launch_entry> entries;  // host, indexed by slot
  std::vector<cubridge::event> serve_ring;
  std::vector<cubridge::event> step_ring;
  std::atomic<std::uint64_t> next_slot{0};
};

/// One pinned step: the generation it pinned and its slot on each member (none: not launched).
struct step_record {
  std::uint64_t pinned_id = 0;  // 0: pin() threw
  std::vector<std::optional<std::uint64_t>> slots;
};

struct thread_errors {
  std::vector<std::string> messages;
  void add(std::string m) {
    if (messages.size() < 3) messages.push_back(std::move(m));
  }
};

struct member_result {
  std::uint64_t launches = 0;       // serving launches of the phase
  std::uint64_t step_launches = 0;  // step launches on this member
  hotswap::check_counts checks;     // over both kinds
  hotswap::summary gap_us;          // GPU gaps of the member's log, launches begun in the window
  hotswap::summary latency_us;      // serving launch calls begun in the window
};

struct phase_result {
  std::string name;
  std::int64_t begin_ns = 0, end_ns = 0;  // the measured window (the swapper's run)
  std::uint64_t cycles_requested = 0, cycles_done = 0, swapper_failures = 0;
  bool log_full = false, time_limited = false;
  std::uint64_t steps = 0, mixed_steps = 0;
  std::vector<member_result> members;
  std::vector<hotswap::op_timing> ops;
  std::vector<std::string> errors;

  hotswap::op_timing& op(const std::string& name) {
    for (auto& o : ops)
      if (o.name == name) return o;
    return ops.emplace_back(hotswap::op_timing{.name = name, .samples_us = {}, .us = {}});
  }
  void failure(std::string m) {
    ++swapper_failures;
    if (errors.size() < 5) errors.push_back(std::move(m));
  }
  [[nodiscard]] std::uint64_t must_be_zero() const {
    std::uint64_t n = mixed_steps + swapper_failures;
    for (const auto& m : members) n += m.checks.must_be_zero_total();
    return n;
  }
  [[nodiscard]] bool failed() const { return must_be_zero() > 0 || !errors.empty(); }
};

/// The members, the group over them, and the phases.
struct harness {
  harness(const options& o, const std::vector<std::vector<std::byte>>& images,
          std::vector<std::unique_ptr<member>>& m, cubridge::hot_module_group& g)
      : opt(o),
        cubins(images),
        members(m),
        group(g),
        kernel(g.get_kernel("serve")),
        spin_ns(static_cast<unsigned long long>(std::llround(o.spin_us * 1e3))),
        tag_of{{g.serving().id, 1}},
        promoted(g.serving().id) {}

  const options& opt;
  const std::vector<std::vector<std::byte>>& cubins;  // tag = index + 1
  std::vector<std::unique_ptr<member>>& members;
  cubridge::hot_module_group& group;
  cubridge::group_kernel kernel;
  unsigned long long spin_ns;
  std::unordered_map<std::uint64_t, std::uint64_t> tag_of;  // version id -> image tag
  std::atomic<bool> go{false}, stop{false}, log_full{false};
  std::atomic<int> warmed{0};
  std::atomic<std::uint64_t> promoted{0};  // id of the last promote that returned

  [[nodiscard]] std::uint32_t step_thread() const {  // launch_entry::thread of step launches
    return static_cast<std::uint32_t>(members.size());
  }
  static cubridge::launch_config config(const cubridge::stream& s) {
    return {.grid = {1}, .block = {32}, .stream = s};
  }

  /// One launch on `mb` (its context current) with `cfg`, through `pinned` when given, into a
  /// slot of its own of mb's log, noted in mb.entries. Returns the slot; none when the log is full.
  std::optional<std::uint64_t> launch_logged(member& mb, const cubridge::launch_config& cfg,
                                             const cubridge::pinned_generation* pinned,
                                             std::uint32_t thread, std::uint64_t promoted_before,
                                             thread_errors& errors) {
    const auto slot = mb.take_slot();
    if (!slot) {
      log_full = true;
      return std::nullopt;
    }
    launch_entry e;
    e.slot = *slot;
    e.thread = thread;
    e.promoted_before = promoted_before;
    e.host_start_ns = now_ns();
    try {
      e.returned_id = pinned ? kernel.launch(*pinned, cfg, mb.log.data(), *slot, spin_ns)
                             : kernel.launch(cfg, mb.log.data(), *slot, spin_ns);
    } catch (const std::exception& ex) {
      e.failed = true;
      errors.add(std::string(pinned ? "pinned launch: " : "launch: ") + ex.what());
    }
    e.host_end_ns = now_ns();
    mb.entries[*slot] = e;
    return slot;
  }

  /// Member m's serving thread: launches back to back, at most `depth` queued.
  void serve(std::uint32_t m, thread_errors& errors) {
    auto& mb = *members[m];
    bool counted_warm = false;
    try {
      cubridge::scoped_current current(mb.ctx);
      const auto cfg = config(mb.serve_stream);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      for (std::uint64_t n = 0; !stop.load(std::memory_order_relaxed); ++n) {
        auto& done = mb.serve_ring[n % opt.depth];
        if (n >= opt.depth) done.synchronize();
        const auto promoted_before = promoted.load(std::memory_order_acquire);
        if (!launch_logged(mb, cfg, nullptr, m, promoted_before, errors)) break;
        done.record(mb.serve_stream);
        if (n + 1 == opt.depth) {
          warmed.fetch_add(1);
          counted_warm = true;
        }
      }
      mb.serve_stream.synchronize();
    } catch (const std::exception& ex) {
      errors.add("server " + std::to_string(m) + ": " + ex.what());
      stop = true;
    }
    if (!counted_warm) warmed.fetch_add(1);  // never keep the main thread waiting
  }

  /// The step thread: a pinned generation launched on every member's step stream, step after
  /// step, at most `depth` steps queued.
  void step(std::vector<step_record>& steps, thread_errors& errors) {
    try {
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      for (std::uint64_t n = 0; !stop.load(std::memory_order_relaxed) && !log_full; ++n) {
        if (n >= opt.depth)
          for (auto& mb : members) mb->step_ring[n % opt.depth].synchronize();
        auto& rec = steps.emplace_back();
        rec.slots.resize(members.size());
        const auto promoted_before = promoted.load(std::memory_order_acquire);
        const auto pinned = group.pin();
        rec.pinned_id = pinned.id();
        for (std::uint32_t m = 0; m < members.size() && !log_full; ++m) {
          auto& mb = *members[m];
          cubridge::scoped_current current(mb.ctx);
          rec.slots[m] = launch_logged(mb, config(mb.step_stream), &pinned, step_thread(),
                                       promoted_before, errors);
          mb.step_ring[n % opt.depth].record(mb.step_stream);
        }
      }
      for (auto& mb : members) mb->step_stream.synchronize();
    } catch (const std::exception& ex) {
      errors.add(std::string("step thread: ") + ex.what());
      stop = true;
    }
  }

  [[nodiscard]] bool swapper_should_stop(phase_result& r) const {
    if (log_full.load() || stop.load()) return true;
    r.time_limited = static_cast<double>(now_ns() - r.begin_ns) / 1e9 > opt.max_phase_s;
    return r.time_limited;
  }

  /// Runs one phase: servers and the step thread, `swap(result)` on this thread once they are
  /// warm (its run is the measured window), then the analysis.
  template <class Swap>
  phase_result run_phase(const std::string& name, std::uint64_t cycles, Swap swap) {
    go = false;
    stop = false;
    log_full = false;
    warmed = 0;
    for (auto& mb : members) mb->next_slot = 0;
    std::fprintf(stderr, "group_swap_under_load: %s ...\n", name.c_str());
    phase_result r;
    r.name = name;
    r.cycles_requested = cycles;
    std::vector<thread_errors> errors(members.size() + 1);
    std::vector<step_record> steps;
    steps.reserve(1u << 16);
    std::vector<std::thread> threads;
    for (std::uint32_t m = 0; m < members.size(); ++m)
      threads.emplace_back([&, m] { serve(m, errors[m]); });
    threads.emplace_back([&] { step(steps, errors.back()); });
    go.store(true, std::memory_order_release);
    const auto warm_deadline = now_ns() + 10'000'000'000ll;
    while (warmed.load() < static_cast<int>(members.size()) && !stop && now_ns() < warm_deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    r.begin_ns = now_ns();
    try {
      swap(r);
    } catch (const std::exception& ex) {
      r.failure(std::string("swapper: ") + ex.what());
    }
    r.end_ns = now_ns();
    stop = true;
    for (auto& t : threads) t.join();
    for (auto& e : errors) r.errors.insert(r.errors.end(), e.messages.begin(), e.messages.end());
    r.log_full = log_full.load();
    analyze(r, steps);
    return r;
  }

  /// Brings mb's log home (the first `used` slots) and clears it for the next phase. The
  /// context is synchronised first and after: its streams do not wait for the legacy stream.
  static std::vector<gpu_record> take_log(member& mb, std::uint64_t used) {
    std::vector<gpu_record> records(used);
    cubridge::scoped_current current(mb.ctx);
    const auto& cu = cubridge::driver::api();
    check(cu.cuCtxSynchronize(), "cuCtxSynchronize (log)");
    if (used == 0) return records;
    check(cu.cuMemcpy(reinterpret_cast<CUdeviceptr>(records.data()), mb.log.address(),
                      used * sizeof(gpu_record)),
          "cuMemcpy (log)");
    check(cu.cuMemsetD8(mb.log.address(), 0, used * sizeof(gpu_record)), "cuMemsetD8 (log)");
    check(cu.cuCtxSynchronize(), "cuCtxSynchronize (log cleared)");
    return records;
  }

  void analyze(phase_result& r, const std::vector<step_record>& steps) {
    hotswap::version_facts facts;
    facts.tag_of = tag_of;
    std::vector<std::vector<gpu_record>> logs;
    for (auto& mb : members) {
      const auto used = std::min<std::uint64_t>(mb->next_slot.load(), mb->entries.size());
      const auto& records = logs.emplace_back(take_log(*mb, used));
      const std::span<const launch_entry> launches(mb->entries.data(), used);
      auto& out = r.members.emplace_back();
      out.checks = hotswap::check_launches(launches, records, facts);
      std::vector<double> latency;
      std::vector<hotswap::kernel_span> kernels;
      for (const auto& e : launches) {
        const bool served = e.thread != step_thread();
        ++(served ? out.launches : out.step_launches);
        if (e.failed || e.host_start_ns < r.begin_ns || e.host_start_ns > r.end_ns) continue;
        if (served) latency.push_back(us_between(e.host_start_ns, e.host_end_ns));
        if (const auto& rec = records[e.slot]; rec.tag != 0)
          kernels.push_back({rec.start_ns, rec.end_ns});
      }
      out.latency_us = hotswap::summarize(std::move(latency));
      auto gaps = hotswap::analyze_gaps(std::move(kernels));
      for (auto& g : gaps.gaps_ns) g /= 1e3;
      out.gap_us = hotswap::summarize(std::move(gaps.gaps_ns));
    }
    for (const auto& s : steps) {
      if (s.pinned_id == 0 || !s.slots.front()) continue;  // pin() threw (an error), or log full
      ++r.steps;
      r.mixed_steps += step_mixed(s, logs) ? 1U : 0U;
    }
    for (auto& op : r.ops) op.us = hotswap::summarize(op.samples_us);
  }

  /// A launch of the step reported another version than the pin's, or a kernel of it wrote
  /// another tag than the pinned generation's image tag.
  bool step_mixed(const step_record& s, const std::vector<std::vector<gpu_record>>& logs) const {
    const auto tag = tag_of.find(s.pinned_id);
    for (std::size_t m = 0; m < s.slots.size(); ++m) {
      if (!s.slots[m]) continue;
      const auto& e = members[m]->entries[*s.slots[m]];
      if (e.failed) continue;  // a failed launch
      const auto written = logs[m][*s.slots[m]].tag;
      if (e.returned_id != s.pinned_id || tag == tag_of.end() ||
          (written != 0 && written != tag->second))
        return true;
    }
    return false;
  }
};

}  // namespace hotswap::group
