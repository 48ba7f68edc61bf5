// Small helpers of the module tests, which set weights by hand and work answers out by hand.
#pragma once

#include <torch/torch.h>

#include <cmath>

namespace minimind::test {

// Copies hand-written values into a parameter.
inline void set(torch::Tensor& param, const torch::Tensor& value) {
  torch::NoGradGuard no_grad;
  param.copy_(value.to(param.scalar_type()).view_as(param));
}

inline double silu(double x) {
  return x / (1 + std::exp(-x));
}

}  // namespace minimind::test
