#include "minimind/train/train_step.h"

#include <cmath>

#include "minimind/optim.h"

namespace minimind {

StepStats optimizer_step(MiniMindForCausalLM& model, torch::optim::Optimizer& optimizer,
                         const std::function<Batch()>& next_batch, int64_t accumulation_steps,
                         double grad_clip, double lr) {
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
  s.loss = s.lm_loss + s.aux_loss;
  std::vector<torch::Tensor> params;
  for (auto& group : optimizer.param_groups())
    for (auto& p : group.params()) params.push_back(p);
  s.grad_norm = finish_gradients(params, grad_clip);
  s.finite = std::isfinite(s.loss) && std::isfinite(s.grad_norm);
  if (s.finite) optimizer.step();
  optimizer.zero_grad();
  return s;
}

}  // namespace minimind
