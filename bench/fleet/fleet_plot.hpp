#pragma once
// The fleet benchmark's chart (bench_fleet.cpp): time to all converged against node count, one
// line per series, as a small hand-written SVG (like tools/coldstart/render_svg.cpp).
#include <string>
#include <vector>

namespace cubridge::bench {

struct plot_series {
  std::string label;
  std::string colour;  // "#rrggbb"
  bool dashed = false;
  std::vector<std::pair<double, double>> points;  // (nodes, milliseconds)
};

/// The axes' labels and the y scale.
struct plot_axes {
  std::string x_label = "nodes (log scale)";
  std::string y_label = "ms from publish to all converged (median)";
  /// y on a log scale (decades that hold the points) instead of linear from 0.
  bool log_y = false;
};

/// The SVG text of `series` under `title`; x on a log scale (node counts), y as `axes` says.
[[nodiscard]] std::string render_plot(const std::string& title, const std::string& subtitle,
                                      const std::vector<plot_series>& series,
                                      const plot_axes& axes = {});

}  // namespace cubridge::bench
