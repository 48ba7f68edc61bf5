// Expert-load statistics of one MoE layer over a window of tokens, with the formulas of
// docs/moe-routing.md, and the terminal row that shows them.
#pragma once

#include <cstdint>
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

// sum[e] += counts[e], growing sum to the size of counts: the one place counts are added
// (steps, log intervals, evaluations, ranks).
void add_counts(std::vector<int64_t>& sum, const std::vector<int64_t>& counts);

// One row for the terminal: bars scaled so a balanced layer is half height.
// e.g. "L2 ▄▄▅▃ max 0.31 e2  maxvio 0.24  cv 0.15  H 0.99  dead 0"
std::string load_row(int64_t layer, const RoutingMetrics& m);

}  // namespace minimind
