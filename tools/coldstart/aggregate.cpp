#include "aggregate.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <utility>

namespace cubridge::tool::coldstart {

stats summarize(std::vector<double> values) {
  if (values.empty()) throw std::invalid_argument("coldstart::summarize: no values");
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  stats s;
  s.count = n;
  s.min = values.front();
  s.max = values.back();
  s.median = n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
  return s;
}

double scenario_summary::stacked_median_ms() const noexcept {
  double sum = 0;
  for (const auto& p : phases) sum += p.ms.median;
  return sum;
}

std::vector<scenario_summary> aggregate(const std::vector<run_result>& runs) {
  std::vector<scenario_summary> out;
  for (const loading_mode mode : {loading_mode::lazy, loading_mode::eager}) {
    for (const auto& info : scenarios()) {
      scenario_summary s;
      s.loading = mode;
      s.scen = info.id;
      std::map<std::string, std::vector<double>> by_phase;
      std::vector<double> totals;
      for (const auto& r : runs) {
        if (r.loading != mode || r.scen != info.id) continue;
        if (!r.ok) {
          ++s.runs_failed;
          s.failures.push_back("run " + std::to_string(r.run) + ": " +
                               (r.failed_phase.empty() ? "" : r.failed_phase + ": ") + r.error);
          continue;
        }
        ++s.runs_ok;
        for (const auto& p : r.phases) by_phase[p.phase].push_back(p.ms);
        totals.push_back(total_ms(r));
      }
      if (s.runs_ok + s.runs_failed == 0) continue;
      // Known phases in the order they are paid, then any unknown ones (from a newer probe).
      for (const auto& p : phases()) {
        auto it = by_phase.find(std::string(p.key));
        if (it == by_phase.end()) continue;
        s.phases.push_back({it->first, summarize(std::move(it->second))});
        by_phase.erase(it);
      }
      for (auto& [name, values] : by_phase)
        s.phases.push_back({name, summarize(std::move(values))});
      if (!totals.empty()) s.total = summarize(std::move(totals));
      out.push_back(std::move(s));
    }
  }
  return out;
}

void to_json(nlohmann::json& j, const stats& s) {
  j = {{"median", s.median}, {"min", s.min}, {"max", s.max}, {"count", s.count}};
}

void to_json(nlohmann::json& j, const scenario_summary& s) {
  nlohmann::json phases_json = nlohmann::json::array();
  for (const auto& p : s.phases) {
    nlohmann::json pj = p.ms;
    pj["phase"] = p.phase;
    phases_json.push_back(std::move(pj));
  }
  j = {{"loading", to_string(s.loading)}, {"scenario", to_string(s.scen)},
       {"label", label(s.scen)},          {"runs_ok", s.runs_ok},
       {"runs_failed", s.runs_failed},    {"phases_ms", std::move(phases_json)},
       {"failures", s.failures}};
  if (s.runs_ok > 0) j["total_ms"] = s.total;
}

nlohmann::json document(const report& r) {
  nlohmann::json j = r;
  j["summary"] = aggregate(r.runs);
  return j;
}

}  // namespace cubridge::tool::coldstart
