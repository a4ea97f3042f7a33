// Group swap under load (issue 16): the one-GPU harness (swap_under_load.cpp) for a
// cubridge::hot_module_group. Members: one context per device (--devices N) or N contexts of
// device 0 (--contexts N; the default on a one-GPU machine, N = 2; on a machine with several
// GPUs the default is one member per GPU).
//
// Load, the same in every phase: per member one serving thread (its own stream of the member's
// context, context pushed) launching the ~20 us serve kernel (serve_kernel.cu) back to back
// through ONE group_kernel, at most --depth kernels queued (it waits for the event of its launch
// `depth` launches ago); and one step thread that pins a generation (hot_module_group::pin())
// and launches the kernel once on every member's step stream through the pin (a multi-GPU
// step), its queue bounded the same way. Every launch gets its own slot of its member's device
// log, where the kernel writes {image tag, %globaltimer start, end}.
// Phases, each on cleared logs: steady (no swapper); group-swap (the swapper, on the main
// thread, makes --cycles stage + promote cycles of serve_v1..v3 in turn through the group);
// bare-load (the reference: --cycles rounds of cuModuleLoadData of the same cubins on every
// member's context, kept loaded, unloaded after the phase).
//
// Timed: steady_clock around each serving launch call (p99 launch latency, per member); the
// GPU idle gaps of each member's log (stats.hpp: kernels sorted by start, gap = start - latest
// end so far), over the launches begun in the measured window (the swapper's run, from when
// every server has `depth` launches queued). Members of one GPU are separate logs: a member's
// gaps include the time the GPU gave to the other contexts. Stage, promote and load calls.
// Must be zero (exit 1 otherwise): failed launches; launches whose kernel never wrote its slot;
// wrong tags (the kernel wrote a tag that is not the image tag of the version id launch()
// returned); launches begun after promote(P) returned that ran a version < P; mixed steps (a
// launch of a step reporting a version other than the pin's, or a kernel of the step writing a
// tag other than that generation's image tag); swapper or harness-thread failures.
// Target (printed and in the JSON, not in the exit status): per member, group-swap max GPU gap
// <= 1.5x bare-load max GPU gap.
//
//   group_swap_under_load [--devices N | --contexts N] [--cycles 300] [--json PATH] (--help)
// Exit: 0 all must-be-zero counts 0; 1 some not; 2 usage; 3 harness error; 77 no usable GPU
//       (one line, "group_swap_under_load: no GPU: <reason>").
#include "group_load.hpp"
#include "harness_common.hpp"
#include "stats.hpp"

#include <cubridge/core/device.hpp>
#include <cubridge/core/driver.hpp>
#include <cubridge/core/module.hpp>
#include <cubridge/core/scoped_current.hpp>
#include <cubridge/swap/hot_module_group.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

using hotswap::check;
using hotswap::format_number;
using hotswap::now_ns;
using hotswap::us_between;
using json = nlohmann::json;

using namespace hotswap::group;

constexpr const char* tool = "group_swap_under_load";
constexpr int image_count = 3;  // serve_v1..v3, as bench/CMakeLists.txt builds them
constexpr double target_limit = 1.5;

const char* usage_text =
    "usage: group_swap_under_load [options]\n"
    "  --devices N       one member per device 0..N-1 (default with several GPUs: all)\n"
    "  --contexts N      N members, contexts of device 0 (default with one GPU: 2)\n"
    "  --cycles N        group-swap stage+promote cycles, and bare-load rounds (default 300)\n"
    "  --swap-pause-us US  pause between two cycles of either swapper phase (default 0)\n"
    "  --steady-ms MS    steady window (default 1000)\n"
    "  --spin-us US      serving kernel duration (default 20)\n"
    "  --depth N         kernels queued per stream at most (default 8)\n"
    "  --log-slots N     device log capacity per member and phase (default 1048576)\n"
    "  --max-phase-s S   cut a swapper phase after S seconds (default 20)\n"
    "  --json PATH       write every number as JSON\n"
    "  --images DIR      where serve_v{1,2,3}.sm_90.cubin are (default: next to the program)\n";

