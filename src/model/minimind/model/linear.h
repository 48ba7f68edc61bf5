// MiniMind's projections (Linear(in, out, bias=False)) and the model's other matrix
// products, as the products the module was built with say (precision, fp32 library), with
// their backward products on the same path.
#pragma once

#include <torch/torch.h>

#include "minimind/choices.h"
#include "minimind/util/matmul.h"

namespace minimind {

inline torch::nn::Linear linear_no_bias(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

// x @ w^T over the last axis (x: [..., in], w: [out, in], a parameter -> [..., out]) as
// `products` say. fp32 on OpenBLAS is ATen's own linear, except a single row (a generated
// token), which takes a matrix-vector product: OpenBLAS's GEMM packs the whole weight into
// its panel layout even for one row, which was most of a generated token's time; its GEMV
// reads the weight once.
torch::Tensor project(const torch::Tensor& x, const torch::Tensor& w, const Products& products);

// a [..., M, K] @ b [..., K, N] with equal leading dimensions (attention's two products).
torch::Tensor batched_product(const torch::Tensor& a, const torch::Tensor& b,
                              const Products& products);

}  // namespace minimind
