// SwiGLU feed-forward as MiniMind: down_proj(silu(gate_proj(x)) * up_proj(x)), no bias.
#pragma once

#include <torch/torch.h>

namespace minimind {

class FeedForwardImpl : public torch::nn::Module {
 public:
  FeedForwardImpl(int64_t hidden_size, int64_t intermediate_size);

  torch::Tensor forward(const torch::Tensor& x);  // [..., H] -> [..., H]

  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(FeedForward);

}  // namespace minimind
