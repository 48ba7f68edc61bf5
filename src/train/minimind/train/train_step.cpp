#include "minimind/train/train_step.h"

#include <cmath>

#include "minimind/train/optim.h"

namespace minimind {
namespace {

// Means of the losses and sums of counts and tokens over the ranks (two small all-reduces).
void reduce_stats(StepStats& s, Distributed& dist) {
  const size_t L = s.layer_aux.size();
  torch::Tensor means = torch::empty({static_cast<int64_t>(2 + L)}, torch::kFloat64);  // [2 + L]
  double* m = means.data_ptr<double>();
  m[0] = s.lm_loss, m[1] = s.aux_loss;
  for (size_t l = 0; l < L; ++l) m[2 + l] = s.layer_aux[l];
  dist.all_reduce_sum(means);
  s.lm_loss = m[0] / dist.world_size(), s.aux_loss = m[1] / dist.world_size();
  for (size_t l = 0; l < L; ++l) s.layer_aux[l] = m[2 + l] / dist.world_size();

  std::vector<int64_t> flat{s.tokens};
  for (const auto& c : s.counts) flat.insert(flat.end(), c.begin(), c.end());
  torch::Tensor sums = torch::tensor(flat, torch::kLong);  // [1 + sum of experts]
  dist.all_reduce_sum(sums);
  const int64_t* v = sums.data_ptr<int64_t>();
  s.tokens = *v++;
  for (auto& c : s.counts)
    for (auto& x : c) x = *v++;
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
    s.counts.resize(out.expert_counts.size());
    for (size_t l = 0; l < out.expert_counts.size(); ++l) {
      s.layer_aux[l] += out.layer_aux[l].item<double>() / A;
      const torch::Tensor& c = out.expert_counts[l];
      s.counts[l].resize(c.numel(), 0);
      for (int64_t e = 0; e < c.numel(); ++e) s.counts[l][e] += c.data_ptr<int64_t>()[e];
    }
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
