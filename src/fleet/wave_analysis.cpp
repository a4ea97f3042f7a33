// The canary-against-baseline analysis of a wave (wave_analysis.hpp).
#include <cubridge/fleet/wave_analysis.hpp>

#include <cstdio>
#include <optional>

namespace cubridge::fleet {
namespace {

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", value);
  return text;
}

// A fraction of the nodes (sticky errors, unhealthy probes) on each side, and the first canary
// that has it.
struct share {
  double fraction = 0;
  std::string first;
};

template <class Has>
share share_of(std::span<const health_sample> samples, Has has) {
  share s;
  std::size_t count = 0;
  for (const auto& sample : samples)
    if (has(sample.health)) {
      if (count++ == 0) s.first = sample.node;
    }
  if (!samples.empty())
    s.fraction = static_cast<double>(count) / static_cast<double>(samples.size());
  return s;
}

const health_sample* find(std::span<const health_sample> samples, std::string_view node) {
  for (const auto& s : samples)
    if (s.node == node) return &s;
  return nullptr;
}

// Failures per launch; nullopt with no launch.
std::optional<double> rate(std::uint64_t failures, std::uint64_t launches) {
  if (launches == 0) return std::nullopt;
  return static_cast<double>(failures) / static_cast<double>(launches);
}

std::optional<double> mean_of(std::span<const health_sample> samples, std::string_view metric) {
  double sum = 0;
  std::size_t n = 0;
  for (const auto& s : samples)
    if (const auto it = s.health.values.find(metric); it != s.health.values.end()) {
      sum += it->second;
      ++n;
    }
  if (n == 0) return std::nullopt;
  return sum / static_cast<double>(n);
}

// The canary that reports the highest value of `metric`.
std::string worst_for(std::span<const health_sample> samples, std::string_view metric) {
  std::string node;
  double worst = 0;
  for (const auto& s : samples)
    if (const auto it = s.health.values.find(metric);
        it != s.health.values.end() && (node.empty() || it->second > worst)) {
      node = s.node;
      worst = it->second;
    }
  return node;
}

// What the signals below share: the verdict they add to, the first failure kept.
struct judging {
  std::span<const health_sample> canaries, baseline;
  wave_verdict& v;
  std::string against;  // " against 3 baseline node(s) at ", or "(no node on the old version...)"

  void fail(std::string node, std::string signal, std::string reason) const {
    if (v.failed) return;
    v.failed = true;
    v.node = std::move(node);
    v.signal = std::move(signal);
    v.reason = std::move(reason);
  }
  [[nodiscard]] std::string baseline_text(const std::string& value) const {
    return against + (baseline.empty() ? "" : value);
  }
};

// A context poisoned on a canary: its service can no longer use the GPU.
void judge_sticky(const judging& j) {
  const auto has = [](const module_health& h) { return !h.sticky_error.empty(); };
  const auto c = share_of(j.canaries, has);
  const auto b = share_of(j.baseline, has);
  j.v.canary["sticky"] = c.fraction;
  j.v.baseline["sticky"] = b.fraction;
  if (c.fraction > b.fraction)
    j.fail(c.first, "sticky_error",
           "canary " + c.first + " has a sticky CUDA error (" +
               find(j.canaries, c.first)->health.sticky_error + "): " + number(c.fraction * 100) +
               "% of canaries" + j.baseline_text(number(b.fraction * 100) + "%"));
}

// The service's own probe.
void judge_probe(const judging& j) {
  const auto unhealthy = [](const module_health& h) { return !h.healthy; };
  const auto c = share_of(j.canaries, unhealthy);
  const auto b = share_of(j.baseline, unhealthy);
  j.v.canary["unhealthy"] = c.fraction;
  j.v.baseline["unhealthy"] = b.fraction;
  if (c.fraction <= b.fraction) return;
  const auto& h = find(j.canaries, c.first)->health;
  std::string values;
  for (const auto& [name, value] : h.values) {
    if (!values.empty()) values += ", ";
    values += name;
    values += '=';
    values += number(value);
  }
  j.fail(c.first, "probe",
         "canary " + c.first + "'s health probe says unhealthy" +
             (h.detail.empty() ? "" : " (" + h.detail + ")") +
             (values.empty() ? "" : " [" + values + "]") + ": " + number(c.fraction * 100) +
             "% of canaries unhealthy" + j.baseline_text(number(b.fraction * 100) + "%"));
}

// Launch failures per launch: the candidate's counts on the canaries, the window's on the
// baseline.
void judge_failure_rate(const judging& j,
                        const std::map<std::string, counter_mark, std::less<>>& baseline_start,
                        double limit) {
  std::uint64_t launches = 0, failures = 0, base_launches = 0, base_failures = 0;
  std::string worst_node;
  double worst_rate = -1;
  for (const auto& c : j.canaries) {
    launches += c.health.launches;
    failures += c.health.launch_failures;
    if (const auto r = rate(c.health.launch_failures, c.health.launches); r && *r > worst_rate) {
      worst_rate = *r;
      worst_node = c.node;
    }
  }
  for (const auto& b : j.baseline) {
    counter_mark start;
    if (const auto it = baseline_start.find(b.node);
        it != baseline_start.end() && it->second.launches <= b.health.launches &&
        it->second.failures <= b.health.launch_failures)
      start = it->second;
    base_launches += b.health.launches - start.launches;
    base_failures += b.health.launch_failures - start.failures;
  }
  const auto canary_rate = rate(failures, launches);
  const auto base_rate = rate(base_failures, base_launches);
  if (canary_rate) j.v.canary["failure_rate"] = *canary_rate;
  if (base_rate) j.v.baseline["failure_rate"] = *base_rate;
  if (limit >= 0 && canary_rate && *canary_rate > limit && !(base_rate && *base_rate > limit))
    j.fail(worst_node, "failure_rate",
           "canary launch failure rate " + number(*canary_rate) + " (" + std::to_string(failures) +
               " of " + std::to_string(launches) + ") is over " + number(limit) +
               j.baseline_text(base_rate ? number(*base_rate) : std::string("no launch")));
}

// The probe's named values, on average.
void judge_metrics(const judging& j, const std::map<std::string, double, std::less<>>& limits) {
  for (const auto& [metric, limit] : limits) {
    const std::string key = "metric:" + metric;
    const auto canary_mean = mean_of(j.canaries, metric);
    const auto base_mean = mean_of(j.baseline, metric);
    if (canary_mean) j.v.canary[key] = *canary_mean;
    if (base_mean) j.v.baseline[key] = *base_mean;
    if (canary_mean && *canary_mean > limit && !(base_mean && *base_mean > limit))
      j.fail(worst_for(j.canaries, metric), key,
             "canary " + metric + " " + number(*canary_mean) + " on average is over " +
                 number(limit) + j.baseline_text(base_mean ? number(*base_mean) : "none"));
  }
}

}  // namespace

wave_verdict analyse_wave(std::span<const health_sample> canaries,
                          std::span<const health_sample> baseline,
                          const std::map<std::string, counter_mark, std::less<>>& baseline_start,
                          const health_limits& limits) {
  wave_verdict v;
  const judging j{canaries, baseline, v,
                  baseline.empty()
                      ? " (no node on the old version to compare with)"
                      : " against " + std::to_string(baseline.size()) + " baseline node(s) at "};
  judge_sticky(j);
  judge_probe(j);
  judge_failure_rate(j, baseline_start, limits.max_failure_rate);
  judge_metrics(j, limits.max_metrics);
  return v;
}

}  // namespace cubridge::fleet