/// Parses argv; returns an exit code to stop with (0 after --help, 2 on error), or nullopt.
std::optional<int> parse(int argc, char** argv, options& o) {
  auto fail = [](const std::string& why) {
    std::fprintf(stderr, "%s: %s\n%s", tool, why.c_str(), usage_text);
    return 2;
  };
  auto count = [](const std::string& v, std::uint64_t min, std::uint64_t max) {
    std::size_t used = 0;
    const auto x = std::stoull(v, &used);
    if (used != v.size() || v[0] == '-' || x < min || x > max) throw std::invalid_argument(v);
    return x;
  };
  auto number = [](const std::string& v, double min) {
    std::size_t used = 0;
    const double x = std::stod(v, &used);
    if (used != v.size() || !(x >= min)) throw std::invalid_argument(v);
    return x;
  };
  using setter = std::function<void(const std::string&)>;
  const std::unordered_map<std::string, setter> set = {
      {"--devices", [&](auto& v) { o.devices = static_cast<int>(count(v, 1, 64)); }},
      {"--contexts", [&](auto& v) { o.contexts = static_cast<int>(count(v, 1, 64)); }},
      {"--cycles", [&](auto& v) { o.cycles = count(v, 1, 1'000'000); }},
      {"--steady-ms", [&](auto& v) { o.steady_ms = number(v, 1); }},
      {"--spin-us", [&](auto& v) { o.spin_us = number(v, 0); }},
      {"--depth", [&](auto& v) { o.depth = static_cast<unsigned>(count(v, 1, 1024)); }},
      {"--log-slots", [&](auto& v) { o.log_slots = count(v, 1024, 1ull << 28); }},
      {"--max-phase-s", [&](auto& v) { o.max_phase_s = number(v, 0.001); }},
      {"--swap-pause-us", [&](auto& v) { o.swap_pause_us = number(v, 0); }},
      {"--json", [&](auto& v) { o.json_path = v; }},
      {"--images", [&](auto& v) { o.images_dir = v; }}};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(usage_text, stdout);
      return 0;
    }
    const auto it = set.find(a);
    if (it == set.end()) return fail("unknown option " + a);
    if (i + 1 >= argc) return fail("missing value after " + a);
    try {
      it->second(argv[++i]);
    } catch (const std::exception&) {
      return fail("bad value '" + std::string(argv[i]) + "' for " + a);
    }
  }
  if (o.devices && o.contexts) return fail("--devices and --contexts exclude each other");
  return std::nullopt;
}

/// The reason no usable GPU runs these members, or nullopt; settles the default member layout.
std::optional<std::string> no_gpu_reason(options& o) {
  if (!cubridge::driver::available()) return cubridge::driver::unavailable_reason();
  try {
    const int count = cubridge::device::count();
    if (count == 0) return "the CUDA driver reports no device";
    if (!o.devices && !o.contexts) {
      if (count > 1)
        o.devices = count;
      else
        o.contexts = 2;
    }
    if (o.devices > count)
      return "--devices " + std::to_string(o.devices) + " needs " + std::to_string(o.devices) +
             " GPUs, this machine has " + std::to_string(count);
    for (int d = 0; d < std::max(o.devices, 1); ++d) {
      const auto dev = cubridge::device::get(d);
      if (dev.capability().major != 9)
        return "device " + std::to_string(d) + " (" + dev.name() + ") is sm_" +
               std::to_string(dev.capability().as_int()) + ", the images are sm_90";
    }
  } catch (const std::exception& e) {
    return e.what();
  }
  return std::nullopt;
}

void warm_up(harness& h) {
  for (auto& mb : h.members) {
    cubridge::scoped_current current(mb->ctx);
    const auto pinned = h.group.pin();
    for (int i = 0; i < 4; ++i) {
      (void)h.kernel.launch(harness::config(mb->serve_stream), mb->log.data(), std::uint64_t{0},
                            h.spin_ns);
      (void)h.kernel.launch(pinned, harness::config(mb->step_stream), mb->log.data(),
                            std::uint64_t{0}, h.spin_ns);
    }
    check(cubridge::driver::api().cuCtxSynchronize(), "cuCtxSynchronize (warm-up)");
    mb->clear_log();
  }
}

