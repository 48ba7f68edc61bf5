// The balancing lab's methods, one function each (docs/moe-routing.md, "Balancing methods,
// exactly"): the aux losses of the batch and sequence scopes, capacity with its two drop
// policies, the aux-loss-free selection bias, and the per-sequence MaxVio the trainer logs.
// The global scope, which spans a whole optimizer step, is GlobalAuxScope
// (global_aux_scope.h). The MoE layer (moe_feed_forward.cpp) calls these; the choices come
// typed from the config (choices.h).
#pragma once

#include <torch/torch.h>

#include <vector>

#include "minimind/model/balancing/moe_options.h"
#include "minimind/model/batch_shard.h"

namespace minimind {

// The aux loss of a micro-batch (or a shard's part of it), coef included. batch scope:
// MiniMind's form, which keeps the top-k axis (floor k * coef); sequence scope: MiniMind2's
// seq_aux / DeepSeek-V3's, per row. index [N, k] chosen experts, probs [N, E] the scores,
// rows = B. Not for the global scope.
torch::Tensor aux_loss(const BalancingOptions& b, const torch::Tensor& index,
                       const torch::Tensor& probs, int64_t rows, int64_t num_experts,
                       const BatchShard* shard);

// Shazeer et al. (2017)'s importance loss, coef included: CV² (population variance over the
// squared mean, as tensor2tensor's CVSquared) of each expert's summed gate values
// importance_e = sum over tokens of the weight it mixes expert e with (0 where unchosen),
// over the micro-batch. weight, index [N, k]. A shard: the micro-batch's importance is the
// shards' sum, and each shard's loss is its share of value and gradient (they add up to the
// whole micro-batch's).
torch::Tensor importance_loss(double coef, const torch::Tensor& weight, const torch::Tensor& index,
                              int64_t num_experts, const BatchShard* shard);

// [N, k] bool: the (token, slot) assignments within each expert's capacity
// C = ceil(capacity_factor * k * N / E), ranked by the drop policy.
torch::Tensor capacity_keep(const BalancingOptions& b, const torch::Tensor& index,
                            const torch::Tensor& weight, int64_t num_experts);

// Aux-loss-free balancing: bias_e += rate * sign(mean(c) - c_e) from one optimizer step's
// counts [E] (all micro-batches and ranks).
void update_selection_bias(torch::Tensor& bias, const std::vector<int64_t>& step_counts,
                           double rate);

// Max over the batch's rows of each row's MaxVio, (max c - mean c) / mean c of the row's
// real-token assignments; rows without a real token are left out (0 if none is left).
// index [N, k]; real [N] bool or undefined (all real).
double sequence_max_vio(const torch::Tensor& index, const torch::Tensor& real, int64_t rows,
                        int64_t num_experts);

}  // namespace minimind
