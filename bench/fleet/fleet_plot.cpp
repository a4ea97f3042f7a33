#include "fleet_plot.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <vector>

namespace cubridge::bench {
namespace {

constexpr double width = 760, height = 460;
constexpr double left = 70, right = 220, top = 64, bottom = 56;
constexpr const char* font = "Helvetica, Arial, sans-serif";

std::string num(double v, const char* format = "%.1f") {
  char buf[48];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// A round axis maximum at or above `v` (1, 2 or 5 times a power of ten).
double nice_ceiling(double v) {
  if (v <= 0) return 1;
  const double power = std::pow(10, std::floor(std::log10(v)));
  for (double step : {1.0, 2.0, 5.0, 10.0})
    if (step * power >= v) return step * power;
  return 10 * power;
}

}  // namespace

std::string render_plot(const std::string& title, const std::string& subtitle,
                        const std::vector<plot_series>& series, const plot_axes& axes) {
  double x_min = 1, x_max = 1, y_max = 0, y_min = 0;
  bool any = false;
  for (const auto& s : series)
    for (const auto& [x, y] : s.points) {
      x_max = std::max(x_max, x);
      y_max = std::max(y_max, y);
      y_min = any ? std::min(y_min, y) : y;
      any = true;
    }
  // Linear: 0 to a round maximum. Log: the decades that hold the points.
  double y_low = 0, y_high = nice_ceiling(y_max);
  if (axes.log_y) {
    y_low = std::pow(10, std::floor(std::log10(std::max(y_min, 1e-3))));
    y_high = std::pow(10, std::ceil(std::log10(std::max(y_max, y_low * 10))));
    if (y_high <= y_low) y_high = y_low * 10;
  }
  const double plot_w = width - left - right, plot_h = height - top - bottom;
  const double log_span = std::max(std::log10(x_max) - std::log10(x_min), 1e-9);
  const auto px = [&](double x) {
    return left + plot_w * (std::log10(x) - std::log10(x_min)) / log_span;
  };
  const auto py = [&](double y) {
    if (!axes.log_y) return top + plot_h * (1 - y / y_high);
    const double span = std::log10(y_high) - std::log10(y_low);
    return top + plot_h * (1 - (std::log10(std::max(y, y_low)) - std::log10(y_low)) / span);
  };

  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" viewBox=\"0 0 " << width << ' ' << height << "\" font-family=\"" << font << "\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n"
      << "<text x=\"" << left << "\" y=\"28\" font-size=\"17\" font-weight=\"bold\">" << title
      << "</text>\n<text x=\"" << left << "\" y=\"48\" font-size=\"12\" fill=\"#555\">" << subtitle
      << "</text>\n";
  // Grid and axes: five y steps (log: 1, 2 and 5 of each decade); x ticks at the node counts.
  std::vector<double> y_ticks;
  if (axes.log_y) {
    for (double decade = y_low; decade < y_high * 1.001; decade *= 10)
      for (double step : {1.0, 2.0, 5.0})
        if (decade * step <= y_high * 1.001) y_ticks.push_back(decade * step);
  } else {
    for (int i = 0; i <= 5; ++i) y_ticks.push_back(y_high * i / 5);
  }
  for (double y : y_ticks) {
    const char* format = y >= 50 || (axes.log_y && y >= 1) ? "%.0f" : y >= 1 ? "%.1f" : "%.2f";
    svg << "<line x1=\"" << left << "\" x2=\"" << left + plot_w << "\" y1=\"" << num(py(y))
        << "\" y2=\"" << num(py(y)) << "\" stroke=\"#e4e4e4\"/>\n<text x=\"" << left - 8
        << "\" y=\"" << num(py(y) + 4) << "\" font-size=\"11\" text-anchor=\"end\">"
        << num(y, format) << "</text>\n";
  }
  std::vector<double> ticks;
  for (const auto& s : series)
    for (const auto& point : s.points) ticks.push_back(point.first);
  std::sort(ticks.begin(), ticks.end());
  ticks.erase(std::unique(ticks.begin(), ticks.end()), ticks.end());
  for (double x : ticks)
    svg << "<text x=\"" << num(px(x)) << "\" y=\"" << top + plot_h + 18
        << "\" font-size=\"11\" text-anchor=\"middle\">" << num(x, "%.0f") << "</text>\n";
  svg << "<line x1=\"" << left << "\" x2=\"" << left << "\" y1=\"" << top << "\" y2=\""
      << top + plot_h << "\" stroke=\"#333\"/>\n<line x1=\"" << left << "\" x2=\"" << left + plot_w
      << "\" y1=\"" << top + plot_h << "\" y2=\"" << top + plot_h
      << "\" stroke=\"#333\"/>\n<text x=\"" << left + plot_w / 2 << "\" y=\"" << height - 14
      << "\" font-size=\"12\" text-anchor=\"middle\">" << axes.x_label << "</text>\n"
      << "<text transform=\"translate(18," << top + plot_h / 2
      << ") rotate(-90)\" font-size=\"12\" text-anchor=\"middle\">" << axes.y_label << "</text>\n";
  // The lines, then the legend at the right.
  double legend_y = top + 6;
  for (const auto& s : series) {
    std::string path;
    for (const auto& [x, y] : s.points)
      path += (path.empty() ? "M" : " L") + num(px(x)) + ' ' + num(py(y));
    svg << "<path d=\"" << path << "\" fill=\"none\" stroke=\"" << s.colour
        << "\" stroke-width=\"2.2\"" << (s.dashed ? " stroke-dasharray=\"6 4\"" : "") << "/>\n";
    for (const auto& [x, y] : s.points)
      svg << "<circle cx=\"" << num(px(x)) << "\" cy=\"" << num(py(y)) << "\" r=\"3.2\" fill=\""
          << s.colour << "\"/>\n";
    svg << "<line x1=\"" << width - right + 16 << "\" x2=\"" << width - right + 40 << "\" y1=\""
        << legend_y << "\" y2=\"" << legend_y << "\" stroke=\"" << s.colour
        << "\" stroke-width=\"2.2\"" << (s.dashed ? " stroke-dasharray=\"6 4\"" : "")
        << "/>\n<text x=\"" << width - right + 46 << "\" y=\"" << legend_y + 4
        << "\" font-size=\"11\">" << s.label << "</text>\n";
    legend_y += 20;
  }
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace cubridge::bench
