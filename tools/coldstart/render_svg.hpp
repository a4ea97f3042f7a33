#pragma once
// The chart `cubridge coldstart --chart FILE.svg` writes: one stacked horizontal bar per scenario
// (LAZY and EAGER grouped), one colour per phase, each segment the phase's median, a legend and
// an axis in ms. Plain SVG text, no library; each segment carries a tooltip with median/min/max.

#include "aggregate.hpp"
#include "phase_timings.hpp"

#include <string>
#include <string_view>
#include <vector>

namespace cubridge::tool::coldstart {

/// Layout of the chart, in SVG user units (px). Exposed so tests can check proportions.
struct svg_layout {
  double width = 980;
  double plot_x = 262;      ///< x of 0 ms
  double plot_width = 600;  ///< px from 0 ms to the axis maximum
};

/// The axis maximum for bars up to `max_ms`: a round number >= max_ms (1, 2, 2.5 or 5 times a
/// power of ten, times the tick count), and its tick step.
struct svg_axis {
  double max_ms = 1;
  double step_ms = 1;
};
[[nodiscard]] svg_axis nice_axis(double max_ms);

/// Escapes text for XML character data and attribute values.
[[nodiscard]] std::string xml_escape(std::string_view text);

/// The chart as an SVG document.
[[nodiscard]] std::string render_svg(const report& r, const std::vector<scenario_summary>& summary,
                                     const svg_layout& layout = {});

}  // namespace cubridge::tool::coldstart
