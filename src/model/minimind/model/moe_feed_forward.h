// Mixture-of-Experts feed-forward as MiniMind-3: a softmax router over E SwiGLU experts,
// top-k per token, optional renormalisation of the k weights, Switch-style aux loss.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "minimind/config.h"
#include "minimind/model/feed_forward.h"

namespace minimind {

struct MoEOutput {
  torch::Tensor y;         // [B, T, H]
  torch::Tensor aux_loss;  // [] scaled by router_aux_loss_coef; 0 in eval or with coef 0
  torch::Tensor counts;    // [E] int64: (token, slot) assignments per expert, real tokens only
};

class MOEFeedForwardImpl : public torch::nn::Module {
 public:
  explicit MOEFeedForwardImpl(const ModelConfig& cfg);

  // x: [B, T, H]. real: [B*T] bool, false at padding positions, which are routed and
  // computed like any token (as MiniMind does) but left out of `counts`; undefined = all real.
  MoEOutput forward(const torch::Tensor& x, const torch::Tensor& real = {});

  torch::nn::Linear gate{nullptr};  // router, H -> E, no bias
  torch::nn::ModuleList experts{nullptr};

 private:
  std::vector<FeedForward> expert_list_;  // typed view of `experts`
  int64_t num_experts_, top_k_;
  bool norm_topk_prob_;
  double aux_coef_;
};
TORCH_MODULE(MOEFeedForward);

}  // namespace minimind
