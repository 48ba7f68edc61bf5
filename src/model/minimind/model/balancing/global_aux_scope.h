// The global aux-loss scope (Qwen, Megatron): f_e counted over every micro-batch of the
// optimizer step so far, on every rank, rather than over one micro-batch. It spans a step,
// so it lives beside the step rather than in the model's forward: the trainer makes one
// per optimizer step and hands it each training forward's output, as torchtitan keeps
// routing state in the module and the cross-step part in the optimizer's step.
#pragma once

#include <torch/torch.h>

#include <functional>

#include "minimind/model/minimind_model.h"

namespace minimind {

class GlobalAuxScope {
 public:
  // sum_over_ranks: in place over the job's ranks; empty: one rank.
  explicit GlobalAuxScope(const ModelConfig& cfg,
                          std::function<void(torch::Tensor&)> sum_over_ranks = {});

  // After a training forward of `tokens` input tokens (a shard: its own rows; the shards
  // each keep a scope, alike): adds each MoE layer's global aux loss to out.aux_loss and
  // sets its stats.aux. f_e is this step's counts so far over the tokens counted; P_e stays
  // this micro-batch's. A no-op for other scopes, in eval, and with coef 0.
  void add_to(ForwardOutput& out, int64_t tokens, const BatchShard* shard = nullptr);

 private:
  int64_t num_experts_;
  double coef_;
  std::function<void(torch::Tensor&)> sum_over_ranks_;
  torch::Tensor counts_;  // [L, E] float64 running sum over the step; undefined at its start
  double tokens_ = 0;     // tokens counted in counts_
};

}  // namespace minimind
