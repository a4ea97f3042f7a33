#include "render_svg.hpp"

#include "render_table.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <sstream>

namespace cubridge::tool::coldstart {
namespace {

constexpr double title_y = 30;
constexpr double plot_top = 78;
constexpr double group_header_height = 26;
constexpr double row_height = 28;
constexpr double bar_height = 20;
constexpr double group_gap = 8;
constexpr double legend_row_height = 20;
constexpr int legend_columns = 3;
constexpr const char* font =
    "-apple-system, BlinkMacSystemFont, 'Segoe UI', Helvetica, Arial, sans-serif";

std::string num(double v, const char* format = "%.2f") {
  char buf[48];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

/// A value for a segment or total label: few digits, more of them for small values.
std::string short_ms(double v) {
  if (v >= 10) return num(v, "%.0f");
  if (v >= 1) return num(v, "%.1f");
  return num(v, "%.2f");
}

/// Dark or light text, whichever reads better on `fill` ("#rrggbb").
const char* text_colour_on(std::string_view fill) {
  if (fill.size() != 7) return "#1a1a1a";
  const auto channel = [&](std::size_t i) {
    return std::stoi(std::string(fill.substr(1 + 2 * i, 2)), nullptr, 16);
  };
  const double luminance = 0.299 * channel(0) + 0.587 * channel(1) + 0.114 * channel(2);
  return luminance > 150 ? "#1a1a1a" : "#ffffff";
}

std::string fill_of(std::string_view phase) {
  if (const auto* p = find_phase(phase)) return std::string(p->colour);
  return "#888888";
}

std::string legend_label(std::string_view phase) {
  if (phase == "context") return "first context (primary retain / cuCtxCreate)";
  if (phase == "module_load") return "first module load (cuModuleLoadData)";
  if (const auto* p = find_phase(phase)) return std::string(p->label);
  return std::string(phase);
}

}  // namespace

svg_axis nice_axis(double max_ms) {
  if (!(max_ms > 0) || !std::isfinite(max_ms)) return {1, 0.2};
  constexpr int target_ticks = 6;
  const double raw = max_ms / target_ticks;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude * 10;
  for (const double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (m * magnitude >= raw) {
      step = m * magnitude;
      break;
    }
  }
  const double ticks = std::ceil(max_ms / step - 1e-9);
  return {std::max(1.0, ticks) * step, step};
}

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        // Control characters other than tab and newline are not allowed in XML 1.0.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n')
          out += ' ';
        else
          out += c;
    }
  }
  return out;
}

