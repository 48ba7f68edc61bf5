// RMSNorm as MiniMind computes it: in float32, w * (x * rsqrt(mean(x^2) + eps)),
// cast back to the input dtype. Weight starts at ones. (A float64 model stays in float64:
// "at least float32", used by the fp64 tests.)
#pragma once

#include <torch/torch.h>

#include "minimind/model/node_choice.h"

namespace minimind {

// One autograd node for a float32/float64 contiguous input: the forward runs the ATen ops
// of the formula above (so its outputs are the unfused ones, bit for bit), and the backward
// is one pass over the rows instead of the fourteen ops autograd records (pow, mean,
// rsqrt, two products and their backwards, 17 calls per forward of the model). The
// gradients agree with autograd's to float rounding (tested); the weight's gradient is
// summed over rows in double. Other dtypes take the plain formula through autograd.
// In training whose products leave ATen (node.node, node_choice.h: bf16, or fp32 on oneDNN)
// the forward is one pass of its own instead, within float rounding of the formula's (fp32 on
// OpenBLAS keeps the formula's bits); in bf16 with rounded_copy, where the output feeds bf16
// products, that pass also rounds it to bf16 and hands the copy to to_bf16 (remember_bf16).
struct NormNode {
  NodeChoice node = NodeChoice::aten;
  bool bf16 = false;          // the products are bf16: the pass may write rounded copies
  bool rounded_copy = false;  // the output is the input of matrix products
};
// A norm's choice for the compute plan's products.
inline NormNode norm_node(const Products& products, bool rounded_copy = false) {
  return {training_node(products), products.precision == Precision::bf16, rounded_copy};
}
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                       const NormNode& node = {});

// The residual stream's add and the norm after it: sum = a + b, normed = rms_norm(sum).
// With gradients and the fused node's conditions (same shapes, contiguous), one autograd
// node whose backward adds sum's own gradient in the norm's pass (the same bits as the add
// and the norm apart); otherwise the two ops. b undefined: sum is a. grad_copy: b comes from
// products whose backward rounds its gradient to bf16 (a Projection, the dense feed-forward),
// so in bf16 training the norm's backward writes that copy as it forms the gradient.
struct AddNormed {
  torch::Tensor sum, normed;  // [..., dim]
};
AddNormed add_rms_norm(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& weight,
                       double eps, const NormNode& node = {}, bool grad_copy = false);

class RMSNormImpl : public torch::nn::Module {
 public:
  // products: the compute plan's; rounded_copy: the output is the input of matrix products
  // (see rms_norm).
  RMSNormImpl(int64_t dim, double eps, const Products& products = {}, bool rounded_copy = false)
      : eps_(eps), node_(norm_node(products, rounded_copy)) {
    weight = register_parameter("weight", torch::ones({dim}));
  }

  torch::Tensor forward(const torch::Tensor& x) {  // [..., dim]
    return rms_norm(x, weight, eps_, node_);
  }

  // a + b and its norm (add_rms_norm).
  AddNormed forward_add(const torch::Tensor& a, const torch::Tensor& b, bool grad_copy) {
    return add_rms_norm(a, b, weight, eps_, node_, grad_copy);
  }

  const NormNode& node() const { return node_; }

  torch::Tensor weight;

 private:
  double eps_;
  NormNode node_;
};
TORCH_MODULE(RMSNorm);

}  // namespace minimind
