#include "render_table.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace cubridge::tool::coldstart {
namespace {

std::string ms(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

std::string pad_right(std::string s, std::size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

std::string pad_left(const std::string& s, std::size_t width) {
  return s.size() < width ? std::string(width - s.size(), ' ') + s : s;
}

std::string scenario_title(const scenario_summary& s) {
  return pad_right(std::string(env_value(s.loading)), 7) + std::string(label(s.scen));
}

constexpr std::size_t number_width = 10;

}  // namespace

std::string describe_machine(const machine_info& m) {
  std::string out = m.gpu.empty() ? "unknown GPU" : m.gpu;
  if (m.compute_capability) out += " (sm_" + std::to_string(m.compute_capability) + ")";
  if (!m.driver_release.empty() || m.driver_version) {
    out += ", driver";
    if (!m.driver_release.empty()) out += " " + m.driver_release;
    if (m.driver_version)
      out += " (CUDA " + std::to_string(m.driver_version / 1000) + "." +
             std::to_string(m.driver_version % 1000 / 10) + ")";
  }
  return out;
}

std::string render_table(const report& r, const std::vector<scenario_summary>& summary) {
  std::ostringstream out;
  out << "cubridge coldstart: " << describe_machine(r.machine) << "\n"
      << r.runs_per_scenario << " run" << (r.runs_per_scenario == 1 ? "" : "s")
      << " per scenario, each in a fresh process; times in ms (steady_clock)\n\n";

  std::size_t title_width = std::string("scenario").size();
  for (const auto& s : summary) title_width = std::max(title_width, scenario_title(s).size());
  title_width += 2;

  out << pad_right("", title_width) << pad_left("total of each run", 3 * number_width) << "\n"
      << pad_right("scenario", title_width) << pad_left("median", number_width)
      << pad_left("min", number_width) << pad_left("max", number_width) << "    runs ok\n";
  for (const auto& s : summary) {
    out << pad_right(scenario_title(s), title_width);
    if (s.runs_ok > 0)
      out << pad_left(ms(s.total.median), number_width) << pad_left(ms(s.total.min), number_width)
          << pad_left(ms(s.total.max), number_width);
    else
      out << pad_left("-", number_width) << pad_left("-", number_width)
          << pad_left("-", number_width);
    out << "    " << s.runs_ok << "/" << s.runs_ok + s.runs_failed << "\n";
  }

  std::size_t label_width = std::string("phase").size();
  for (const auto& s : summary)
    for (const auto& p : s.phases)
      label_width = std::max(label_width, phase_label(p.phase, s.scen).size());
  label_width += 4;

  for (const auto& s : summary) {
    out << "\n" << scenario_title(s) << "\n";
    if (!s.phases.empty()) {
      out << "  " << pad_right("phase", label_width) << pad_left("median", number_width)
          << pad_left("min", number_width) << pad_left("max", number_width) << "\n";
      for (const auto& p : s.phases)
        out << "  " << pad_right(phase_label(p.phase, s.scen), label_width)
            << pad_left(ms(p.ms.median), number_width) << pad_left(ms(p.ms.min), number_width)
            << pad_left(ms(p.ms.max), number_width) << "\n";
      out << "  " << pad_right("total", label_width) << pad_left(ms(s.total.median), number_width)
          << pad_left(ms(s.total.min), number_width) << pad_left(ms(s.total.max), number_width)
          << "\n";
    }
    for (const auto& f : s.failures) {
      out << "  FAILED ";
      for (const char c : f) out << (c == '\n' ? std::string("\n         ") : std::string(1, c));
      out << "\n";
    }
  }
  return out.str();
}

}  // namespace cubridge::tool::coldstart
