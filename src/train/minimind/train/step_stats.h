// What one optimizer step reports: the numbers every observer of the loop reads.
#pragma once

#include <cstdint>
#include <vector>

#include "minimind/run/expert_counts.h"

namespace minimind {

struct StepStats {
  double loss = 0, lm_loss = 0, aux_loss = 0;  // means over the micro-batches
  double z_loss = 0;                           // router z-loss, mean over the micro-batches
  double grad_norm = 0;                        // before clipping
  std::vector<double> layer_aux;               // per MoE layer, mean over micro-batches
  ExpertCounts counts;                         // per MoE layer, summed over micro-batches
  // Per MoE layer, the balancing lab's figures (empty when the method is off):
  std::vector<double> layer_z;                  // mean lse^2 of the router logits (learned router)
  std::vector<int64_t> layer_dropped;           // assignments dropped by capacity (real tokens)
  std::vector<double> layer_seq_max_vio;        // max over the step's rows of a row's MaxVio
  std::vector<std::vector<double>> layer_bias;  // the selection bias after this step
  // Router gradient by source, per MoE layer with a learned router (only when asked):
  // ||d LM / d W_gate|| and ||d (aux + z) / d W_gate|| of the step, before clipping.
  std::vector<double> layer_grad_lm, layer_grad_balance;
  double router_grad_seconds = 0;  // what measuring them cost
  int64_t tokens = 0;              // input tokens of all micro-batches
  bool finite = true;              // false: nothing was applied
  double comm_seconds = 0;         // in all-reduces (multi-process runs)
  double micro_seconds = 0;        // forwards and backwards of the micro-batches
  double forward_seconds = 0;      // of which forwards (shards: the first shard's)
};

}  // namespace minimind
