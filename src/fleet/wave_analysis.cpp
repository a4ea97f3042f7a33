// The canary-against-baseline analysis of a wave (wave_analysis.hpp).
#include <cubridge/fleet/wave_analysis.hpp>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <optional>

namespace cubridge::fleet {
namespace {

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", value);
  return text;
}

// The median of `values` (the mean of the middle two for an even count); nullopt for none.
std::optional<double> median(std::vector<double> values) {
  if (values.empty()) return std::nullopt;
  std::sort(values.begin(), values.end());
  const auto n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// A fraction of the nodes (sticky errors, unhealthy probes) on one side, the first node that
// has it, and every node that has it.
struct share {
  double fraction = 0;
  std::string first;
  std::vector<std::string> nodes;
};

template <class Has>
share share_of(std::span<const health_sample> samples, Has has) {
  share s;
  for (const auto& sample : samples)
    if (has(sample)) s.nodes.push_back(sample.node);
  if (!s.nodes.empty()) s.first = s.nodes.front();
  if (!samples.empty())
    s.fraction = static_cast<double>(s.nodes.size()) / static_cast<double>(samples.size());
  return s;
}

// The baseline's share with its baseline_trim() worst nodes left out: one node that always says
// "unhealthy" moves it by nothing.
double trimmed_fraction(const share& s, std::size_t count) {
  const auto trim = baseline_trim(count);
  if (count <= trim) return 0;
  const auto kept = s.nodes.size() > trim ? s.nodes.size() - trim : 0;
  return static_cast<double>(kept) / static_cast<double>(count - trim);
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

std::string joined(const std::vector<std::string>& nodes) {
  std::string out;
  for (const auto& n : nodes) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// What the signals below share: the verdict they add to, the first failure kept.
struct judging {
  std::span<const health_sample> canaries, baseline;
  wave_verdict& v;
  bool baseline_breach_halts = true;
  std::string against;  // " against 3 baseline node(s) at ", or "(no node on the old version...)"

  void fail(std::string node, halt_signal signal, std::string reason,
            std::string metric = {}) const {
    if (v.failed) return;
    v.failed = true;
    v.node = std::move(node);
    v.signal = signal;
    v.metric = std::move(metric);
    v.reason = std::move(reason);
  }
  [[nodiscard]] std::string baseline_text(const std::string& value) const {
    return against + (baseline.empty() ? "" : value);
  }
  // The baseline breached `signal` on its own (its median node): noted, and the rollout halted
  // for review unless the limits bake on through a fleet-wide dip.
  void baseline_breached(const std::string& figure, const std::vector<std::string>& nodes,
                         const std::string& figures) const {
    for (const auto& n : nodes)
      if (std::find(v.baseline_breaching.begin(), v.baseline_breaching.end(), n) ==
          v.baseline_breaching.end())
        v.baseline_breaching.push_back(n);
    if (!baseline_breach_halts) return;
    fail(nodes.empty() ? std::string() : nodes.front(), halt_signal::baseline_unhealthy,
         "the baseline is unhealthy (" + figure + ": " + figures + "): nodes " + joined(nodes) +
             "; halted for review, since the canaries cannot be judged against it");
  }
};

// The nodes of `samples` whose own figure breaches: value(sample) > limit.
template <class Value>
std::vector<std::string> breaching(std::span<const health_sample> samples, Value value,
                                   double limit) {
  std::vector<std::string> out;
  for (const auto& s : samples)
    if (const auto x = value(s); x && *x > limit) out.push_back(s.node);
  return out;
}

// A share signal (sticky errors, unhealthy probes): the canaries fail it when their share is
// above the baseline's trimmed share; the baseline breaches when more than half of it has it.
template <class Has>
void judge_share(const judging& j, const std::string& figure, Has has, halt_signal signal,
                 const std::function<std::string(const share&, double, double)>& describe) {
  const auto c = share_of(j.canaries, has);
  const auto b = share_of(j.baseline, has);
  const double base = trimmed_fraction(b, j.baseline.size());
  j.v.canary[figure] = c.fraction;
  j.v.baseline[figure] = base;
  const bool baseline_breaches = b.fraction > 0.5;
  if (baseline_breaches)
    j.baseline_breached(std::string(to_string(signal)), b.nodes,
                        std::to_string(b.nodes.size()) + " of " +
                            std::to_string(j.baseline.size()) + " baseline node(s)");
  if (c.fraction > base && !baseline_breaches)
    j.fail(c.first, signal, describe(c, c.fraction, base));
}

// A context poisoned on a canary, or its whole process (its heartbeat says so even when no
// launch of the module saw the error): its service can no longer use the GPU.
bool sticky(const health_sample& s) {
  return !s.health.sticky_error.empty() || s.poisoned.has_value();
}

std::string sticky_text(const health_sample& s) {
  if (!s.health.sticky_error.empty())
    return "has a sticky CUDA error (" + s.health.sticky_error + ")";
  return "is poisoned (" + (s.poisoned->error.empty() ? "a sticky CUDA error" : s.poisoned->error) +
         (s.poisoned->call.empty() ? "" : " seen by " + s.poisoned->call) + ")";
}

void judge_sticky(const judging& j) {
  judge_share(j, "sticky", sticky, halt_signal::sticky_error,
              [&j](const share& c, double canary, double base) {
                return "canary " + c.first + " " + sticky_text(*find(j.canaries, c.first)) + ": " +
                       number(canary * 100) + "% of canaries" +
                       j.baseline_text(number(base * 100) + "%");
              });
}

// The service's own probe.
void judge_probe(const judging& j) {
  judge_share(
      j, "unhealthy", [](const health_sample& s) { return !s.health.healthy; }, halt_signal::probe,
      [&j](const share& c, double canary, double base) {
        const auto& h = find(j.canaries, c.first)->health;
        std::string values;
        for (const auto& [name, value] : h.values) {
          if (!values.empty()) values += ", ";
          values += name;
          values += '=';
          values += number(value);
        }
        return "canary " + c.first + "'s health probe says unhealthy" +
               (h.detail.empty() ? "" : " (" + h.detail + ")") +
               (values.empty() ? "" : " [" + values + "]") + ": " + number(canary * 100) +
               "% of canaries unhealthy" + j.baseline_text(number(base * 100) + "%");
      });
}

// A baseline node's launches and failures over the window.
counter_mark window_of(const health_sample& b,
                       const std::map<std::string, counter_mark, std::less<>>& baseline_start) {
  counter_mark start;
  if (const auto it = baseline_start.find(b.node); it != baseline_start.end() &&
                                                   it->second.launches <= b.health.launches &&
                                                   it->second.failures <= b.health.launch_failures)
    start = it->second;
  return {b.health.launches - start.launches, b.health.launch_failures - start.failures};
}

// Launch failures per launch: the candidate's counts on the canaries (pooled), the window's on
// the baseline (the median node's rate).
void judge_failure_rate(const judging& j,
                        const std::map<std::string, counter_mark, std::less<>>& baseline_start,
                        double limit) {
  std::uint64_t launches = 0, failures = 0;
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
  const auto node_rate = [&](const health_sample& b) {
    const auto w = window_of(b, baseline_start);
    return rate(w.failures, w.launches);
  };
  std::vector<double> rates;
  for (const auto& b : j.baseline)
    if (const auto r = node_rate(b)) rates.push_back(*r);
  const auto canary_rate = rate(failures, launches);
  const auto base_rate = median(rates);
  if (canary_rate) j.v.canary["failure_rate"] = *canary_rate;
  if (base_rate) j.v.baseline["failure_rate"] = *base_rate;
  if (limit < 0) return;
  const bool baseline_breaches = base_rate && *base_rate > limit;
  if (baseline_breaches)
    j.baseline_breached("failure_rate", breaching(j.baseline, node_rate, limit),
                        "median node " + number(*base_rate) + " over " + number(limit));
  if (canary_rate && *canary_rate > limit && !baseline_breaches)
    j.fail(worst_node, halt_signal::failure_rate,
           "canary launch failure rate " + number(*canary_rate) + " (" + std::to_string(failures) +
               " of " + std::to_string(launches) + ") is over " + number(limit) +
               j.baseline_text(base_rate ? number(*base_rate) : std::string("no launch")));
}

// The probe's named values: the canaries on average, the baseline's median node.
void judge_metrics(const judging& j, const std::map<std::string, double, std::less<>>& limits) {
  for (const auto& [metric, limit] : limits) {
    const std::string key = signal_text(halt_signal::metric, metric);
    const auto value_of = [&metric](const health_sample& s) -> std::optional<double> {
      const auto it = s.health.values.find(metric);
      if (it == s.health.values.end()) return std::nullopt;
      return it->second;
    };
    std::vector<double> values;
    for (const auto& b : j.baseline)
      if (const auto x = value_of(b)) values.push_back(*x);
    const auto canary_mean = mean_of(j.canaries, metric);
    const auto base_median = median(std::move(values));
    if (canary_mean) j.v.canary[key] = *canary_mean;
    if (base_median) j.v.baseline[key] = *base_median;
    const bool baseline_breaches = base_median && *base_median > limit;
    if (baseline_breaches)
      j.baseline_breached(key, breaching(j.baseline, value_of, limit),
                          "median node " + number(*base_median) + " over " + number(limit));
    if (canary_mean && *canary_mean > limit && !baseline_breaches)
      j.fail(worst_for(j.canaries, metric), halt_signal::metric,
             "canary " + metric + " " + number(*canary_mean) + " on average is over " +
                 number(limit) +
                 j.baseline_text(base_median ? number(*base_median) + " (median node)" : "none"),
             metric);
  }
}

}  // namespace

std::size_t baseline_trim(std::size_t count) noexcept {
  return std::max<std::size_t>(1, count / 10);
}

wave_verdict analyse_wave(std::span<const health_sample> canaries,
                          std::span<const health_sample> baseline,
                          const std::map<std::string, counter_mark, std::less<>>& baseline_start,
                          const health_limits& limits) {
  wave_verdict v;
  const judging j{canaries, baseline, v, limits.baseline_breach_halts,
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
