// The language-model loss: cross-entropy of the logits at position t against the label at
// t + 1 (-100: ignored), as MiniMind's cross_entropy(logits[:, :-1], labels[:, 1:]) —
// without shifting the logits.
//
// Why not call cross_entropy on logits[:, :-1]: the slice is not contiguous, so its reshape
// copies the [B, T-1, V] logits, and its backward zeroes a [B, T, V] gradient to fill all
// but the last position; nll_loss's backward zeroes another [B, T-1, V] one-hot gradient
// that log_softmax's backward then reads. Here log_softmax runs over every position (each
// row on its own, so the rows are the same), nll_loss over the picked log-probabilities
// (the same values in the same order, so the same sum), and the backward writes the
// gradient once, in place of the saved log-probabilities: exp(lsm) * -v, plus v at each
// label, v = -grad / count. Those are log_softmax's and nll_loss's backward formulas, so
// the loss and the gradient are the numbers the sliced form gives (tested bitwise at
// V = 6400). At a vocabulary that is not a multiple of the vector width the gradient can
// differ by an ulp (seen at V = 37 with 600 rows, not with 27); the likely cause is that
// the exp here runs over the whole [rows, V] buffer while log_softmax's backward runs row
// by row, so some elements take ATen's vector exp in one and its scalar tail in the other.
#pragma once

#include <torch/torch.h>

#include "minimind/model/node_choice.h"

namespace minimind {

// logits: [B, T, V] float; labels: [B, T] int64. Returns the mean over the counted
// positions (mean = true) or their sum (evaluation). node: the model's choice for its head;
// our loops (the formulas of ATen's kernels) run where it takes our node, ATen's otherwise.
torch::Tensor next_token_loss(const torch::Tensor& logits, const torch::Tensor& labels,
                              bool mean = true, NodeChoice node = NodeChoice::aten);

// Training's head and loss in one node where the products leave ATen (bf16, or fp32 on
// oneDNN): next_token_loss(project(h, w)) (h [B, T, H] float, w [V, H] float), the same loss
// bit for bit (tested). One pass per row forms the loss and the logits' gradient for a unit
// upstream gradient (rounded to bf16 in bf16); the backward scales its products by the
// upstream gradient, so in bf16 the gradients round as v * bf16(onehot - p), not
// bf16(v * (onehot - p)) (tested against that formula). The logits are not returned.
torch::Tensor head_next_token_loss(const torch::Tensor& h, const torch::Tensor& w,
                                   const torch::Tensor& labels, const Products& products,
                                   bool mean = true);

}  // namespace minimind
