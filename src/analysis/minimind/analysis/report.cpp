#include "minimind/analysis/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <vector>

#include "minimind/analysis/charts.h"
#include "minimind/analysis/routing_page.h"
#include "minimind/error.h"
#include "minimind/util/atomic_file.h"

namespace minimind {
namespace {

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

// The balancing lab's own figures, for the methods that are on: the fraction capacity
// dropped, and each layer's selection bias per expert.
std::string balancing_section(const RunLogs& logs, const std::vector<Series>& dropped,
                              const StepAxis& axis) {
  std::string charts;
  if (!dropped.empty())
    charts +=
        line_chart("Fraction of assignments dropped by capacity, per layer", dropped, {}, axis);
  for (const auto& [layer, points] : logs.train_load) {
    if (points.empty() || !points.back().stats.bias) continue;
    const size_t E = points.back().stats.bias->size();
    std::vector<Series> experts;
    for (size_t e = 0; e < E; ++e)
      experts.push_back(load_series(
          points,
          [e](const LoadRecord& r) {
            return r.stats.bias && e < r.stats.bias->size()
                       ? std::optional<double>((*r.stats.bias)[e])
                       : std::nullopt;
          },
          "e" + std::to_string(e), series_color(e)));
    charts += line_chart("Layer " + std::to_string(layer) + ": selection bias per expert" +
                             (E > 8 ? " (one line per expert)" : ""),
                         experts, {}, axis);
  }
  if (charts.empty()) return "";
  return "<h2>Balancing methods</h2><div class=\"grid\">" + charts + "</div>\n";
}

// Is the router learning? Routing information and token entropy per layer, and the router
// gradient by source (log10), with the steps of "uninformative" warnings marked.
std::string router_section(const std::vector<Series>& mi, const std::vector<Series>& entropy,
                           const std::vector<Series>& grad_lm, const std::vector<Series>& grad_bal,
                           const std::vector<UninformativeRecord>& warnings, const StepAxis& axis) {
  if (mi.empty()) return "";
  std::vector<int64_t> events;
  for (const auto& w : warnings) events.push_back(w.step);
  std::string html =
      "<h2>Is the router learning?</h2><p class=\"note\">Routing information MI = H<sub>m</sub> "
      "− H̄: near 0 the router gives every token the same probabilities, however balanced its "
      "counts look (MiniMind #858). The gradient charts show what trains the router: the LM "
      "loss, or only the balancing losses.</p><div class=\"grid\">" +
      line_chart("Routing information MI per layer (0 = uninformative)", mi, events, axis, true,
                 "uninformative warning") +
      line_chart("Token entropy H̄ per layer (1 = the same for every token)", entropy, events, axis,
                 true, "uninformative warning");
  if (!grad_lm.empty())
    html += line_chart("log10 ‖∂LM/∂W_gate‖ per layer (log steps)", grad_lm, {}, axis) +
            line_chart("log10 ‖∂(aux + z)/∂W_gate‖ per layer (log steps)", grad_bal, {}, axis);
  return html + "</div>\n";
}

std::string legend() {
  std::string svg =
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"560\" height=\"54\" class=\"legendbar\">";
  for (int i = 0; i < 100; ++i)
    svg += fmt::format("<rect x=\"{}\" y=\"4\" width=\"4.6\" height=\"14\" fill=\"{}\"/>",
                       56 + i * 4.5, share_color(i / 50.0));
  svg +=
      "<text x=\"56\" y=\"32\" class=\"tick\">0: dead</text>"
      "<text x=\"281\" y=\"32\" class=\"tick\" text-anchor=\"middle\">1: fair share (1/E)</text>"
      "<text x=\"506\" y=\"32\" class=\"tick\" text-anchor=\"end\">≥ 2: twice its "
      "share</text>"
      "<line x1=\"56\" x2=\"68\" y1=\"45\" y2=\"45\" class=\"event\"/>"
      "<text x=\"72\" y=\"48\" class=\"tick\">dashed red line: a collapse warning (console and "
      "events.jsonl) at that step</text></svg>";
  return svg;
}

}  // namespace

Series load_series(const std::vector<LoadRecord>& points, const LoadValue& value,
                   const std::string& name, const std::string& color) {
  Series out{name, color, {}};
  // One point per window of ~1% of the run keeps the curves readable.
  const size_t stride = std::max<size_t>(1, points.size() / 100);
  for (size_t i = 0; i < points.size(); i += stride) {
    double sum = 0;
    int n = 0;
    const size_t hi = std::min(points.size(), i + stride);
    for (size_t j = i; j < hi; ++j)
      if (const auto v = value(points[j])) sum += *v, ++n;
    if (n > 0) out.points.emplace_back(points[hi - 1].step, sum / n);
  }
  return out;
}

std::string render_report(const RunLogs& logs, const ReportStatus* running) {
  const StepAxis axis(static_cast<double>(logs.last_step()));
  std::vector<int64_t> all_events;
  for (const auto& c : logs.collapses) all_events.push_back(c.step);

  std::string html = page_head(
      "minimind-cpp report: " + logs.run_dir,
      running
          ? fmt::format("<meta http-equiv=\"refresh\" content=\"{}\"/>", running->refresh_seconds)
          : "");
  html += "<h1>minimind-cpp run " + esc(logs.run_dir) + " — step " +
          std::to_string(logs.last_step()) + "</h1>\n";
  if (running)
    html += fmt::format(
        "<p class=\"running\">running: step {} of {}, written {}; this page reloads every {} "
        "s</p>\n",
        running->step, running->max_steps, esc(running->written_at), running->refresh_seconds);
  if (logs.init) html += "<p>Started from " + esc(logs.init->message) + ".</p>\n";

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
    std::vector<Series> maxvio, entropy, spread, z, dropped, mi, token_entropy, grad_lm, grad_bal,
        exchange, similarity, margin, change;
    for (const auto& entry : logs.train_load) {
      // Not a structured binding: C++17 lambdas (add, below) cannot capture one (clang).
      const std::vector<LoadRecord>& points = entry.second;
      const int64_t layer = entry.first;
      const std::string name = "L" + std::to_string(layer);
      const std::string& color = series_color(static_cast<size_t>(layer));
      auto add = [&](std::vector<Series>& to, const LoadValue& value) {
        Series s = load_series(points, value, name, color);
        if (!s.points.empty()) to.push_back(std::move(s));
      };
      add(maxvio, [](const LoadRecord& r) { return std::optional<double>(r.max_vio); });
      add(entropy, [](const LoadRecord& r) { return std::optional<double>(r.entropy); });
      add(spread, [](const LoadRecord& r) { return r.stats.seq_max_vio; });
      add(z, [](const LoadRecord& r) { return r.stats.z; });
      add(dropped, [](const LoadRecord& r) { return r.dropped; });
      add(mi, [](const LoadRecord& r) { return r.mi; });
      add(token_entropy, [](const LoadRecord& r) { return r.token_entropy; });
      // Gradient norms span orders of magnitude (#858: ~1e-9 against ~1e-3): log10.
      const auto log10_of = [](const std::optional<double>& v) {
        return v && *v > 0 ? std::optional<double>(std::log10(*v)) : std::nullopt;
      };
      add(grad_lm, [&](const LoadRecord& r) { return log10_of(r.stats.grad_lm); });
      add(grad_bal, [&](const LoadRecord& r) { return log10_of(r.stats.grad_balance); });
      add(exchange, [](const LoadRecord& r) {
        const double f = r.stats.exchange ? overload_factor(*r.stats.exchange) : 0;
        return f > 0 ? std::optional<double>(f) : std::nullopt;
      });
      add(similarity, [](const LoadRecord& r) { return r.stats.expert_similarity_mean; });
      add(margin, [](const LoadRecord& r) { return r.stats.margin; });
      add(change, [](const LoadRecord& r) { return r.stats.routing_change; });
    }
    html +=
        line_chart("MaxVio per layer (0 = balanced, E-1 = collapsed)", maxvio, all_events, axis) +
        line_chart("Normalised entropy per layer (1 = balanced, 0 = collapsed)", entropy,
                   all_events, axis);
    if (!spread.empty())
      html += line_chart("Worst sequence's MaxVio per layer, per step", spread, all_events, axis);
    if (!z.empty())  // router health: growing logits make routing brittle (ST-MoE)
      html += line_chart("Router z per layer (mean of logsumexp(logits)²)", z, {}, axis);
    if (!exchange.empty())  // expert parallelism: the all-to-all waits for the busiest rank
      html += line_chart(
          "Experts over ranks: overload factor, most token rows a rank received / the mean, per "
          "layer (1 = even)",
          exchange, {}, axis);
    if (!margin.empty())  // near-ties flip with any small change of the weights
      html += line_chart("Routing margin per layer (chosen − best unchosen score)", margin,
                         all_events, axis);
    if (!change.empty())  // settling routers re-route fewer of the same tokens
      html += line_chart("Probe tokens re-routed since the last log step, per layer", change,
                         all_events, axis);
    if (!similarity.empty())  // upcycled experts start as copies (1) and separate
      html += line_chart("Expert similarity per layer (mean pair cosine; 1 = copies)", similarity,
                         all_events, axis);
    html += "</div>\n";
    html += router_section(mi, token_entropy, grad_lm, grad_bal, logs.uninformative, axis);
    html += balancing_section(logs, dropped, axis);
  }
  // The routing analysis the trainer wrote at the end of the run (validation split).
  if (const auto analysis = read_analysis(logs.run_dir)) html += analysis_sections(*analysis);
  html += "<h2>Collapse and router warnings</h2>";
  if (logs.collapses.empty() && logs.uninformative.empty()) {
    html += "<p>None.</p>";
  } else {
    html += "<table><tr><th>step</th><th>layer</th><th>warning</th></tr>";
    for (const auto& c : logs.collapses)
      html += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td></tr>", c.step, c.layer,
                          esc(c.message));
    for (const auto& u : logs.uninformative)
      html += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td></tr>", u.step, u.layer,
                          esc(u.message));
    html += "</table>";
  }
  return html + "\n</body></html>\n";
}

std::string write_report(const std::string& run_dir, const ReportStatus* running) {
  const std::string path = run_dir + "/report.html";
  write_file_atomic(path, render_report(read_run_logs(run_dir), running));
  return path;
}

}  // namespace minimind
