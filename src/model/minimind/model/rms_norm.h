// RMSNorm as MiniMind computes it: in float32, w * (x * rsqrt(mean(x^2) + eps)),
// cast back to the input dtype. Weight starts at ones. (A float64 model stays in float64:
// "at least float32", used by the fp64 tests.)
#pragma once

#include <torch/torch.h>

namespace minimind {

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
    weight = register_parameter("weight", torch::ones({dim}));
  }

  torch::Tensor forward(const torch::Tensor& x) {  // [..., dim]
    torch::Tensor xf = x.scalar_type() == torch::kDouble ? x : x.to(torch::kFloat32);
    torch::Tensor normed = xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps_);
    return (weight * normed).to(x.scalar_type());
  }

  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

}  // namespace minimind
