// Expert counts per MoE layer: how many (token, slot) assignments each expert received,
// and the sums of the router's probabilities (RouterSums, learned routers only), summed
// over whatever was seen (a step's micro-batches, a log interval, an evaluation, every rank).
#pragma once

#include <cstdint>
#include <vector>

#include "minimind/run/routing_metrics.h"

namespace at {
class Tensor;  // torch::Tensor; this header stays free of torch for the observers
}

namespace minimind {

class Distributed;

struct ExpertCounts {
  std::vector<std::vector<int64_t>> layers;  // [MoE layer][expert]
  std::vector<RouterSums> router;            // [MoE layer][E + 3]; empty without a learned router

  // Zero counts (and router sums) of the given shape: a rank that saw no batch still joins
  // a sum over ranks with the same number of values as the others.
  static ExpertCounts zeros(size_t num_layers, size_t num_experts, bool router = false);

  void add(const std::vector<at::Tensor>& per_layer);         // one forward: [E] int64 per layer
  void add_router(const std::vector<at::Tensor>& per_layer);  // one forward: [E + 3] float64
  void add(const ExpertCounts& other);
  bool empty() const { return layers.empty(); }
  // The router metrics of layer l (zeros when there are no router sums).
  RouterInfo router_info(size_t l) const {
    return l < router.size() ? minimind::router_info(router[l]) : RouterInfo{};
  }
  // The counts (the router sums are floating-point: compare their metrics with a tolerance).
  friend bool operator==(const ExpertCounts& a, const ExpertCounts& b) {
    return a.layers == b.layers;
  }
};

// Sums `counts` and `totals` (tokens, documents, ...) over the ranks in one all-reduce; every
// rank gets the sums. Every rank must pass the same shapes.
void sum_over_ranks(ExpertCounts& counts, std::vector<int64_t>& totals, Distributed& dist);

}  // namespace minimind
