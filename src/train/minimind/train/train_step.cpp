#include "minimind/train/train_step.h"

#include <cmath>

#include "minimind/train/optim.h"

namespace minimind {
namespace {

// Means of the losses and sums of counts and tokens over the ranks (two small all-reduces).
void reduce_stats(StepStats& s, Distributed& dist) {
  std::vector<double> means{s.lm_loss, s.aux_loss};  // [2 + MoE layers]
  means.insert(means.end(), s.layer_aux.begin(), s.layer_aux.end());
  dist.all_reduce_sum(means);
  const double world = dist.world_size();
  s.lm_loss = means[0] / world, s.aux_loss = means[1] / world;
  for (size_t l = 0; l < s.layer_aux.size(); ++l) s.layer_aux[l] = means[2 + l] / world;
  std::vector<int64_t> totals{s.tokens};
  sum_over_ranks(s.counts, totals, dist);
  s.tokens = totals[0];
}

}  // namespace

StepStats optimizer_step(MiniMindForCausalLM& model, torch::optim::Optimizer& optimizer,
                         const std::function<Batch()>& next_batch, int64_t accumulation_steps,
                         double grad_clip, double lr, Distributed* dist) {
  for (auto& group : optimizer.param_groups())
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  StepStats s;
  const double A = static_cast<double>(accumulation_steps);
  for (int64_t micro = 0; micro < accumulation_steps; ++micro) {
    Batch batch = next_batch();
    ForwardOutput out = model(batch.input_ids, batch.labels);
    ((out.loss + out.aux_loss) / A).backward();
    s.lm_loss += out.loss.item<double>() / A;
    s.aux_loss += out.aux_loss.item<double>() / A;
    s.layer_aux.resize(out.layer_aux.size(), 0.0);
    for (size_t l = 0; l < out.layer_aux.size(); ++l)
      s.layer_aux[l] += out.layer_aux[l].item<double>() / A;
    s.counts.add(out.expert_counts);
    s.tokens += batch.input_ids.numel();
  }
  std::vector<torch::Tensor> params;
  for (auto& group : optimizer.param_groups())
    for (auto& p : group.params()) params.push_back(p);
  fill_missing_gradients(params);
  if (dist && dist->world_size() > 1) {
    const double before = dist->comm_seconds();
    dist->average_gradients(params);
    reduce_stats(s, *dist);
    s.comm_seconds = dist->comm_seconds() - before;
  }
  s.loss = s.lm_loss + s.aux_loss;
  s.grad_norm = clip_gradients(params, grad_clip);
  s.finite = std::isfinite(s.loss) && std::isfinite(s.grad_norm);
  if (s.finite) optimizer.step();
  clear_gradients(params);
  return s;
}

}  // namespace minimind