phase_result steady(harness& h) {
  return h.run_phase("steady", 0, [&](phase_result&) {
    const auto until = now_ns() + static_cast<std::int64_t>(h.opt.steady_ms * 1e6);
    while (now_ns() < until && !h.log_full && !h.stop)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
}

/// The pause between two swapper cycles (--swap-pause-us), the same in both swapper phases.
void pause(const harness& h) {
  if (h.opt.swap_pause_us > 0)
    std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(h.opt.swap_pause_us));
}

phase_result group_swap(harness& h) {
  int image = 0;  // the serving version's image index (v1 loaded first)
  phase_result r = h.run_phase("group-swap", h.opt.cycles, [&](phase_result& out) {
    for (std::uint64_t k = 0; k < h.opt.cycles && !h.swapper_should_stop(out); ++k) {
      const int next = (image + 1) % image_count;
      try {
        const auto t0 = now_ns();
        auto staged =
            h.group.stage(h.cubins[static_cast<std::size_t>(next)],
                          {.smoke_test = {}, .source_name = "serve_v" + std::to_string(next + 1)});
        const auto t1 = now_ns();
        const auto id = h.group.promote(std::move(staged));
        const auto t2 = now_ns();
        h.tag_of[id] = static_cast<std::uint64_t>(next + 1);
        h.promoted.store(id, std::memory_order_release);
        image = next;
        out.op("stage").samples_us.push_back(us_between(t0, t1));
        out.op("promote").samples_us.push_back(us_between(t1, t2));
        ++out.cycles_done;
      } catch (const std::exception& ex) {
        out.failure(std::string("stage/promote: ") + ex.what());
      }
      pause(h);
    }
  });
  // Servers stopped, GPUs idle: let the retired versions be unloaded now (not timed).
  for (int i = 0; i < 500; ++i) {
    (void)h.group.reclaim();
    std::size_t waiting = 0;
    for (const auto& m : h.group.stats().members) waiting += m.retired_waiting;
    if (waiting == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return r;
}

phase_result bare_load(harness& h) {
  std::vector<std::pair<member*, CUmodule>> loaded;
  const auto& cu = cubridge::driver::api();
  phase_result r = h.run_phase("bare-load", h.opt.cycles, [&](phase_result& out) {
    for (std::uint64_t k = 0; k < h.opt.cycles && !h.swapper_should_stop(out); ++k) {
      const auto& image = h.cubins[(k + 1) % image_count];
      const auto t0 = now_ns();
      bool ok = true;
      for (auto& mb : h.members) {
        cubridge::scoped_current current(mb->ctx);
        CUmodule module = nullptr;
        const auto rc = cu.cuModuleLoadDataEx(&module, image.data(), 0, nullptr, nullptr);
        if (rc == CUDA_SUCCESS) {
          loaded.emplace_back(mb.get(), module);
        } else {
          out.failure("cuModuleLoadData on device " + std::to_string(mb->device) + ": CUresult " +
                      std::to_string(rc));
          ok = false;
        }
      }
      out.op("load").samples_us.push_back(us_between(t0, now_ns()));
      out.cycles_done += ok ? 1 : 0;
      pause(h);
    }
  });
  for (const auto& [mb, module] : loaded) {
    cubridge::scoped_current current(mb->ctx);
    check(cu.cuModuleUnload(module), "cuModuleUnload (bare-load, after the phase)");
  }
  return r;
}

/// group-swap max gap / bare-load max gap; 1 when neither left the GPU idle.
double gap_ratio(const member_result& swap, const member_result& bare) {
  if (swap.gap_us.max == 0 && bare.gap_us.max == 0) return 1.0;
  return swap.gap_us.max / bare.gap_us.max;
}

/// A table row: `name` left-aligned in 12 characters, then the cells right-aligned in `width`.
void print_row(const std::string& name, std::initializer_list<std::string> cells,
               std::string tail = {}, int width = 10) {
  std::printf("  %-12s", name.c_str());
  for (const auto& c : cells) std::printf("%*s", width, c.c_str());
  std::printf("%s\n", tail.c_str());
}

void print_report(const harness& h, const std::vector<phase_result>& phases) {
  using std::to_string;
  for (std::size_t m = 0; m < h.members.size(); ++m) {
    std::printf("member %zu (device %d), GPU gaps and launch latency in us:\n", m,
                h.members[m]->device);
    print_row("phase",
              {"launches", "failed", "wrong tag", "steps", "gap p99", "gap max", "lat p99"});
    for (const auto& p : phases) {
      const auto& r = p.members[m];
      print_row(p.name,
                {to_string(r.launches), to_string(r.checks.failed), to_string(r.checks.wrong_code),
                 to_string(r.step_launches), format_number(r.gap_us.p99),
                 format_number(r.gap_us.max), format_number(r.latency_us.p99)});
      for (const auto& e : r.checks.examples) std::printf("      %s\n", e.c_str());
    }
    const double ratio = gap_ratio(phases[1].members[m], phases[2].members[m]);
    std::printf("  target: group-swap max gap / bare-load max gap = %sx <= %sx: %s\n",
                format_number(ratio).c_str(), format_number(target_limit).c_str(),
                ratio <= target_limit ? "MET" : "NOT MET");
  }
  std::printf("all members (thread %u in examples: the step thread; swapper op us p50/p99/max):\n",
              h.step_thread());
  print_row("phase", {"window s", "cycles", "steps", "mixed", "missing", "stale", "failures"});
  for (const auto& p : phases) {
    std::uint64_t missing = 0, stale = 0;
    for (const auto& r : p.members) {
      missing += r.checks.missing_record;
      stale += r.checks.stale_after_promote;
    }
    std::string tail = p.time_limited ? "  [cut short: --max-phase-s]" : "";
    if (p.log_full) tail += "  [log full: raise --log-slots]";
    for (const auto& op : p.ops)
      tail += "  " + op.name + " " + format_number(op.us.p50) + "/" + format_number(op.us.p99) +
              "/" + format_number(op.us.max);
    print_row(p.name,
              {format_number(us_between(p.begin_ns, p.end_ns) / 1e6), to_string(p.cycles_done),
               to_string(p.steps), to_string(p.mixed_steps), to_string(missing), to_string(stale),
               to_string(p.swapper_failures)},
              tail);
    for (const auto& e : p.errors) std::printf("      error: %s\n", e.c_str());
  }
}

json to_json(const harness& h, const phase_result& p) {
  json members = json::array();
  for (std::size_t m = 0; m < p.members.size(); ++m) {
    const auto& r = p.members[m];
    members.push_back({{"member", m},
                       {"device", h.members[m]->device},
                       {"launches", r.launches},
                       {"step_launches", r.step_launches},
                       {"failed_launches", r.checks.failed},
                       {"wrong_tags", r.checks.wrong_code},
                       {"missing_records", r.checks.missing_record},
                       {"old_version_after_promote", r.checks.stale_after_promote},
                       {"examples", r.checks.examples},
                       {"gpu_gap_us", hotswap::to_json(r.gap_us)},
                       {"launch_latency_us", hotswap::to_json(r.latency_us)}});
  }
  json ops = json::object();
  for (const auto& op : p.ops) ops[op.name] = hotswap::to_json(op.us);
  return {{"phase", p.name},
          {"window_s", us_between(p.begin_ns, p.end_ns) / 1e6},
          {"cycles_requested", p.cycles_requested},
          {"cycles_done", p.cycles_done},
          {"time_limited", p.time_limited},
          {"log_full", p.log_full},
          {"pinned_steps", p.steps},
          {"mixed_steps", p.mixed_steps},
          {"swapper_failures", p.swapper_failures},
          {"must_be_zero_total", p.must_be_zero()},
          {"ops_us", ops},
          {"errors", p.errors},
          {"members", members}};
}

json make_report(const harness& h, const std::vector<phase_result>& phases, bool failed);

int run(const options& opt) {
  const auto dir = hotswap::find_serve_image_dir(opt.images_dir, CUBRIDGE_SERVE_IMAGE_DIR);
  std::vector<std::vector<std::byte>> cubins;
  for (int v = 1; v <= image_count; ++v)
    cubins.push_back(hotswap::read_image(dir / ("serve_v" + std::to_string(v) + ".sm_90.cubin")));
  const int count = opt.devices ? opt.devices : opt.contexts;
  std::vector<std::unique_ptr<member>> members;
  std::vector<cubridge::context_arg> contexts;
  for (int i = 0; i < count; ++i) {
    members.push_back(std::make_unique<member>(cubridge::device::get(opt.devices ? i : 0), opt));
    members.back()->clear_log();
    contexts.emplace_back(members.back()->ctx);
  }
  auto group = cubridge::hot_module_group::load("serve", contexts, cubins[0]);
  harness h(opt, cubins, members, group);
  const auto dev = cubridge::device::get(0);
  std::printf("%s: %d members (%s), %s, driver %d; kernels %s us, depth %u; %llu cycles\n\n", tool,
              count, opt.devices ? "one per device" : "contexts of device 0", dev.name().c_str(),
              cubridge::driver::version(), format_number(opt.spin_us).c_str(), opt.depth,
              static_cast<unsigned long long>(opt.cycles));
  std::fflush(stdout);
  warm_up(h);
  std::vector<phase_result> phases;
  phases.push_back(steady(h));
  phases.push_back(group_swap(h));
  phases.push_back(bare_load(h));
  print_report(h, phases);
  bool failed = false;
  for (const auto& p : phases) failed = failed || p.failed();
  if (!opt.json_path.empty()) {
    std::ofstream file(opt.json_path, std::ios::trunc);
    file << make_report(h, phases, failed).dump(2) << "\n";
    if (!file) throw std::runtime_error("cannot write " + opt.json_path);
  }
  std::printf("%s: must-be-zero checks %s\n", tool, failed ? "FAILED" : "all 0");
  return failed ? 1 : 0;
}

json make_report(const harness& h, const std::vector<phase_result>& phases, bool failed) {
  const auto& opt = h.opt;
  json report = {{"tool", tool},
                 {"device", cubridge::device::get(0).name()},
                 {"driver_version", cubridge::driver::version()},
                 {"members", opt.devices ? "devices" : "contexts of device 0"},
                 {"member_count", h.members.size()},
                 {"config",
                  {{"cycles", opt.cycles},
                   {"swap_pause_us", opt.swap_pause_us},
                   {"steady_ms", opt.steady_ms},
                   {"spin_us", opt.spin_us},
                   {"depth", opt.depth},
                   {"log_slots", opt.log_slots},
                   {"max_phase_s", opt.max_phase_s}}},
                 {"phases", json::array()},
                 {"gap_ratio", json::array()}};
  for (const auto& p : phases) report["phases"].push_back(to_json(h, p));
  for (std::size_t m = 0; m < h.members.size(); ++m) {
    const double ratio = gap_ratio(phases[1].members[m], phases[2].members[m]);
    report["gap_ratio"].push_back(
        {{"member", m},
         {"group_swap_over_bare_load_max_gap", hotswap::finite_or_null(ratio)},
         {"target", target_limit},
         {"met", ratio <= target_limit}});
  }
  report["must_be_zero_ok"] = !failed;
  return report;
}

}  // namespace

int main(int argc, char** argv) {
  options opt;
  if (const auto stop = parse(argc, argv, opt)) return *stop;
  if (const auto reason = no_gpu_reason(opt)) {
    std::printf("%s: no GPU: %s\n", tool, reason->c_str());
    return 77;
  }
  try {
    return run(opt);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", tool, e.what());
    return 3;
  }
}