namespace {

/// The phases the summaries hold: the known ones in their order, then any others as first seen.
std::vector<std::string> phases_present_in(const std::vector<scenario_summary>& summary) {
  std::vector<std::string> phases_present;
  for (const auto& p : phases())
    for (const auto& s : summary)
      if (std::any_of(s.phases.begin(), s.phases.end(),
                      [&](const phase_summary& ps) { return ps.phase == p.key; })) {
        phases_present.emplace_back(p.key);
        break;
      }
  for (const auto& s : summary)
    for (const auto& ps : s.phases)
      if (!find_phase(ps.phase) &&
          std::find(phases_present.begin(), phases_present.end(), ps.phase) == phases_present.end())
        phases_present.push_back(ps.phase);
  return phases_present;
}

void render_group_header(std::ostream& bars, loading_mode loading, const svg_layout& layout,
                         double y) {
  bars << "  <text class=\"group\" x=\"" << num(layout.plot_x - 12) << "\" y=\"" << num(y + 18)
       << "\" text-anchor=\"end\" font-weight=\"600\" font-size=\"13\" "
       << "fill=\"#1a1a1a\">" << env_value(loading) << " loading</text>\n"
       << "  <text x=\"" << num(layout.plot_x + 6) << "\" y=\"" << num(y + 18)
       << "\" font-size=\"11.5\" fill=\"#6b6b6b\">CUDA_MODULE_LOADING=" << env_value(loading)
       << "</text>\n";
}

/// One phase's segment of a bar, with its value where the text fits; returns its width.
double render_segment(std::ostream& bars, const scenario_summary& s, const phase_summary& p,
                      double x, double bar_y, double px_per_ms) {
  const double w = p.ms.median * px_per_ms;
  const std::string fill = fill_of(p.phase);
  bars << "    <rect class=\"segment\" data-phase=\"" << xml_escape(p.phase) << "\" data-ms=\""
       << num(p.ms.median, "%.6f") << "\" x=\"" << num(x, "%.3f") << "\" y=\"" << num(bar_y)
       << "\" width=\"" << num(w, "%.3f") << "\" height=\"" << num(bar_height) << "\" fill=\""
       << fill << "\"><title>" << env_value(s.loading) << ", " << xml_escape(label(s.scen)) << ": "
       << xml_escape(phase_label(p.phase, s.scen)) << " " << num(p.ms.median, "%.3f")
       << " ms median (min " << num(p.ms.min, "%.3f") << ", max " << num(p.ms.max, "%.3f") << ", "
       << p.ms.count << " runs)</title></rect>\n";
  const std::string value = short_ms(p.ms.median);
  // Label a segment only where its text fits (about 6.5 px per character at this size).
  if (w >= 6.5 * static_cast<double>(value.size()) + 8)
    bars << "    <text x=\"" << num(x + w / 2) << "\" y=\"" << num(bar_y + bar_height / 2 + 4)
         << "\" text-anchor=\"middle\" font-size=\"10.5\" fill=\"" << text_colour_on(fill)
         << "\" pointer-events=\"none\">" << value << "</text>\n";
  return w;
}

/// One scenario's row at `y`: its label, its stacked segments and its total (or its failure).
void render_bar(std::ostream& bars, const scenario_summary& s, const svg_layout& layout, double y,
                double px_per_ms) {
  const std::string id = std::string(to_string(s.loading)) + "/" + std::string(to_string(s.scen));
  const double bar_y = y + (row_height - bar_height) / 2;
  bars << "  <g class=\"bar\" data-scenario=\"" << id << "\">\n"
       << "    <text x=\"" << num(layout.plot_x - 12) << "\" y=\""
       << num(bar_y + bar_height / 2 + 4.5)
       << "\" text-anchor=\"end\" font-size=\"12.5\" fill=\"#333333\">" << xml_escape(label(s.scen))
       << "</text>\n";
  double x = layout.plot_x;
  for (const auto& p : s.phases) x += render_segment(bars, s, p, x, bar_y, px_per_ms);
  if (s.runs_ok > 0) {
    bars << "    <text class=\"total\" x=\"" << num(x + 6) << "\" y=\""
         << num(bar_y + bar_height / 2 + 4.5) << "\" font-size=\"12\" font-weight=\"600\" "
         << "fill=\"#1a1a1a\">" << short_ms(s.stacked_median_ms()) << " ms";
    if (s.runs_failed > 0)
      bars << "<tspan dx=\"6\" fill=\"#c0392b\" font-weight=\"400\">(" << s.runs_failed << " of "
           << s.runs_ok + s.runs_failed << " failed)</tspan>";
    bars << "</text>\n";
  } else {
    bars << "    <text class=\"failed\" x=\"" << num(layout.plot_x + 4) << "\" y=\""
         << num(bar_y + bar_height / 2 + 4.5) << "\" font-size=\"12\" fill=\"#c0392b\">all "
         << s.runs_failed << " runs failed";
    if (!s.failures.empty()) {
      std::string first = s.failures.front().substr(0, 90);
      std::replace(first.begin(), first.end(), '\n', ' ');
      bars << ": " << xml_escape(first);
    }
    bars << "</text>\n";
  }
  bars << "  </g>\n";
}

/// Rows: a header per loading mode, then one bar per scenario. Returns the y below the last.
double render_bars(std::ostream& bars, const std::vector<scenario_summary>& summary,
                   const svg_layout& layout, double px_per_ms) {
  double y = plot_top;
  std::optional<loading_mode> current_mode;
  for (const auto& s : summary) {
    if (current_mode != s.loading) {
      if (current_mode) y += group_gap;
      current_mode = s.loading;
      render_group_header(bars, s.loading, layout, y);
      y += group_header_height;
    }
    render_bar(bars, s, layout, y, px_per_ms);
    y += row_height;
  }
  if (summary.empty()) {
    bars << "  <text x=\"" << num(layout.plot_x) << "\" y=\"" << num(y + 18)
         << "\" font-size=\"12.5\" fill=\"#6b6b6b\">no runs</text>\n";
    y += row_height;
  }
  return y;
}

/// The vertical grid lines behind the bars, and the ticks and axis title below them.
void render_axis(std::ostream& grid, std::ostream& ticks, const svg_axis& axis,
                 const svg_layout& layout, double px_per_ms, double plot_bottom) {
  const int tick_count = static_cast<int>(std::lround(axis.max_ms / axis.step_ms));
  for (int i = 0; i <= tick_count; ++i) {
    const double v = i * axis.step_ms;
    const double tx = layout.plot_x + v * px_per_ms;
    grid << "  <line x1=\"" << num(tx) << "\" y1=\"" << num(plot_top) << "\" x2=\"" << num(tx)
         << "\" y2=\"" << num(plot_bottom) << "\" stroke=\"" << (i == 0 ? "#9a9a9a" : "#e6e6e6")
         << "\" stroke-width=\"1\"/>\n";
    const std::string text =
        axis.step_ms < 1 ? num(v, axis.step_ms < 0.1 ? "%.2f" : "%.1f") : num(v, "%.0f");
    ticks << "  <line x1=\"" << num(tx) << "\" y1=\"" << num(plot_bottom) << "\" x2=\"" << num(tx)
          << "\" y2=\"" << num(plot_bottom + 5) << "\" stroke=\"#9a9a9a\"/>\n"
          << "  <text class=\"tick\" x=\"" << num(tx) << "\" y=\"" << num(plot_bottom + 18)
          << "\" text-anchor=\"middle\" font-size=\"11\" fill=\"#555555\">" << text << "</text>\n";
  }
  ticks << "  <line x1=\"" << num(layout.plot_x) << "\" y1=\"" << num(plot_bottom) << "\" x2=\""
        << num(layout.plot_x + layout.plot_width) << "\" y2=\"" << num(plot_bottom)
        << "\" stroke=\"#9a9a9a\"/>\n"
        << "  <text x=\"" << num(layout.plot_x + layout.plot_width / 2) << "\" y=\""
        << num(plot_bottom + 36) << "\" text-anchor=\"middle\" font-size=\"12\" fill=\"#333333\">"
        << "milliseconds since the process was spawned (median of each phase, stacked)</text>\n";
}

/// The legend from `legend_top` down; returns the picture's height below it.
double render_legend(std::ostream& legend, const std::vector<std::string>& phases_present,
                     const svg_layout& layout, double legend_top) {
  const double column_width = (layout.width - 40) / legend_columns;
  for (std::size_t i = 0; i < phases_present.size(); ++i) {
    const std::size_t column = i % legend_columns;
    const std::size_t row = i / legend_columns;
    const double lx = 20 + static_cast<double>(column) * column_width;
    const double ly = legend_top + static_cast<double>(row) * legend_row_height;
    legend << "  <g class=\"legend-item\" data-phase=\"" << xml_escape(phases_present[i]) << "\">"
           << "<rect x=\"" << num(lx) << "\" y=\"" << num(ly)
           << "\" width=\"12\" height=\"12\" rx=\"2\" fill=\"" << fill_of(phases_present[i])
           << "\"/><text x=\"" << num(lx + 18) << "\" y=\"" << num(ly + 10.5)
           << "\" font-size=\"12\" fill=\"#333333\">" << xml_escape(legend_label(phases_present[i]))
           << "</text></g>\n";
  }
  const std::size_t legend_rows = (phases_present.size() + legend_columns - 1) / legend_columns;
  return legend_top + static_cast<double>(legend_rows) * legend_row_height + 16;
}

}  // namespace

