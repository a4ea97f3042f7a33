#pragma once
// The scale benchmark's chart (bench_fleet.cpp): time to all acknowledged against node count,
// one line per series, as a small hand-written SVG (like tools/coldstart/render_svg.cpp).
#include <string>
#include <vector>

namespace cubridge::bench {

struct plot_series {
  std::string label;
  std::string colour;  // "#rrggbb"
  bool dashed = false;
  std::vector<std::pair<double, double>> points;  // (nodes, milliseconds)
};

/// The SVG text of `series` under `title`; x on a log scale (node counts), y linear from 0.
[[nodiscard]] std::string render_plot(const std::string& title, const std::string& subtitle,
                                      const std::vector<plot_series>& series);

}  // namespace cubridge::bench
