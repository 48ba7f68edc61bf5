#include "minimind/run/routing_metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "minimind/util/glyphs.h"

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

RouterInfo router_info(const RouterSums& sums) {
  RouterInfo r;
  if (sums.size() < 4) return r;
  const size_t E = sums.size() - 3;
  r.tokens = sums[E + 2];
  if (r.tokens <= 0) return r;
  const double lnE = E > 1 ? std::log(static_cast<double>(E)) : 1.0;
  double Hm = 0;
  for (size_t e = 0; e < E; ++e) {
    const double P = sums[e] / r.tokens;
    if (P > 0) Hm -= P * std::log(P);
  }
  r.token_entropy = sums[E] / r.tokens / lnE;
  r.marginal_entropy = Hm / lnE;
  r.mi = r.marginal_entropy - r.token_entropy;
  r.confidence = sums[E + 1] / r.tokens;
  return r;
}

double overload_factor(const std::vector<double>& exchange) {
  const auto n = static_cast<size_t>(std::lround(std::sqrt(static_cast<double>(exchange.size()))));
  if (n == 0 || n * n != exchange.size()) return 0;
  double most = 0, routed = 0;
  for (size_t d = 0; d < n; ++d) {
    double received = 0;
    for (size_t s = 0; s < n; ++s) received += exchange[s * n + d];
    most = std::max(most, received);
  }
  for (double v : exchange) routed += v;
  return routed > 0 ? most / (routed / static_cast<double>(n)) : 0;
}

std::string router_row(const RouterInfo& r) {
  return fmt::format("MI {:.3f}  H̄ {:.2f}  Hm {:.2f}  conf {:.2f}", r.mi, r.token_entropy,
                     r.marginal_entropy, r.confidence);
}

void add_sums(std::vector<double>& sum, const std::vector<double>& values) {
  if (sum.size() < values.size()) sum.resize(values.size(), 0.0);
  for (size_t i = 0; i < values.size(); ++i) sum[i] += values[i];
}

void add_counts(std::vector<int64_t>& sum, const std::vector<int64_t>& counts) {
  if (sum.size() < counts.size()) sum.resize(counts.size(), 0);
  for (size_t e = 0; e < counts.size(); ++e) sum[e] += counts[e];
}

namespace {

// One glyph per expert of [first, last).
std::string histogram(const RoutingMetrics& m, size_t first, size_t last) {
  const double E = static_cast<double>(m.counts.size());
  std::string hist;
  for (size_t e = first; e < last; ++e) {
    if (m.counts[e] == 0) {
      hist += "·";  // dead
      continue;
    }
    // share * E / 2 maps the balanced share 1/E to half height, 2/E and more to full.
    hist += bar_glyph(std::lround(m.share[e] * E / 2.0 * 8.0) - 1);
  }
  return hist;
}

}  // namespace

std::vector<std::string> compact_load_rows(int64_t layer, const RoutingMetrics& m,
                                           const std::optional<RouterInfo>& router) {
  const size_t E = m.counts.size();
  std::vector<std::string> rows;
  std::string hist;
  if (E <= 32) {
    hist = histogram(m, 0, E) + "  ";
  } else {
    for (size_t at = 0; at < E; at += 64)
      rows.push_back(
          fmt::format("L{:<2} e{:<3} {}", layer, at, histogram(m, at, std::min(E, at + 64))));
  }
  rows.push_back(fmt::format("L{:<2} {}max {:.2f} e{}  maxvio {:.2f}  H {:.2f}  dead {}{}", layer,
                             hist, m.max_share, m.max_expert, m.max_vio, m.entropy, m.dead.size(),
                             router ? fmt::format("  MI {:.3f}", router->mi) : ""));
  return rows;
}

std::string load_row(int64_t layer, const RoutingMetrics& m) {
  const std::string hist = histogram(m, 0, m.counts.size());
  return fmt::format("L{:<2} {}  max {:.2f} e{}  maxvio {:.2f}  cv {:.2f}  H {:.2f}  dead {}",
                     layer, hist, m.max_share, m.max_expert, m.max_vio, m.cv, m.entropy,
                     m.dead.size());
}

}  // namespace minimind
