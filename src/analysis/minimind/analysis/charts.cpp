#include "minimind/analysis/charts.h"

#include <fmt/format.h>

#include <cmath>

namespace minimind {

const std::string& series_color(size_t i) {
  static const std::vector<std::string> colors = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                                  "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                                                  "#bcbd22", "#17becf", "#393b79", "#ad494a"};
  return colors[i % colors.size()];
}

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<')
      o += "&lt;";
    else if (c == '>')
      o += "&gt;";
    else if (c == '&')
      o += "&amp;";
    else if (c == '"')
      o += "&quot;";
    else
      o += c;
  }
  return o;
}

// A tick's text: as many decimals as the tick step needs.
std::string tick_label(double v, double step) {
  if (std::abs(v) < step * 1e-6) return "0";
  if (std::abs(v) >= 1e6) {  // tokens, FLOPs: a short SI form ("1.5G") fits under a tick
    static const char* const prefix[] = {"M", "G", "T", "P", "E"};
    int p = 0;
    double scaled = v / 1e6;
    while (std::abs(scaled) >= 1000 && p < 4) scaled /= 1000, ++p;
    return fmt::format("{:.3g}{}", scaled, prefix[p]);
  }
  if (step < 1e-4) return fmt::format("{:g}", v);
  const int decimals = std::max(0, -static_cast<int>(std::floor(std::log10(step) + 1e-9)));
  return fmt::format("{:.{}f}", v, decimals);
}

std::string step_ticks(const StepAxis& axis, double L, double W, double R, double y) {
  std::string svg;
  const double step = axis.ticks.size() > 1 ? axis.ticks[1] - axis.ticks[0] : 1;
  for (double t : axis.ticks)
    svg +=
        fmt::format("<text x=\"{:.1f}\" y=\"{}\" class=\"tick\" text-anchor=\"middle\">{}</text>",
                    L + (W - L - R) * t / axis.end, y, tick_label(t, step));
  return svg;
}

std::string line_chart(const std::string& title, const std::vector<Series>& series,
                       const std::vector<int64_t>& events, const StepAxis& axis, bool legend,
                       const std::string& events_label) {
  legend = legend && series.size() <= 8;
  const double W = 560, H = 230, L = 56, R = 16, T = 28, B = 44;
  double lo = INFINITY, hi = -INFINITY;
  for (const auto& s : series)
    for (const auto& [x, y] : s.points) lo = std::min(lo, y), hi = std::max(hi, y);
  if (!std::isfinite(lo)) lo = 0, hi = 1;
  const std::vector<double> yt = axis_ticks(lo, hi);
  const double y_min = yt.front(), y_max = yt.back(), y_step = yt[1] - yt[0];
  auto px = [&](double x) { return L + (W - L - R) * x / axis.end; };
  auto py = [&](double y) { return T + (H - T - B) * (1 - (y - y_min) / (y_max - y_min)); };
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" class=\"chart\">"
      "<text x=\"{}\" y=\"18\" class=\"title\">{}</text>",
      W, H, L, esc(title));
  for (double t : yt)
    svg += fmt::format(
        "<line x1=\"{0}\" x2=\"{1}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" class=\"gl\"/>"
        "<text x=\"{3}\" y=\"{4:.1f}\" class=\"tick\" text-anchor=\"end\">{5}</text>",
        L, W - R, py(t), L - 4, py(t) + 3.5, tick_label(t, y_step));
  for (double t : axis.ticks)
    svg += fmt::format("<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1}\" y2=\"{2}\" class=\"gl\"/>",
                       px(t), T, H - B);
  svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"frame\"/>", L, T,
                     W - L - R, H - T - B);
  svg += step_ticks(axis, L, W, R, H - B + 13);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" class=\"tick\" text-anchor=\"end\">{}</text>", W - R,
                     H - B + 26, esc(axis.label));
  for (int64_t e : events)
    svg +=
        fmt::format("<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1}\" y2=\"{2}\" class=\"event\"/>",
                    px(e), T, H - B);
  double lx = L + 6;
  for (const auto& s : series) {
    std::string pts;
    for (const auto& [x, y] : s.points) pts += fmt::format("{:.1f},{:.1f} ", px(x), py(y));
    svg += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"/>",
                       pts, s.color);
    if (s.points.size() <= 12)  // few points (evaluations): show them
      for (const auto& [x, y] : s.points)
        svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.5\" fill=\"{}\"/>", px(x),
                           py(y), s.color);
    if (!legend) continue;
    svg += fmt::format(
        "<rect x=\"{:.0f}\" y=\"{}\" width=\"10\" height=\"3\" fill=\"{}\"/>"
        "<text x=\"{:.0f}\" y=\"{}\" class=\"legend\">{}</text>",
        lx, H - 10, s.color, lx + 13, H - 6, esc(s.name));
    lx += 20 + 7.0 * s.name.size();
  }
  // What the dashed lines mean, after the series' names.
  if (!events.empty())
    svg += fmt::format(
        "<line x1=\"{0:.0f}\" x2=\"{1:.0f}\" y1=\"{2}\" y2=\"{2}\" class=\"event\"/>"
        "<text x=\"{3:.0f}\" y=\"{4}\" class=\"legend\">{5}</text>",
        lx, lx + 12, H - 9, lx + 15, H - 6, esc(events_label));
  return svg + "</svg>";
}

