// MiniMind's projections (Linear(in, out, bias=False)) and the model's other matrix
// products, in the run's precision on the library util/matmul.h chose, with their backward
// products on the same path.
#pragma once

#include <torch/torch.h>

#include "minimind/choices.h"
#include "minimind/util/matmul.h"

namespace minimind {

inline torch::nn::Linear linear_no_bias(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

// x @ w^T over the last axis (x: [..., in], w: [out, in], a parameter -> [..., out]).
// fp32 on OpenBLAS is ATen's own linear, except a single row (a generated token), which
// takes a matrix-vector product: OpenBLAS's GEMM packs the whole weight into its panel
// layout even for one row, which was most of a generated token's time; its GEMV reads the
// weight once.
torch::Tensor project(const torch::Tensor& x, const torch::Tensor& w, Precision precision);
inline torch::Tensor project(const torch::Tensor& x, const torch::Tensor& w) {
  return project(x, w, product_settings().precision);
}

// Whether bf16 training's own nodes (attention, feed-forward, head and loss) take the float32
// activation x: products in bf16 and gradients on. Evaluation and generation, and float64,
// keep the plain forms.
inline bool bf16_training_node(const torch::Tensor& x) {
  return product_settings().precision == Precision::bf16 && x.scalar_type() == torch::kFloat32 &&
         torch::GradMode::is_enabled();
}

// Whether the training nodes shared by both precisions (attention, head and loss) take the
// float32 activation x: gradients on and products outside ATen, in bf16 or in fp32 on
// oneDNN. fp32 on OpenBLAS keeps ATen's forms and PyTorch's numbers bit for bit; these
// nodes' own e^x and order of sums put fp32 on oneDNN a few ulp from them.
inline bool own_training_node(const torch::Tensor& x) {
  return products_leave_aten(product_settings().precision) && x.scalar_type() == torch::kFloat32 &&
         torch::GradMode::is_enabled();
}

// a [..., M, K] @ b [..., K, N] with equal leading dimensions (attention's two products).
torch::Tensor batched_product(const torch::Tensor& a, const torch::Tensor& b);

}  // namespace minimind
