// SwiGLU feed-forward as MiniMind: down_proj(silu(gate_proj(x)) * up_proj(x)), no bias.
#pragma once

#include <torch/torch.h>

#include "minimind/model/node_choice.h"

namespace minimind {

class FeedForwardImpl : public torch::nn::Module {
 public:
  // products: the compute plan's; where they leave ATen, training takes one node with the
  // SwiGLU fused between its products (dense_swiglu below).
  FeedForwardImpl(int64_t hidden_size, int64_t intermediate_size, const Products& products = {});

  torch::Tensor forward(const torch::Tensor& x);  // [..., H] -> [..., H]

  const Products& products() const { return products_; }
  NodeChoice node() const { return node_; }

  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};

 private:
  Products products_;
  NodeChoice node_;
};
TORCH_MODULE(FeedForward);

// The dense feed-forward's fused node (feed_forward_fused.cpp): down(silu(x @ gate^T) *
// (x @ up^T)) as one node where products leave ATen, in `products`' precision: x [N, H]
// float32, gate and up [I, H], down [H, I]; -> [N, H]. The gate and up weights are one [2I, H]
// operand, so one product gives [g | u] and one the input gradient.
torch::Tensor dense_swiglu(const torch::Tensor& x, const torch::Tensor& gate,
                           const torch::Tensor& up, const torch::Tensor& down,
                           const Products& products);

}  // namespace minimind
