// MiniMind's projections have no bias: Linear(in, out, bias=False).
#pragma once

#include <torch/torch.h>

#include <vector>

namespace minimind {

inline torch::nn::Linear linear_no_bias(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

// x @ w^T over the last axis (x: [..., in], w: [out, in] -> [..., out]). A single row (a
// generated token) takes a matrix-vector product: OpenBLAS's GEMM packs the whole weight
// into its panel layout even for one row, which was most of a generated token's time;
// its GEMV reads the weight once.
inline torch::Tensor project(const torch::Tensor& x, const torch::Tensor& w) {
  if (x.numel() != x.size(-1)) return torch::linear(x, w);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = w.size(0);
  return torch::mv(w, x.reshape({-1})).view(shape);
}

}  // namespace minimind
