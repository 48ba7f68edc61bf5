// Mixture-of-Experts feed-forward. With the default config it is MiniMind-3's: a softmax
// router over E SwiGLU experts, top-k per token, optional renormalisation of the k weights,
// MiniMind's micro-batch aux loss. The balancing lab's switches (docs/moe-routing.md,
// "Balancing methods, exactly") change one step each: the scores (sigmoid), the choice
// (selection bias, random or hash routers), the capacity (token dropping), the losses
// (sequence/global aux scope, router z-loss) and the output (shared experts).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <vector>

#include "minimind/config.h"
#include "minimind/model/feed_forward.h"
#include "minimind/util/side_by_side.h"

namespace minimind {

// A forward over one shard of a micro-batch (some of its rows), run side by side with the
// other shards (train_step.cpp): every mean over the micro-batch divides by the whole
// micro-batch's count, and the expert shares the micro-batch aux loss reads are summed
// over the shards, so the shards' losses add up to the micro-batch's loss. Not for
// capacity (which ranks the whole batch's tokens), the random router or dropout (which
// draw from torch's one generator); batch_shards() says when shards are allowed.
struct BatchShard {
  int index = 0;                // this shard, 0 .. group->size() - 1
  ShardGroup* group = nullptr;  // the micro-batch's shards
  int64_t rows = 0;             // B of the whole micro-batch
  int64_t tokens = 0;           // B * T of the whole micro-batch
  int64_t targets = 0;          // labels the LM loss counts (labels[:, 1:] != -100), all rows
  // In place: the sum of `t` over the shards (each shard calls it), then `then` once.
  void sum(torch::Tensor& t, const std::function<void(torch::Tensor&)>& then = {}) const {
    group->sum(index, t, then);
  }
};

struct MoEOutput {
  torch::Tensor y;         // [B, T, H]
  torch::Tensor aux_loss;  // [] scaled by router_aux_loss_coef; 0 in eval, with coef 0, and for
                           // the global scope (which the model computes over the whole step)
  torch::Tensor z_loss;    // [] scaled by router_z_loss_coef; 0 in eval or with coef 0
  torch::Tensor z;       // [] mean_t logsumexp(x_t)^2, detached; undefined without a learned router
  torch::Tensor counts;  // [E] int64: (token, slot) assignments per expert, real tokens only,
                         // counted before any dropping (the router's choice)
  torch::Tensor index;   // [N, k] int64: the chosen experts of each of the N = B*T tokens
  torch::Tensor
      keep;  // [N, k] bool: false where capacity dropped the slot; undefined when dropless
  torch::Tensor dropped;  // [] int64: dropped assignments of real tokens; undefined when dropless
  // Learned router only (undefined otherwise), detached: the scores over all E experts
  // (normalised sigmoid scores with sigmoid scoring) and their sums over the real tokens,
  // [sum_t p_t (E), sum_t H(p_t), sum_t of p_t over its chosen experts, T] (RouterSums).
  torch::Tensor probs;        // [N, E]
  torch::Tensor router_sums;  // [E + 3] float64
  // Global aux scope only (training, coef > 0): what the model needs to compute the loss
  // over the step's micro-batches and ranks.
  torch::Tensor route_counts;  // [E] float64: assignments per expert of all N tokens
  torch::Tensor probs_mean;    // [E] mean_t p_{t,e}, with its graph
};

class MOEFeedForwardImpl : public torch::nn::Module {
 public:
  explicit MOEFeedForwardImpl(const ModelConfig& cfg);

  // x: [B, T, H]. real: [B*T] bool, false at padding positions, which are routed and
  // computed like any token (as MiniMind does) but left out of `counts`; undefined = all
  // real. token_ids: [B*T] int64, read by the hash router only. stats = false (generation
  // with the KV cache, where nobody reads them) skips z, probs and router_sums. shard: x
  // is one shard of the micro-batch (losses are this shard's part of the micro-batch's).
  MoEOutput forward(const torch::Tensor& x, const torch::Tensor& real = {},
                    const torch::Tensor& token_ids = {}, bool stats = true,
                    const BatchShard* shard = nullptr);

  // Aux-loss-free balancing: b_e += u * sign(mean(c) - c_e) from one optimizer step's
  // counts (all micro-batches and ranks). No-op unless router_bias_update_rate > 0.
  void update_bias(const std::vector<int64_t>& step_counts);
  // The selection bias [E] (float32); undefined unless router_bias_update_rate > 0.
  torch::Tensor bias() const { return bias_; }

  torch::nn::Linear gate{nullptr};  // router, H -> E, no bias; only for the learned router
  torch::nn::ModuleList experts{nullptr};
  torch::nn::ModuleList shared_experts{nullptr};  // only when n_shared_experts > 0

 private:
  // [N, k] expert ids and mixing weights, and the scores p [N, E] the aux losses read.
  struct Routing {
    torch::Tensor index, weight, probs, logits;
  };
  Routing route(const torch::Tensor& x_flat, const torch::Tensor& token_ids);
  // [N, k] bool: the assignments within each expert's capacity.
  torch::Tensor capacity_keep(const torch::Tensor& index, const torch::Tensor& weight) const;
  torch::Tensor aux_loss(const Routing& r, int64_t batch, const BatchShard* shard) const;
  // The routed experts' weighted sum [N, H] for x_flat [N, H]; sets out.keep (capacity)
  // and chosen_counts [E], the router's choices per expert before dropping.
  torch::Tensor dispatch(const torch::Tensor& x_flat, const Routing& r, MoEOutput& out,
                         torch::Tensor& chosen_counts);

  std::vector<FeedForward> expert_list_;  // typed views of `experts` and `shared_experts`
  std::vector<FeedForward> shared_list_;
  ModelConfig cfg_;
  int64_t num_experts_, top_k_;
  torch::Tensor bias_;  // buffer "gate.e_score_correction_bias", as HF DeepSeek-V3 names it
};
TORCH_MODULE(MOEFeedForward);

}  // namespace minimind
