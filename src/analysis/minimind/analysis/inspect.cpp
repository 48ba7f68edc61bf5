#include "minimind/analysis/inspect.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "minimind/run/routing_metrics.h"
#include "minimind/util/glyphs.h"

namespace minimind {

std::string sparkline(const std::vector<double>& values, size_t width) {
  if (values.empty() || width == 0) return "";
  const size_t n = std::min(width, values.size());
  std::vector<double> buckets(n, 0.0);
  for (size_t b = 0; b < n; ++b) {
    const size_t lo = b * values.size() / n, hi = (b + 1) * values.size() / n;
    for (size_t i = lo; i < hi; ++i) buckets[b] += values[i] / static_cast<double>(hi - lo);
  }
  const auto [mn, mx] = std::minmax_element(buckets.begin(), buckets.end());
  std::string out;
  for (double v : buckets) {
    out += bar_glyph(*mx > *mn ? std::lround((v - *mn) / (*mx - *mn) * 7) : 3);
  }
  return out;
}

std::string inspect_text(const RunLogs& logs, size_t width) {
  std::string out = fmt::format("run {} — step {}\n", logs.run_dir, logs.last_step());
  if (logs.init) out += "  started from " + logs.init->message + "\n";
  if (!logs.train.empty()) {
    std::vector<double> loss;
    for (const auto& p : logs.train) loss.push_back(p.loss);
    out += fmt::format("  train loss {:<{}} {:.3f} -> {:.3f}\n", sparkline(loss, width), width,
                       loss.front(), loss.back());
  }
  if (!logs.eval.empty()) {
    std::vector<double> val;
    for (const auto& p : logs.eval) val.push_back(p.val_loss);
    out += fmt::format("  val loss   {:<{}} {:.3f} -> {:.3f} (step {})\n", sparkline(val, width),
                       width, val.front(), val.back(), logs.eval.back().step);
  }
  if (logs.train_load.empty()) return out + "  dense model: no expert load\n";

  for (const auto& [layer, points] : logs.train_load) {
    std::vector<double> maxvio, entropy, share;
    for (const auto& p : points) {
      maxvio.push_back(p.max_vio);
      entropy.push_back(p.entropy);
      share.push_back(p.max_share);
    }
    RoutingMetrics now = routing_metrics(recent_counts(points, 10));
    out += fmt::format("\n  {}   (last 10 steps)\n", load_row(layer, now));
    out += fmt::format("      maxvio    {:<{}} {:.2f} -> {:.2f}\n", sparkline(maxvio, width), width,
                       maxvio.front(), maxvio.back());
    out += fmt::format("      entropy   {:<{}} {:.2f} -> {:.2f}\n", sparkline(entropy, width),
                       width, entropy.front(), entropy.back());
    out += fmt::format("      max share {:<{}} {:.2f} -> {:.2f}\n", sparkline(share, width), width,
                       share.front(), share.back());
    // How alike the experts' weights are (log steps): upcycled experts start at 1.
    std::vector<double> similarity;
    for (const auto& p : points)
      if (p.stats.expert_similarity_mean) similarity.push_back(*p.stats.expert_similarity_mean);
    if (!similarity.empty())
      out += fmt::format("      similarity {:<{}} {:.3f} -> {:.3f} (most alike pair {:.3f})\n",
                         sparkline(similarity, width), width, similarity.front(), similarity.back(),
                         *points.back().stats.expert_similarity_max);
    // Routing margin and live routing change (learned choices; change at log steps).
    std::vector<double> margin, change, overload;
    for (const auto& p : points) {
      if (p.stats.margin) margin.push_back(*p.stats.margin);
      if (p.stats.routing_change) change.push_back(*p.stats.routing_change);
      if (p.stats.exchange) overload.push_back(overload_factor(*p.stats.exchange));
    }
    if (!overload.empty())  // experts over ranks: the busiest rank's rows over the mean
      out += fmt::format("      overload  {:<{}} {:.2f} -> {:.2f} (busiest rank / mean)\n",
                         sparkline(overload, width), width, overload.front(), overload.back());
    if (!margin.empty())
      out += fmt::format("      margin    {:<{}} {:.3f} -> {:.3f} ({:.0f} % under {})\n",
                         sparkline(margin, width), width, margin.front(), margin.back(),
                         100 * points.back().stats.margin_small.value_or(0), kSmallMargin);
    if (!change.empty())
      out += fmt::format("      re-routed {:<{}} {:.3f} -> {:.3f} (probe tokens per log step)\n",
                         sparkline(change, width), width, change.front(), change.back());
    auto ev = logs.eval_load.find(layer);
    if (ev != logs.eval_load.end() && !ev->second.empty())
      out += fmt::format("      eval (step {}): MaxVio_global {:.2f}, entropy {:.2f}, dead {}\n",
                         ev->second.back().step, ev->second.back().max_vio,
                         ev->second.back().entropy, ev->second.back().dead);
  }
  out += "\n";
  if (logs.collapses.empty()) {
    out += "  collapse warnings: none\n";
  } else {
    out += fmt::format("  collapse warnings ({}):\n", logs.collapses.size());
    for (const auto& c : logs.collapses) out += fmt::format("    step {}: {}\n", c.step, c.message);
  }
  return out;
}

}  // namespace minimind
