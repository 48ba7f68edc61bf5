// Expert-load statistics of one MoE layer over a window of tokens, with the formulas of
// docs/moe-routing.md, and the terminal row that shows them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace minimind {

struct RoutingMetrics {
  std::vector<int64_t> counts;   // c_e: (token, slot) assignments per expert; sum = kT
  std::vector<double> share;     // q_e = c_e / kT
  double max_vio = 0;            // (max c - mean c) / mean c           ideal 0, collapsed E-1
  double cv = 0;                 // population std(c) / mean(c)         ideal 0, collapsed sqrt(E-1)
  double entropy = 0;            // H / ln E, H = -sum q ln q            ideal 1, collapsed 0
  double effective_experts = 0;  // exp(H)                              ideal E, collapsed 1
  double max_share = 0;          // max q                               ideal 1/E
  int64_t max_expert = 0;        // argmax q
  std::vector<int64_t> dead;     // experts with c_e = 0
  int64_t total = 0;             // kT
};

RoutingMetrics routing_metrics(const std::vector<int64_t>& counts);

// What the router's probabilities say, over a window of T real tokens of one layer (p_t over
// all E experts; normalised sigmoid scores with sigmoid scoring). Counts can call a router
// healthy that learns nothing (MiniMind #858); these cannot.
struct RouterInfo {
  double token_entropy = 0;     // H̄ = mean_t H(p_t) / ln E      1: says nothing about any token
  double marginal_entropy = 0;  // H_m = H(mean_t p_t) / ln E     1: mass spread evenly
  double mi = 0;                // H_m - H̄, routing information   ~0: balanced but uninformative
  double confidence = 0;        // mean_t of p_t summed over its top-k   k/E for a uniform router
  double tokens = 0;            // T
};

// The sums the metrics are made of, per layer, so that micro-batches, steps, log intervals
// and ranks add up: [sum_t p_t,e (E values), sum_t H(p_t) (nats), sum_t conf_t, T].
using RouterSums = std::vector<double>;
RouterInfo router_info(const RouterSums& sums);

// The per-rank overload factor of an expert group's exchange matrix [s * n + d] (rows sent
// from rank s to rank d; routing_metrics' LayerStats::exchange): max_d of the rows rank d
// received over mean_s of the rows rank s routed. 1 when every rank's experts get their
// share; 0 for an empty matrix.
double overload_factor(const std::vector<double>& exchange);

// The router part of a terminal row, e.g. "MI 0.21  H̄ 0.80  Hm 0.99  conf 0.43".
std::string router_row(const RouterInfo& r);

// sum[e] += counts[e], growing sum to the size of counts: the one place counts are added
// (steps, log intervals, evaluations, ranks).
void add_counts(std::vector<int64_t>& sum, const std::vector<int64_t>& counts);

// sum[i] += values[i], growing sum: the same for router sums.
void add_sums(std::vector<double>& sum, const std::vector<double>& values);

// One row for the terminal: bars scaled so a balanced layer is half height.
// e.g. "L2 ▄▄▅▃ max 0.31 e2  maxvio 0.24  cv 0.15  H 0.99  dead 0"
std::string load_row(int64_t layer, const RoutingMetrics& m);

// The same for a console of 120 columns: "L0  ▄▆▂▄  max 0.53 e0  maxvio 1.11  H 0.81  dead 0
// MI 0.382" (MI with a learned router). With more than 32 experts the histogram gets lines
// of its own, at most 64 glyphs each, before the figures.
std::vector<std::string> compact_load_rows(int64_t layer, const RoutingMetrics& m,
                                           const std::optional<RouterInfo>& router);

}  // namespace minimind