std::vector<double> axis_ticks(double lo, double hi) {
  if (!(hi > lo)) hi = lo + (lo == 0 ? 1 : std::abs(lo) * 0.1);
  const double span = hi - lo;
  const int k0 = static_cast<int>(std::floor(std::log10(span))) - 2;
  double best_step = 0;
  int best_n = 0;
  for (int k = k0; k <= k0 + 3; ++k)
    for (double m : {1.0, 2.0, 5.0}) {
      const double step = m * std::pow(10.0, k);
      const int n =
          static_cast<int>(std::ceil(hi / step - 1e-9) - std::floor(lo / step + 1e-9)) + 1;
      // 4 to 6 ticks, as close to 5 as the round steps allow.
      const auto badness = [](int count) {
        return std::abs(count - 5) + (count < 4 || count > 6) * 10;
      };
      if (best_n == 0 || badness(n) < badness(best_n)) best_step = step, best_n = n;
    }
  std::vector<double> ticks;
  const double first = std::floor(lo / best_step + 1e-9);
  for (int i = 0; i < best_n; ++i) ticks.push_back((first + i) * best_step);
  return ticks;
}

namespace {
constexpr std::string_view kPageStart =
    "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/>";
constexpr std::string_view kTitleStart = "<title>minimind-cpp";  // every page's title
}  // namespace

bool is_tool_page(std::string_view head) {
  if (head.substr(0, kPageStart.size()) != kPageStart) return false;
  const size_t title = head.find(kTitleStart), end = head.find("</head>");
  return title != std::string_view::npos && (end == std::string_view::npos || title < end);
}

std::string page_head(const std::string& title, const std::string& extra) {
  return std::string(kPageStart) + extra + "<title>" + esc(title) +
         "</title><style>"
         "body{font-family:sans-serif;margin:20px;color:#222;max-width:1180px}"
         "h1{font-size:20px}h2{font-size:16px;margin:18px 0 6px}"
         ".grid{display:flex;flex-wrap:wrap;gap:8px;overflow-x:auto}.grid>svg{flex:none}"
         ".scroll{overflow-x:auto}h1{overflow-wrap:anywhere}"
         ".title{font-size:13px;font-weight:bold}.tick{font-size:10px;fill:#555}.legend{font-size:"
         "10px}"
         ".frame{fill:none;stroke:#bbb}.gl{stroke:#eee}.event{stroke:#d00;stroke-width:1.2;stroke-"
         "dasharray:4,3}"
         "p.note{font-size:12px;color:#555;max-width:900px}"
         "p.running{font-size:13px;background:#fff3cd;padding:4px 8px;display:inline-block}"
         "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px "
         "6px}"
         "</style></head><body>\n";
}

}  // namespace minimind
