#include "stats.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <sstream>

namespace hotswap {

double percentile_sorted(std::span<const double> sorted, double p) {
  if (sorted.empty()) return not_a_number;
  if (std::isnan(p)) return not_a_number;
  p = std::clamp(p, 0.0, 100.0);
  const double rank = p / 100.0 * static_cast<double>(sorted.size() - 1);
  const auto below = static_cast<std::size_t>(std::floor(rank));
  if (below + 1 >= sorted.size()) return sorted.back();
  const double fraction = rank - static_cast<double>(below);
  return sorted[below] + fraction * (sorted[below + 1] - sorted[below]);
}

summary summarize(std::vector<double> values) {
  summary s;
  s.count = values.size();
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  s.min = values.front();
  s.max = values.back();
  s.p50 = percentile_sorted(values, 50);
  s.p99 = percentile_sorted(values, 99);
  s.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  return s;
}

gap_report analyze_gaps(std::vector<kernel_span> kernels) {
  gap_report r;
  if (kernels.empty()) return r;
  std::sort(kernels.begin(), kernels.end(), [](const kernel_span& a, const kernel_span& b) {
    return a.start_ns != b.start_ns ? a.start_ns < b.start_ns : a.end_ns < b.end_ns;
  });
  r.gaps_ns.reserve(kernels.size() - 1);
  std::uint64_t covered = std::max(kernels.front().start_ns, kernels.front().end_ns);
  for (std::size_t i = 1; i < kernels.size(); ++i) {
    const auto& k = kernels[i];
    if (k.start_ns > covered) {
      const auto hole = k.start_ns - covered;
      r.gaps_ns.push_back(static_cast<double>(hole));
      r.holes.push_back({covered, k.start_ns});
      r.idle_ns += static_cast<double>(hole);
    } else {
      r.gaps_ns.push_back(0.0);
    }
    covered = std::max(covered, std::max(k.start_ns, k.end_ns));
  }
  r.span_ns = static_cast<double>(covered - kernels.front().start_ns);
  return r;
}

clock_map::clock_map(const clock_sample& only)
    : host0_(only.host_ns),
      offset0_(static_cast<std::int64_t>(only.gpu_ns) - only.host_ns),
      uncertainty_ns_(only.uncertainty_ns) {}

clock_map::clock_map(const clock_sample& before, const clock_sample& after) : clock_map(before) {
  uncertainty_ns_ = std::max(before.uncertainty_ns, after.uncertainty_ns);
  if (after.host_ns == before.host_ns) return;
  const auto offset1 = static_cast<std::int64_t>(after.gpu_ns) - after.host_ns;
  slope_ =
      static_cast<double>(offset1 - offset0_) / static_cast<double>(after.host_ns - before.host_ns);
}

std::int64_t clock_map::gpu_from_host(std::int64_t host_ns) const {
  const double offset =
      static_cast<double>(offset0_) + slope_ * static_cast<double>(host_ns - host0_);
  return host_ns + static_cast<std::int64_t>(std::llround(offset));
}

std::int64_t clock_map::host_from_gpu(std::uint64_t gpu_ns) const {
  // gpu = h + offset0 + slope * (h - host0)  =>  h = (gpu - offset0 + slope * host0) / (1 + slope)
  const auto g = static_cast<std::int64_t>(gpu_ns);
  const double shifted = static_cast<double>(g - offset0_ - host0_);
  return host0_ + static_cast<std::int64_t>(std::llround(shifted / (1.0 + slope_)));
}

clock_check check_clock(std::span<const launch_entry> launches, std::span<const gpu_record> log,
                        const clock_map& clocks, std::int64_t tolerance_ns) {
  clock_check c;
  for (const auto& e : launches) {
    if (e.failed || e.slot >= log.size() || log[e.slot].tag == 0) continue;
    const auto& r = log[e.slot];
    ++c.checked;
    const auto start = clocks.host_from_gpu(r.start_ns);
    const double lead = static_cast<double>(start - e.host_start_ns) / 1e3;
    if (start < e.host_start_ns - tolerance_ns) ++c.start_before_launch;
    if (std::isnan(c.min_launch_to_start_us) || lead < c.min_launch_to_start_us)
      c.min_launch_to_start_us = lead;
    if (e.host_done_ns != 0) {
      const auto end = clocks.host_from_gpu(r.end_ns);
      const double lag = static_cast<double>(e.host_done_ns - end) / 1e3;
      if (end > e.host_done_ns + tolerance_ns) ++c.end_after_done;
      if (std::isnan(c.min_end_to_done_us) || lag < c.min_end_to_done_us)
        c.min_end_to_done_us = lag;
    }
  }
  return c;
}

window_set::window_set(std::vector<std::pair<std::int64_t, std::int64_t>> windows) {
  for (auto& w : windows)
    if (w.second < w.first) std::swap(w.first, w.second);
  std::sort(windows.begin(), windows.end());
  for (const auto& w : windows) {
    if (!merged_.empty() && w.first <= merged_.back().second)
      merged_.back().second = std::max(merged_.back().second, w.second);
    else
      merged_.push_back(w);
  }
}

bool window_set::overlaps(std::int64_t begin, std::int64_t end) const {
  if (end < begin) std::swap(begin, end);
  // First window that ends at or after `begin`; it overlaps if it starts at or before `end`.
  auto it = std::lower_bound(merged_.begin(), merged_.end(), begin,
                             [](const auto& w, std::int64_t t) { return w.second < t; });
  return it != merged_.end() && it->first <= end;
}

std::unordered_map<std::uint64_t, std::int64_t> unload_bounds(
    std::span<const chain_sample> samples) {
  std::unordered_map<std::uint64_t, std::int64_t> bounds;
  std::uint64_t covered = 0;  // every id <= covered has a bound
  for (const auto& s : samples) {
    if (s.retired_waiting != 0 || s.current_id < 3) continue;
    const auto retired_up_to = s.current_id - 2;
    for (auto id = covered + 1; id <= retired_up_to; ++id) bounds.emplace(id, s.host_ns);
    covered = std::max(covered, retired_up_to);
  }
  return bounds;
}

check_counts check_launches(std::span<const launch_entry> launches, std::span<const gpu_record> log,
                            const version_facts& facts, std::size_t max_examples) {
  check_counts c;
  auto example = [&](const launch_entry& e, const std::string& what) {
    if (c.examples.size() >= max_examples) return;
    c.examples.push_back("thread " + std::to_string(e.thread) + " slot " + std::to_string(e.slot) +
                         " version " + std::to_string(e.returned_id) + ": " + what);
  };
  for (const auto& e : launches) {
    ++c.launches;
    if (e.failed) {
      ++c.failed;
      example(e, "launch failed");
      continue;
    }
    if (e.slot >= log.size() || log[e.slot].tag == 0) {
      ++c.missing_record;
      example(e, "its kernel never wrote its log slot");
      continue;
    }
    const auto& r = log[e.slot];
    const auto tag = facts.tag_of.find(e.returned_id);
    if (tag == facts.tag_of.end()) {
      ++c.wrong_code;
      example(e, "launch() returned a version id the harness never loaded");
    } else if (tag->second != r.tag) {
      ++c.wrong_code;
      example(e, "ran the code of image v" + std::to_string(r.tag) + ", the version is image v" +
                     std::to_string(tag->second));
    }
    const auto bound = facts.unloaded_by_gpu_ns.find(e.returned_id);
    if (bound != facts.unloaded_by_gpu_ns.end() &&
        static_cast<std::int64_t>(r.start_ns) > bound->second) {
      ++c.ran_after_unload;
      example(e,
              "started on the GPU " +
                  std::to_string((static_cast<std::int64_t>(r.start_ns) - bound->second) / 1000) +
                  " us after its version was unloaded");
    }
    if (e.returned_id < e.promoted_before) {
      ++c.stale_after_promote;
      example(e, "began after version " + std::to_string(e.promoted_before) +
                     " was promoted, ran the older version");
    }
  }
  return c;
}

verdict judge(const phase_result& steady, const phase_result& swap, const phase_result& bare,
              double limit) {
  verdict v;
  if (bare.gap_us.max == 0 && swap.gap_us.max == 0) {
    v.gap_ratio = 1.0;  // neither left the GPU idle at all
  } else {
    v.gap_ratio = swap.gap_us.max / bare.gap_us.max;  // NaN / inf when unknown or bare had none
  }
  v.latency_ratio = swap.latency_us.p99 / steady.latency_us.p99;
  v.gap_met = !std::isnan(v.gap_ratio) && v.gap_ratio <= limit;
  v.latency_met = !std::isnan(v.latency_ratio) && v.latency_ratio <= limit;
  return v;
}

std::string format_number(double value) {
  if (std::isnan(value)) return "-";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[64];
  const double magnitude = std::fabs(value);
  if (value == 0)
    return "0";
  else if (magnitude >= 100)
    std::snprintf(buffer, sizeof buffer, "%.0f", value);
  else if (magnitude >= 10)
    std::snprintf(buffer, sizeof buffer, "%.1f", value);
  else
    std::snprintf(buffer, sizeof buffer, "%.2f", value);
  return buffer;
}

namespace {

std::string pad(const std::string& s, std::size_t width, bool left = false) {
  if (s.size() >= width) return s;
  const std::string fill(width - s.size(), ' ');
  return left ? s + fill : fill + s;
}

std::string triple(const summary& s) {
  return format_number(s.p50) + " / " + format_number(s.p99) + " / " + format_number(s.max);
}

const phase_result* find_phase(std::span<const phase_result> phases, const std::string& name) {
  for (const auto& p : phases)
    if (p.name == name) return &p;
  return nullptr;
}

}  // namespace

std::string format_report(std::span<const phase_result> phases, double limit) {
  std::ostringstream out;
  if (phases.empty()) return {};
  const int threads = phases.front().threads;
  out << "== " << threads << " serving thread" << (threads == 1 ? "" : "s") << "\n";
  constexpr std::size_t name_w = 12, col_w = 26, num_w = 10;
  out << pad("phase", name_w, true) << pad("window s", num_w) << pad("launches", num_w)
      << pad("launch/s", num_w) << pad("GPU gap us p50/p99/max", col_w) << pad("idle %", 8)
      << pad("latency us p50/p99/max", col_w) << "\n";
  for (const auto& p : phases) {
    out << pad(p.name, name_w, true) << pad(format_number(p.window_s), num_w)
        << pad(std::to_string(p.launches_in_window), num_w)
        << pad(format_number(p.launches_per_s), num_w) << pad(triple(p.gap_us), col_w)
        << pad(format_number(p.idle_fraction * 100), 8) << pad(triple(p.latency_us), col_w) << "\n";
  }
  out << "  during swapper operations only (gap: holes overlapping one; latency: launches "
         "overlapping one):\n";
  for (const auto& p : phases) {
    if (p.ops.empty()) continue;
    out << "  " << pad(p.name, name_w, true) << " gap us " << triple(p.gap_in_ops_us) << " ("
        << p.gap_in_ops_us.count << " holes)   latency us " << triple(p.latency_in_ops_us) << " ("
        << p.latency_in_ops_us.count << " launches)\n";
  }
  out << "  swapper operations, us p50 / p99 / max (count):\n";
  for (const auto& p : phases) {
    for (const auto& op : p.ops)
      out << "  " << pad(p.name, name_w, true) << " " << pad(op.name, 13, true) << " "
          << triple(op.us) << " (" << op.us.count << ")\n";
    if (p.cycles_requested)
      out << "  " << pad(p.name, name_w, true) << " cycles " << p.cycles_done << " of "
          << p.cycles_requested << (p.time_limited ? "  [cut short: --max-phase-s]" : "") << "\n";
    if (p.log_full)
      out << "  " << pad(p.name, name_w, true) << " log full after " << p.launches_total
          << " launches: the phase was cut short (raise --log-slots)\n";
  }
  out << "  must be 0 (failed launches | missing records | ran retired version [wrong code + after"
         " unload] | old version after promote | swapper failures):\n";
  for (const auto& p : phases) {
    const auto& c = p.checks;
    out << "  " << pad(p.name, name_w, true) << " " << c.failed << " | " << c.missing_record
        << " | " << c.ran_retired() << " [" << c.wrong_code << " + " << c.ran_after_unload << "] | "
        << c.stale_after_promote << " | " << p.cycles_failed
        << (p.gated ? "" : "   (reference, not gated)")
        << ((c.must_be_zero_total() + p.cycles_failed) && p.gated ? "   <-- FAIL" : "") << "\n";
    for (const auto& e : c.examples) out << "      " << e << "\n";
    for (const auto& e : p.errors) out << "      error: " << e << "\n";
  }
  out << "  clock map (GPU %globaltimer -> host): drift ppm | tolerance us | kernels mapped before"
         " their launch | after their completion | min launch->start us | min end->done us:\n";
  for (const auto& p : phases) {
    const auto& k = p.clock;
    out << "  " << pad(p.name, name_w, true) << " " << format_number(p.clock_drift_ppm) << " | "
        << format_number(p.clock_tolerance_us) << " | " << k.start_before_launch << " | "
        << k.end_after_done << " | " << format_number(k.min_launch_to_start_us) << " | "
        << format_number(k.min_end_to_done_us)
        << (k.violations() ? "   <-- clock map suspect: after-unload counts and gaps during"
                             " operations unreliable"
                           : "")
        << "\n";
  }
  const auto* steady = find_phase(phases, "steady");
  const auto* swap = find_phase(phases, "hot-swap");
  const auto* bare = find_phase(phases, "bare-load");
  if (steady && swap && bare) {
    const auto v = judge(*steady, *swap, *bare, limit);
    out << "  target: max GPU gap during swaps <= " << format_number(limit)
        << "x bare cubin load: " << format_number(swap->gap_us.max) << " us vs "
        << format_number(bare->gap_us.max) << " us = " << format_number(v.gap_ratio) << "x  "
        << (v.gap_met ? "MET" : "NOT MET") << "\n";
    out << "  target: p99 launch latency during swaps <= " << format_number(limit)
        << "x steady: " << format_number(swap->latency_us.p99) << " us vs "
        << format_number(steady->latency_us.p99) << " us = " << format_number(v.latency_ratio)
        << "x  " << (v.latency_met ? "MET" : "NOT MET") << "\n";
  }
  // A swap loads one module and unloads another: the driver's own cost of that pair, side by side.
  if (const auto* pair = find_phase(phases, "bare-load+unload"); pair && swap)
    out << "  reference: bare cubin load + unload (the driver's cost of a swap): max GPU gap "
        << format_number(swap->gap_us.max) << " us vs " << format_number(pair->gap_us.max)
        << " us = " << format_number(swap->gap_us.max / pair->gap_us.max)
        << "x; p99 launch latency " << format_number(swap->latency_us.p99) << " us vs "
        << format_number(pair->latency_us.p99)
        << " us = " << format_number(swap->latency_us.p99 / pair->latency_us.p99) << "x\n";
  if (const auto* naive = find_phase(phases, "naive-ptx"); naive && swap)
    out << "  reference: naive PTX load + unload max GPU gap " << format_number(naive->gap_us.max)
        << " us, p99 latency " << format_number(naive->latency_us.p99) << " us\n";
  return out.str();
}

}  // namespace hotswap
