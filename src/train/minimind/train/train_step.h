// One optimizer step as MiniMind's trainer does it: accumulation_steps micro-batches,
// each backpropagating (LM loss + aux loss summed over MoE layers) / accumulation_steps;
// then global grad-norm clipping and the optimizer step.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <vector>

#include "minimind/compute_plan.h"
#include "minimind/data/batcher.h"
#include "minimind/dist/distributed.h"
#include "minimind/model/minimind_model.h"
#include "minimind/run/parallel_context.h"
#include "minimind/train/observer.h"
#include "minimind/train/step_stats.h"

namespace minimind {

struct StepOptions {
  int64_t accumulation_steps = 1;
  double grad_clip = 1.0;  // 0: no clipping
  double lr = 0;
  // Several ranks: after the last micro-batch the gradients are averaged over the ranks
  // (once per optimizer step, as DDP with no_sync does), losses and aux losses are averaged
  // and expert counts and tokens summed, so every rank returns the same StepStats and takes
  // the same step. Expert parallelism: the routed experts' gradients are summed over the
  // ranks holding the same experts, the grad norm spans the expert group.
  ParallelContext parallel;
  // Also measure, per MoE layer with a learned router, the norms of the router weight's
  // gradient from the LM loss and from the balancing losses (aux + z) apart
  // (LayerStats::grad_lm / grad_balance); the trainer asks at log steps only.
  bool router_grads = false;
  // Also measure, per MoE layer, how alike its routed experts' weights are after the step
  // (LayerStats::expert_similarity); the trainer asks at log steps only.
  bool expert_similarity = false;
  // > 1: each micro-batch is trained in that many row ranges side by side, one core each
  // (side_by_side.h); the losses, counts and gradients are the micro-batch's within float
  // rounding, and the same bits run after run. The compute plan says how many (compute_plan.h).
  int shards = 1;
  // false: the selection biases stay as they are (a frozen router, train.freeze).
  bool update_router_bias = true;
};

// Live routing change (LayerStats::routing_change): a fixed probe batch, re-routed in eval
// mode whenever measure() is called (the trainer: once with the weights a run starts from,
// then at log steps); per MoE layer the share of its real tokens whose top-k set differs
// from the previous call's (nothing is set at the first call). The previous call's choices
// are monitor state, kept in checkpoints, so a resumed run logs what an uninterrupted one
// would. Under expert parallelism every rank of the group must call it at the same steps.
class RoutingChange : public Observer {
 public:
  // probe_starts: the rows' conversation starts when they are packed (Batch::starts).
  explicit RoutingChange(torch::Tensor probe_ids, torch::Tensor probe_starts = {})
      : ids_(std::move(probe_ids)), starts_(std::move(probe_starts)) {}
  void measure(MiniMindForCausalLM& model, std::vector<LayerStats>& layers);
  void save_state(nlohmann::json& into) const override;
  void restore_state(const nlohmann::json& from) override;

 private:
  torch::Tensor ids_;                // [B, T] int64
  torch::Tensor starts_;             // [B, T] int64 or undefined
  std::vector<torch::Tensor> last_;  // per MoE layer: [n, k] each real token's sorted choice
};

// Sets the learning rate, runs the micro-batches and, if loss and gradient norm are
// finite, clips and steps (then zeroes the gradients). A non-finite step changes no
// parameter, so the caller can stop with the last good state intact.
StepStats optimizer_step(MiniMindForCausalLM& model, torch::optim::Optimizer& optimizer,
                         const std::function<Batch()>& next_batch, const StepOptions& options);

}  // namespace minimind
