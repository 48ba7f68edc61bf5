#include "minimind/analysis/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <vector>

#include "minimind/util/atomic_file.h"

namespace minimind {
namespace {

struct Series {
  std::string name, color;
  std::vector<std::pair<double, double>> points;  // (step, value)
};

const char* kLayerColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                              "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};

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

std::string num(double v) {
  return fmt::format("{:.3g}", v);
}

// A tick's text: as many decimals as the tick step needs.
std::string tick_label(double v, double step) {
  if (std::abs(v) < step * 1e-6) return "0";
  if (std::abs(v) >= 1e6 || step < 1e-4) return fmt::format("{:g}", v);
  const int decimals = std::max(0, -static_cast<int>(std::floor(std::log10(step) + 1e-9)));
  return fmt::format("{:.{}f}", v, decimals);
}

// Horizontal axis, shared by every chart: steps 0 .. the last tick at or after x_max.
struct StepAxis {
  std::vector<double> ticks;
  double end;
  explicit StepAxis(double x_max) : ticks(axis_ticks(0, std::max(x_max, 1.0))), end(ticks.back()) {}
};

std::string step_ticks(const StepAxis& axis, double L, double W, double R, double y) {
  std::string svg;
  const double step = axis.ticks.size() > 1 ? axis.ticks[1] - axis.ticks[0] : 1;
  for (double t : axis.ticks)
    svg +=
        fmt::format("<text x=\"{:.1f}\" y=\"{}\" class=\"tick\" text-anchor=\"middle\">{}</text>",
                    L + (W - L - R) * t / axis.end, y, tick_label(t, step));
  return svg;
}

// A line chart: round ticks and grid lines on both axes, a legend, and dashed red lines at
// event steps.
std::string line_chart(const std::string& title, const std::vector<Series>& series,
                       const std::vector<int64_t>& events, const StepAxis& axis) {
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
  svg += fmt::format("<text x=\"{}\" y=\"{}\" class=\"tick\" text-anchor=\"end\">step</text>",
                     W - R, H - B + 26);
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
    svg += fmt::format(
        "<rect x=\"{:.0f}\" y=\"{}\" width=\"10\" height=\"3\" fill=\"{}\"/>"
        "<text x=\"{:.0f}\" y=\"{}\" class=\"legend\">{}</text>",
        lx, H - 10, s.color, lx + 13, H - 6, esc(s.name));
    lx += 20 + 7.0 * s.name.size();
  }
  return svg + "</svg>";
}

// Diverging colour for share x E: 0 (dead) blue, 1 (fair) white, >= 2 red.
std::string share_color(double rel) {
  rel = std::clamp(rel, 0.0, 2.0);
  auto mix = [](double a, double b, double t) {
    return static_cast<int>(std::lround(a + (b - a) * t));
  };
  if (rel < 1) {
    const double t = rel;
    return fmt::format("rgb({},{},{})", mix(33, 247, t), mix(102, 247, t), mix(172, 247, t));
  }
  const double t = rel - 1;
  return fmt::format("rgb({},{},{})", mix(247, 178, t), mix(247, 24, t), mix(247, 43, t));
}

// Experts x steps heatmap of one layer (steps bucketed to at most 240 columns).
std::string heatmap(int64_t layer, const std::vector<LoadRecord>& points,
                    const std::vector<int64_t>& events, const StepAxis& axis) {
  const size_t E = points.empty() ? 0 : points[0].counts.size();
  const double W = 560, L = 56, R = 16, T = 28,
               cell_h = std::max(10.0, 120.0 / std::max<size_t>(E, 1));
  const double H = T + cell_h * E + 36;
  const size_t cols = std::min<size_t>(240, points.size());
  // Columns by step on the axis the line charts use (a record covers the step before it).
  auto px = [&](double step) { return L + (W - L - R) * step / axis.end; };
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{:.0f}\" class=\"heatmap\" "
      "data-layer=\"{}\"><text x=\"{}\" y=\"18\" class=\"title\">Layer {}: expert share over steps "
      "(share × E)</text>",
      W, H, layer, L, layer);
  for (size_t c = 0; c < cols; ++c) {
    const size_t lo = c * points.size() / cols, hi = (c + 1) * points.size() / cols;
    std::vector<double> sum(E, 0.0);
    double total = 0;
    for (size_t i = lo; i < hi; ++i)
      for (size_t e = 0; e < E && e < points[i].counts.size(); ++e)
        sum[e] += points[i].counts[e], total += points[i].counts[e];
    for (size_t e = 0; e < E; ++e) {
      const double rel = total > 0 ? sum[e] / total * E : 0;
      const double x0 = px(static_cast<double>(points[lo].step - 1)),
                   x1 = px(static_cast<double>(points[hi - 1].step));
      svg += fmt::format(
          "<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"{}\">"
          "<title>expert {} steps {}-{}: share {:.3f}</title></rect>",
          x0, T + e * cell_h, x1 - x0 + 0.3, cell_h, share_color(rel), e, points[lo].step,
          points[hi - 1].step, rel / E);
    }
  }
  for (size_t e = 0; e < E; ++e)
    svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" class=\"tick\" text-anchor=\"end\">e{}</text>",
                       L - 4, T + (e + 0.7) * cell_h, e);
  for (int64_t ev : events)
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1}\" y2=\"{2:.1f}\" class=\"event\"/>", px(ev),
        T - 4, T + cell_h * E + 4);
  svg += step_ticks(axis, L, W, R, T + cell_h * E + 13);
  svg += fmt::format("<text x=\"{}\" y=\"{:.0f}\" class=\"tick\" text-anchor=\"end\">step</text>",
                     W - R, T + cell_h * E + 26);
  return svg + "</svg>";
}

