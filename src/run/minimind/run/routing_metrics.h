// Expert-load statistics of one MoE layer over a window of tokens, with the formulas of
// docs/moe-routing.md, and the collapse detector that watches them over log intervals.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace minimind {

struct RoutingMetrics {
  std::vector<int64_t> counts;  // c_e: (token, slot) assignments per expert; sum = kT
  std::vector<double> share;    // q_e = c_e / kT
  double max_vio = 0;           // (max c - mean c) / mean c           ideal 0, collapsed E-1
  double cv = 0;                // population std(c) / mean(c)         ideal 0, collapsed sqrt(E-1)
  double entropy = 0;           // H / ln E, H = -sum q ln q            ideal 1, collapsed 0
  double effective_experts = 0; // exp(H)                              ideal E, collapsed 1
  double max_share = 0;         // max q                               ideal 1/E
  int64_t max_expert = 0;       // argmax q
  std::vector<int64_t> dead;    // experts with c_e = 0
  int64_t total = 0;            // kT
};

RoutingMetrics routing_metrics(const std::vector<int64_t>& counts);

// One row for the terminal: bars scaled so a balanced layer is half height.
// e.g. "L2 ▄▄▅▃ max 0.31 e2  maxvio 0.24  cv 0.15  H 0.99  dead 0"
std::string load_row(int64_t layer, const RoutingMetrics& m);

struct CollapseThresholds {
  double max_share = 0.9;     // a layer collapses when one expert takes more than this
  int64_t dead_experts = 1;   // ... or when at least this many experts get no token
  int64_t patience = 3;       // ... for this many consecutive log intervals
};

struct CollapseEvent {
  int64_t step = 0;
  int64_t since_step = 0;  // first step of the streak
  int64_t layer = 0;
  int64_t expert = 0;      // the expert with the largest share
  double max_share = 0;
  std::vector<int64_t> dead;
  std::string message;
};

// Fires once per episode: when a layer has been over a threshold for `patience`
// consecutive windows; re-armed after the layer is back under the thresholds.
class CollapseDetector {
 public:
  explicit CollapseDetector(CollapseThresholds t) : t_(t) {}
  std::optional<CollapseEvent> observe(int64_t layer, int64_t step, const RoutingMetrics& m);

 private:
  struct LayerState {
    int64_t streak = 0, since = 0;
    bool fired = false;
  };
  CollapseThresholds t_;
  std::vector<LayerState> layers_;
};

}  // namespace minimind
