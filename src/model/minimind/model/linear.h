// MiniMind's projections have no bias: Linear(in, out, bias=False).
#pragma once

#include <torch/torch.h>

namespace minimind {

inline torch::nn::Linear linear_no_bias(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

}  // namespace minimind
