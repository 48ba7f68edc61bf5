// Which forward a module runs, fixed when the module is built from the products the compute
// plan chose (util/products.h). Per call only the grad mode and the activation's dtype are
// asked: a reader of the model's constructor knows which forward runs.
//
// Our own nodes (the *Fused autograd functions: attention_fused.cpp, feed_forward_fused.cpp,
// routed_experts_fused.cpp, head_next_token_loss; the norm's and the loss's own passes) run
// where products leave ATen: bf16, or fp32 on oneDNN.
// fp32 on OpenBLAS keeps ATen's forms and PyTorch's numbers bit for bit; our nodes' own e^x
// and order of sums put fp32 on oneDNN a few ulp from them. Evaluation and generation keep
// the plain forms (no gradients to fuse with), except where a module says otherwise.
#pragma once

#include <torch/torch.h>

#include "minimind/util/products.h"

namespace minimind {

enum class NodeChoice {
  aten,             // ATen's ops (and util/matmul.h's products) in every mode
  own_in_training,  // our node while gradients are on, ATen's ops otherwise
  own,              // our node in every mode (the routed experts in bf16)
};

// The usual choice: our node in training where products leave ATen.
inline NodeChoice training_node(const Products& products) {
  return products.leave_aten() ? NodeChoice::own_in_training : NodeChoice::aten;
}

// Whether a module built with `choice` runs our node on activation x now. float64 (the fp64
// tests) always takes ATen's forms.
inline bool runs_own_node(NodeChoice choice, const torch::Tensor& x) {
  if (choice == NodeChoice::aten || x.scalar_type() != torch::kFloat32) return false;
  return choice == NodeChoice::own || torch::GradMode::is_enabled();
}

}  // namespace minimind
