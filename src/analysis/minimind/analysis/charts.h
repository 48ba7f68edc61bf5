// SVG line charts and page pieces shared by report.html and compare.html: self-contained
// (inline SVG and CSS, no scripts, no network), round ticks, one step axis per page.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace minimind {

struct Series {
  std::string name, color;
  std::vector<std::pair<double, double>> points;  // (step, value)
};

// Colours for layers or runs, by index (wraps after 12).
const std::string& series_color(size_t i);

std::string esc(const std::string& s);  // HTML-escaped text

// A tick's text: as many decimals as the tick step needs.
std::string tick_label(double v, double step);

// 4 to 6 round axis values (steps of 1, 2 or 5 x 10^k): the first <= lo, the last >= hi.
std::vector<double> axis_ticks(double lo, double hi);

// Horizontal axis, shared by every chart of a page: steps 0 .. the last tick at or after x_max.
struct StepAxis {
  std::vector<double> ticks;
  double end;
  std::string label;  // under the axis' right end
  explicit StepAxis(double x_max, std::string label = "step")
      : ticks(axis_ticks(0, std::max(x_max, 1.0))), end(ticks.back()), label(std::move(label)) {}
};

// The step tick labels along a chart's bottom edge.
std::string step_ticks(const StepAxis& axis, double L, double W, double R, double y);

// A line chart: round ticks and grid lines on both axes, a legend (when there are at most
// 8 series and `legend`), and dashed red lines at event steps, named in the legend by
// `events_label`.
std::string line_chart(const std::string& title, const std::vector<Series>& series,
                       const std::vector<int64_t>& events, const StepAxis& axis, bool legend = true,
                       const std::string& events_label = "collapse warning");

// <!DOCTYPE ...><body>: the page head with the shared style sheet (and `extra`, e.g. a
// refresh, in the head).
std::string page_head(const std::string& title, const std::string& extra = "");

// Whether a file's first bytes are those of a page page_head began: what minimind-eval may
// replace under a page's name (check_own_output_file).
bool is_tool_page(std::string_view head);

}  // namespace minimind