std::string legend() {
  std::string svg =
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"560\" height=\"40\" class=\"legendbar\">";
  for (int i = 0; i < 100; ++i)
    svg += fmt::format("<rect x=\"{}\" y=\"4\" width=\"4.6\" height=\"14\" fill=\"{}\"/>",
                       56 + i * 4.5, share_color(i / 50.0));
  svg +=
      "<text x=\"56\" y=\"32\" class=\"tick\">0: dead</text>"
      "<text x=\"281\" y=\"32\" class=\"tick\" text-anchor=\"middle\">1: fair share (1/E)</text>"
      "<text x=\"506\" y=\"32\" class=\"tick\" text-anchor=\"end\">≥ 2: twice its "
      "share</text></svg>";
  return svg;
}

}  // namespace

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

std::string render_report(const RunLogs& logs) {
  const StepAxis axis(static_cast<double>(logs.last_step()));
  std::vector<int64_t> all_events;
  for (const auto& c : logs.collapses) all_events.push_back(c.step);

  std::string html =
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/>"
      "<title>minimind-cpp report: " +
      esc(logs.run_dir) +
      "</title><style>"
      "body{font-family:sans-serif;margin:20px;color:#222;max-width:1180px}"
      "h1{font-size:20px}h2{font-size:16px;margin:18px 0 6px}"
      ".grid{display:flex;flex-wrap:wrap;gap:8px;overflow-x:auto}.grid>svg{flex:none}"
      ".scroll{overflow-x:auto}h1{overflow-wrap:anywhere}"
      ".title{font-size:13px;font-weight:bold}.tick{font-size:10px;fill:#555}.legend{font-size:"
      "10px}"
      ".frame{fill:none;stroke:#bbb}.gl{stroke:#eee}.event{stroke:#d00;stroke-width:1.2;stroke-"
      "dasharray:4,3}"
      "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px}"
      "</style></head><body>\n";
  html += "<h1>minimind-cpp run " + esc(logs.run_dir) + " — step " +
          std::to_string(logs.last_step()) + "</h1>\n";

  Series loss{"train loss", "#1f77b4", {}}, val{"val loss", "#d62728", {}}, lr{"lr", "#2ca02c", {}};
  for (const auto& p : logs.train)
    loss.points.emplace_back(p.step, p.loss), lr.points.emplace_back(p.step, p.lr);
  for (const auto& p : logs.eval) val.points.emplace_back(p.step, p.val_loss);
  html += "<h2>Loss and learning rate</h2><div class=\"grid\">" +
          line_chart("Loss (train: interval mean; val: held-out split)", {loss, val}, all_events,
                     axis) +
          line_chart("Learning rate", {lr}, {}, axis) + "</div>\n";

  if (logs.train_load.empty()) {
    html += "<p>Dense model: no expert load.</p>";
  } else {
    html += "<h2>Expert load per MoE layer</h2><div class=\"scroll\">" + legend() +
            "</div><div class=\"grid\">";
    for (const auto& [layer, points] : logs.train_load) {
      std::vector<int64_t> ev;
      for (const auto& c : logs.collapses)
        if (c.layer == layer) ev.push_back(c.step);
      html += heatmap(layer, points, ev, axis);
    }
    html += "</div>\n<h2>Balance over the run</h2><div class=\"grid\">";
    std::vector<Series> maxvio, entropy;
    for (const auto& [layer, points] : logs.train_load) {
      const std::string color = kLayerColors[layer % 8];
      Series mv{"L" + std::to_string(layer), color, {}}, en{"L" + std::to_string(layer), color, {}};
      // One point per log window of ~1% of the run keeps the curves readable.
      const size_t stride = std::max<size_t>(1, points.size() / 100);
      for (size_t i = 0; i < points.size(); i += stride) {
        double m = 0, h = 0;
        const size_t hi = std::min(points.size(), i + stride);
        for (size_t j = i; j < hi; ++j)
          m += points[j].max_vio / (hi - i), h += points[j].entropy / (hi - i);
        mv.points.emplace_back(points[hi - 1].step, m);
        en.points.emplace_back(points[hi - 1].step, h);
      }
      maxvio.push_back(mv);
      entropy.push_back(en);
    }
    html +=
        line_chart("MaxVio per layer (0 = balanced, E-1 = collapsed)", maxvio, all_events, axis) +
        line_chart("Normalised entropy per layer (1 = balanced, 0 = collapsed)", entropy,
                   all_events, axis) +
        "</div>\n";
  }
  html += "<h2>Collapse events</h2>";
  if (logs.collapses.empty()) {
    html += "<p>None.</p>";
  } else {
    html += "<table><tr><th>step</th><th>layer</th><th>warning</th></tr>";
    for (const auto& c : logs.collapses)
      html += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td></tr>", c.step, c.layer,
                          esc(c.message));
    html += "</table>";
  }
  return html + "\n</body></html>\n";
}

std::string write_report(const std::string& run_dir) {
  const std::string path = run_dir + "/report.html";
  write_file_atomic(path, render_report(read_run_logs(run_dir)));
  return path;
}

}  // namespace minimind
