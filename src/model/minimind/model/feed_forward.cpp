#include "minimind/model/feed_forward.h"

namespace minimind {

FeedForwardImpl::FeedForwardImpl(int64_t hidden_size, int64_t intermediate_size) {
  auto linear = [](int64_t in, int64_t out) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
  };
  // Registration order follows MiniMind's FeedForward.__init__.
  gate_proj = register_module("gate_proj", linear(hidden_size, intermediate_size));
  down_proj = register_module("down_proj", linear(intermediate_size, hidden_size));
  up_proj = register_module("up_proj", linear(hidden_size, intermediate_size));
}

torch::Tensor FeedForwardImpl::forward(const torch::Tensor& x) {
  return down_proj(torch::silu(gate_proj(x)) * up_proj(x));
}

}  // namespace minimind
