#include "minimind/train/optim.h"

namespace minimind {

std::unique_ptr<torch::optim::AdamW> make_optimizer(const std::vector<torch::Tensor>& params,
                                                    const TrainConfig& cfg) {
  auto options = torch::optim::AdamWOptions(cfg.learning_rate)
                     .betas({cfg.beta1, cfg.beta2})
                     .eps(cfg.eps)
                     .weight_decay(cfg.weight_decay);
  return std::make_unique<torch::optim::AdamW>(params, options);
}

void fill_missing_gradients(const std::vector<torch::Tensor>& params) {
  for (const auto& p : params) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
  }
}

void clear_gradients(const std::vector<torch::Tensor>& params) {
  for (const auto& p : params) p.mutable_grad() = torch::Tensor();
}

double finish_gradients(const std::vector<torch::Tensor>& params, double max_norm) {
  fill_missing_gradients(params);
  return clip_gradients(params, max_norm);
}

double clip_gradients(const std::vector<torch::Tensor>& params, double max_norm) {
  if (max_norm > 0) return torch::nn::utils::clip_grad_norm_(params, max_norm);
  torch::NoGradGuard no_grad;
  torch::Tensor sq = torch::zeros({}, torch::kFloat64);
  for (const auto& p : params) sq += p.grad().to(torch::kFloat64).pow(2).sum();
  return std::sqrt(sq.item<double>());
}

}  // namespace minimind
