// Mixture-of-Experts feed-forward. With the default config it is MiniMind-3's: a softmax
// router over E SwiGLU experts, top-k per token, optional renormalisation of the k weights,
// MiniMind's micro-batch aux loss. The balancing lab's switches (docs/moe-routing.md,
// "Balancing methods, exactly") change one step each: the scores (sigmoid), the choice
// (selection bias, random or hash routers), the capacity (token dropping), the losses
// (sequence/global aux scope, router z-loss) and the output (shared experts).
#pragma once

#include <torch/torch.h>

#include <vector>

#include "minimind/model/balancing/moe_options.h"
#include "minimind/model/batch_shard.h"
#include "minimind/model/feed_forward.h"
#include "minimind/model/layer_stats.h"

namespace minimind {

// What a MoE layer reports besides its output: the scalar statistics (layer_stats.h) and
// the tensors the load counts, the routing analysis and the parity checks read.
struct MoEStats {
  LayerStats stats;      // aux, z, dropped, seq_max_vio of this forward
  torch::Tensor counts;  // [E] int64: (token, slot) assignments per expert, real tokens only,
                         // counted before any dropping (the router's choice)
  torch::Tensor index;   // [N, k] int64: the chosen experts of each of the N = B*T tokens
  torch::Tensor keep;    // [N, k] bool: false where capacity dropped the slot; undefined
                         // when dropless
  // Learned router only (undefined otherwise), detached: the scores over all E experts
  // (normalised sigmoid scores with sigmoid scoring) and their sums over the real tokens,
  // [sum_t p_t (E), sum_t H(p_t), sum_t of p_t over its chosen experts, T] (RouterSums).
  torch::Tensor probs;        // [N, E]
  torch::Tensor router_sums;  // [E + 3] float64
  // Quantile balancing (training only): what this forward adds to the step's estimate of
  // each expert's quantile; real tokens only. histogram: [E, qb_num_bins] int64 counts of
  // r = cutoff - score; exact: [n, E] float32, the r of each real token.
  torch::Tensor qb;
  // Global aux scope only (training, coef > 0): what GlobalAuxScope needs to compute the
  // loss over the step's micro-batches and ranks.
  torch::Tensor route_counts;  // [E] float64: assignments per expert of all N tokens
  torch::Tensor probs_mean;    // [E] mean_t p_{t,e}, with its graph
};

struct MoEOutput {
  torch::Tensor y;         // [B, T, H]
  torch::Tensor aux_loss;  // [] coef included; 0 in eval, with coef 0, and for the global
                           // scope (GlobalAuxScope computes it over the whole step)
  torch::Tensor z_loss;    // [] coef included; 0 in eval or with coef 0
  MoEStats stats;
};

class MOEFeedForwardImpl : public torch::nn::Module {
 public:
  explicit MOEFeedForwardImpl(const MoEOptions& options);

  // x: [B, T, H]. real: [B*T] bool, false at padding positions, which are routed and
  // computed like any token (as MiniMind does) but left out of `counts`; undefined = all
  // real. token_ids: [B*T] int64, read by the hash router only. stats = false (generation
  // with the KV cache, where nobody reads them) skips z, probs and router_sums. shard: x
  // is one shard of the micro-batch (losses are this shard's part of the micro-batch's,
  // batch_shard.h).
  MoEOutput forward(const torch::Tensor& x, const torch::Tensor& real = {},
                    const torch::Tensor& token_ids = {}, bool stats = true,
                    const BatchShard* shard = nullptr);

  // The selection bias after an optimizer step, from the step's figures (all micro-batches
  // and ranks): the sign rule from its counts (update_selection_bias), quantile balancing
  // from its MoEStats::qb, summed or stacked (update_quantile_bias). No-op without a bias.
  void update_bias(const std::vector<int64_t>& step_counts, const torch::Tensor& qb);
  // The selection bias [E] (float32); undefined without one (the sign rule's rate 0 and no
  // quantile balancing, or a hash-routed layer).
  torch::Tensor bias() const { return bias_; }
  // Hash-routed layer: the token -> experts table [V, k] int64 (buffer gate.tid2eid);
  // undefined otherwise.
  torch::Tensor hash_table() const { return tid2eid_; }

  // Expert parallelism (apply_expert_parallel): keeps only the routed experts of shard
  // exchange.index() of exchange.size(), with the weights they have, and from then on
  // exchanges rows over `exchange`, so every rank of the group must run the same forwards in
  // step. The shard and its exchange are set together: a layer holds all its experts, or a
  // shard and the exchange that reaches the others. Once per layer.
  void keep_expert_shard(ExpertExchange& exchange);
  const ExpertShard& shard() const { return opt_.shard; }
  // Routed expert e (a global id this process holds).
  FeedForward expert(int64_t e) const;
  // The routed experts' forward, chosen when the layer was built (experts_node).
  NodeChoice experts_node() const { return experts_node_; }

  torch::nn::Linear gate{nullptr};  // router, H -> E, no bias; only for the learned router
  // The routed experts this process holds, each under its global id ("experts.5" is expert
  // 5 whichever rank holds it), so that parameter names are the whole model's.
  std::shared_ptr<torch::nn::Module> experts;
  torch::nn::ModuleList shared_experts{nullptr};  // only when n_shared_experts > 0

 private:
  // [N, k] expert ids and mixing weights, and the scores p [N, E] the aux losses read.
  struct Routing {
    torch::Tensor index, weight, probs, logits;
    torch::Tensor required;   // quantile balancing, training: [N, E] cutoff - score
    torch::Tensor chosen_by;  // stats only: [N, E] detached, what top-k chose by (score + bias)
    torch::Tensor top;        // quantile balancing, training: [N, k+1] the top of chosen_by
  };
  // stats: also keep what the margin statistic reads (chosen_by).
  Routing route(const torch::Tensor& x_flat, const torch::Tensor& token_ids, bool stats);
  // The routed experts' weighted sum [N, H] for x_flat [N, H]; sets out.keep (capacity)
  // and chosen_counts [E], the router's choices per expert before dropping.
  torch::Tensor dispatch(const torch::Tensor& x_flat, const Routing& r, MoEStats& out,
                         torch::Tensor& chosen_counts, int channel);
  // The experts' rows [M, H] (sorted by expert, counts[e] of expert e) sent to the ranks
  // holding them and their outputs brought back: [M, H] in the same order. Sets
  // stats.exchange to this rank's row of the sent-rows matrix.
  torch::Tensor run_remote(const torch::Tensor& rows, const std::vector<int64_t>& counts,
                           int channel, LayerStats& stats);

  std::vector<FeedForward> expert_list_;  // typed views of `experts` (local ids) and
                                          // `shared_experts`
  std::vector<FeedForward> shared_list_;
  MoEOptions opt_;
  int64_t num_experts_, top_k_;
  NodeChoice experts_node_;
  torch::Tensor bias_;     // buffer "gate.e_score_correction_bias", as HF DeepSeek-V3 names it
  torch::Tensor tid2eid_;  // buffer "gate.tid2eid" [V, k], as DeepSeek-V4 names it
  ExpertExchange* exchange_ = nullptr;
};
TORCH_MODULE(MOEFeedForward);

// The routing margin of each row of x [N, E], float32: its k-th largest value minus its
// (k+1)-th, found from index [N, k], the columns top-k chose (the k largest, ties in any
// order) -> [N]. Bit for bit torch::topk(x, k + 1)'s two values subtracted.
torch::Tensor routing_margins(const torch::Tensor& x, const torch::Tensor& index);

}  // namespace minimind