std::string render_svg(const report& r, const std::vector<scenario_summary>& summary,
                       const svg_layout& layout) {
  double longest = 0;
  for (const auto& s : summary) longest = std::max(longest, s.stacked_median_ms());
  const svg_axis axis = nice_axis(longest);
  const double px_per_ms = layout.plot_width / axis.max_ms;

  std::ostringstream bars;
  const double plot_bottom = render_bars(bars, summary, layout, px_per_ms) + 4;
  std::ostringstream grid;
  std::ostringstream ticks;
  render_axis(grid, ticks, axis, layout, px_per_ms, plot_bottom);
  std::ostringstream legend;
  const double height = render_legend(legend, phases_present_in(summary), layout, plot_bottom + 56);

  int runs = r.runs_per_scenario;
  std::ostringstream svg;
  svg << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << num(layout.width, "%.0f")
      << "\" height=\"" << num(height, "%.0f") << "\" viewBox=\"0 0 " << num(layout.width, "%.0f")
      << " " << num(height, "%.0f") << "\" font-family=\"" << font << "\">\n"
      << "  <title>cubridge coldstart: " << xml_escape(describe_machine(r.machine)) << "</title>\n"
      << "  <rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n"
      << "  <text x=\"20\" y=\"" << num(title_y) << "\" font-size=\"18\" font-weight=\"600\" "
      << "fill=\"#1a1a1a\">What the first CUDA call costs: "
      << xml_escape(describe_machine(r.machine)) << "</text>\n"
      << "  <text x=\"20\" y=\"" << num(title_y + 22) << "\" font-size=\"12.5\" fill=\"#6b6b6b\">"
      << "cubridge coldstart: median of " << runs << " run" << (runs == 1 ? "" : "s")
      << " per scenario, each a fresh process; phases stacked in the order a program pays them"
      << "</text>\n"
      << grid.str() << bars.str() << ticks.str() << legend.str() << "</svg>\n";
  return svg.str();
}

}  // namespace cubridge::tool::coldstart
