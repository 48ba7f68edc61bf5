// What one optimizer step reports: the numbers every observer of the loop reads.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "minimind/model/layer_stats.h"
#include "minimind/run/expert_counts.h"

namespace minimind {

struct StepStats {
  double loss = 0, lm_loss = 0, aux_loss = 0;  // means over the micro-batches
  double z_loss = 0;                           // router z-loss, mean over the micro-batches
  bool z_loss_on = false;                      // the model trains a router z-loss
  double grad_norm = 0;                        // before clipping
  ExpertCounts counts;                         // per MoE layer, summed over micro-batches
  // Per MoE layer: aux, z, dropped, sequence MaxVio, the bias after the step and the router
  // gradient by source (only when asked), combined as layer_stats.h says.
  std::vector<LayerStats> layers;
  // Per MoE layer, quantile balancing's statistic of the step (MoEStats::qb): histograms
  // summed, exact r stacked, over the micro-batches (then the ranks); undefined elsewhere.
  std::vector<torch::Tensor> qb;
  double router_grad_seconds = 0;  // what measuring them cost
  int64_t tokens = 0;              // input tokens of all micro-batches
  int64_t real_tokens = 0;         // of which not padding
  bool finite = true;              // false: nothing was applied
  double comm_seconds = 0;         // in all-reduces (multi-process runs)
  double micro_seconds = 0;        // forwards and backwards of the micro-batches
  double forward_seconds = 0;      // of which forwards (shards: the first shard's)
  // Expert parallelism, this rank's: the bytes every exchange of the step moved to or from
  // other ranks, and the time in them.
  int64_t exchange_bytes = 0;
  double exchange_seconds = 0;
};

}  // namespace minimind
