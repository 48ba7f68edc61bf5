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

// Quantile balancing (torchtitan's QuantileBalancer, Megatron-LM PR #6637; docs/moe-routing.md,
// "Quantile balancing"). Each token's cutoff is the (k+1)-th largest of score + bias, and
// r = cutoff - score the bias an expert would need to be chosen; the step's r decide each
// expert's new bias, the quantile of its column that admits its share N*k/E, mean-centred.
//
// The histogram of r [n, E] (real tokens): [E, bins] int64 over [min b - 1, max b + 1], which
// holds every r when scores are in [0, 1]; values outside fall in the end bins.
torch::Tensor quantile_histogram(const torch::Tensor& required, const torch::Tensor& bias,
                                 int64_t bins);
// The width of the histogram's bins for `bias` (float32, as the binning computes it).
double quantile_bin_width(const torch::Tensor& bias, int64_t bins);
// The solved bias [E] float64, mean-centred, from the step's histogram [E, bins] (summed over
// micro-batches and ranks) made with bins of `width`: per expert, the position where its
// cumulative count reaches target = N*k/E, interpolated linearly inside the crossing bin.
torch::Tensor quantile_bias_from_histogram(const torch::Tensor& histogram, double width, int64_t k);
// The same from the step's r [N, E] themselves, not centred: per expert the ceil(N*k/E)-th smallest
// r, the histogram's limit as bins shrink, which meets #(r < b) <= N*k/E <= #(r <= b).
torch::Tensor quantile_bias_exact(const torch::Tensor& required, int64_t k);
// Replaces bias [E] (float32) by the solved one from the step's statistic (MoEStats::qb,
// summed or stacked over the step), blended as b = ema * b_old + (1 - ema) * b_solved and
// mean-centred. A step without tokens leaves it.
void update_quantile_bias(torch::Tensor& bias, const torch::Tensor& stat, const BalancingOptions& b,
                          int64_t k);

// A hash-routed layer's table [vocab, k] int64: token t goes to experts tid2eid[t].
// round_robin: (t + j) mod E (Megatron-LM's moe_n_hash_layers); random: the k largest of a
// uniform draw per token from torch's generator (torchtitan's DeepSeek-V4).
torch::Tensor hash_routing_table(HashTable kind, int64_t vocab, int64_t num_experts, int64_t k);

// Max over the batch's rows of each row's MaxVio, (max c - mean c) / mean c of the row's
// real-token assignments; rows without a real token are left out (0 if none is left).
// index [N, k]; real [N] bool or undefined (all real).
double sequence_max_vio(const torch::Tensor& index, const torch::Tensor& real, int64_t rows,
                        int64_t num_experts);

}  // namespace minimind
