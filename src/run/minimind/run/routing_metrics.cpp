#include "minimind/run/routing_metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace minimind {

RoutingMetrics routing_metrics(const std::vector<int64_t>& counts) {
  RoutingMetrics m;
  m.counts = counts;
  const size_t E = counts.size();
  for (int64_t c : counts) m.total += c;
  m.share.assign(E, 0.0);
  for (size_t e = 0; e < E; ++e)
    if (counts[e] == 0) m.dead.push_back(static_cast<int64_t>(e));
  if (E == 0 || m.total == 0) return m;

  const double mean = static_cast<double>(m.total) / E;
  double var = 0, H = 0;
  for (size_t e = 0; e < E; ++e) {
    const double q = counts[e] / static_cast<double>(m.total);
    m.share[e] = q;
    var += (counts[e] - mean) * (counts[e] - mean);
    if (q > 0) H -= q * std::log(q);
  }
  m.max_expert = std::max_element(counts.begin(), counts.end()) - counts.begin();
  m.max_share = m.share[m.max_expert];
  m.max_vio = (counts[m.max_expert] - mean) / mean;
  m.cv = std::sqrt(var / E) / mean;
  m.entropy = E > 1 ? H / std::log(static_cast<double>(E)) : 1.0;
  m.effective_experts = std::exp(H);
  return m;
}

std::string load_row(int64_t layer, const RoutingMetrics& m) {
  static const char* bars[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  const double E = static_cast<double>(m.counts.size());
  std::string hist;
  for (size_t e = 0; e < m.counts.size(); ++e) {
    if (m.counts[e] == 0) {
      hist += "·";  // dead
      continue;
    }
    // share * E / 2 maps the balanced share 1/E to half height, 2/E and more to full.
    int level = static_cast<int>(std::lround(m.share[e] * E / 2.0 * 8.0)) - 1;
    hist += bars[std::clamp(level, 0, 7)];
  }
  return fmt::format("L{:<2} {}  max {:.2f} e{}  maxvio {:.2f}  cv {:.2f}  H {:.2f}  dead {}", layer,
                     hist, m.max_share, m.max_expert, m.max_vio, m.cv, m.entropy, m.dead.size());
}

std::optional<CollapseEvent> CollapseDetector::observe(int64_t layer, int64_t step,
                                                       const RoutingMetrics& m) {
  if (static_cast<size_t>(layer) >= layers_.size()) layers_.resize(layer + 1);
  LayerState& s = layers_[layer];
  const bool over = m.total > 0 && (m.max_share > t_.max_share ||
                                    static_cast<int64_t>(m.dead.size()) >= t_.dead_experts);
  if (!over) {
    s = LayerState{};
    return std::nullopt;
  }
  if (s.streak++ == 0) s.since = step;
  if (s.streak < t_.patience || s.fired) return std::nullopt;
  s.fired = true;
  CollapseEvent ev;
  ev.step = step;
  ev.since_step = s.since;
  ev.layer = layer;
  ev.expert = m.max_expert;
  ev.max_share = m.max_share;
  ev.dead = m.dead;
  ev.message = fmt::format(
      "routing collapse in layer {} since step {}: expert {} takes {:.1f}% of the tokens "
      "(threshold {:.0f}%), {} dead expert{}{}{} for {} log intervals",
      layer, s.since, m.max_expert, 100 * m.max_share, 100 * t_.max_share, m.dead.size(),
      m.dead.size() == 1 ? "" : "s", m.dead.empty() ? "" : ": ",
      fmt::join(m.dead, ", "), s.streak);
  return ev;
}

}  // namespace minimind
