// The routed experts of a MoE layer as one autograd node: rows already sorted by expert,
// each expert's SwiGLU (down(silu(gate(x)) * up(x))) on its contiguous slice.
//
// Why not call each expert's FeedForward on its slice: autograd then records a slice, three
// linears, a SiLU and a product per expert, and every slice's backward allocates and zeroes
// a gradient of the whole [rows, H] input to fill its own rows. With many small experts
// (E = 64) that was most of the step. Here the forward and backward write into buffers
// allocated once per call, one GEMM per expert and matrix, and the elementwise SiLU and
// product run once over all rows. Each GEMM has the operands, transpositions and output
// layout autograd gives the per-expert path (the gate and up weights' gradients share one
// GEMM, whose rows are the same dot products), so the numbers are the same: the golden
// losses and the parity tests' bitwise logits check it.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "minimind/model/feed_forward.h"

namespace minimind {

// xs: [M, H], the rows of expert 0, then expert 1, ... (counts[e] rows each, summing to M).
// Returns [M, H]: row i is expert(e_i)(xs[i]). Experts without rows get a zero gradient in
// training, as if they had joined the graph (MiniMind's `0 * sum(params)`).
torch::Tensor grouped_experts(const torch::Tensor& xs, const std::vector<int64_t>& counts,
                              const std::vector<FeedForward>& experts);

}  // namespace minimind
