// The routed experts of a MoE layer as one autograd node: gather each expert's tokens, its
// SwiGLU (down(silu(gate(x)) * up(x))), and the weighted sum back into the tokens.
//
// Why one node: autograd on the plain form records, per layer, a gather of all N*k
// assigned rows into an [N*k, H] tensor, a slice, three linears, a SiLU and a product per
// expert, a product by the routing weights over [N*k, H] and a scatter-add; its backward
// makes as many [N*k, H] passes again. With fine-grained experts (E = 64, top-16) N*k is 16x
// N and those passes, not the GEMMs, were most of the extra step time (memory-bound on
// this machine). Here each expert is one task (run_blas_tasks, one core each): it gathers
// its tokens' rows into a small buffer that stays in cache, runs its GEMMs into buffers
// allocated once per call, and only the expert outputs and the gradient rows cross memory
// at [N*k, H]; the weighted sums run over tokens, split among the cores.
//
// Numbers: the same bits as the plain form run with one OpenBLAS thread. Each GEMM has
// the operands, transpositions and output layout autograd gives the plain form (the gate
// and up weights' gradients share one GEMM, whose rows are the same dot products), the
// routing weights' gradient is the same ATen product and row sum, and each token adds its
// rows in the plain form's order (ascending expert), each product rounded before its sum.
// (OpenBLAS may round a GEMM summing over many rows, as a weight gradient does, differently
// with two threads than with one; the experts now always run one-threaded, so their
// numbers no longer depend on the thread count.)
#pragma once

#include <torch/torch.h>

#include <vector>

#include "minimind/model/feed_forward.h"

namespace minimind {

// x: [N, H] tokens. The M assignments (token, expert) come sorted by expert: counts[e]
// rows of expert 0, then expert 1, ...; token: [M] int64, each assignment's token
// (ascending within an expert); weight: [M] its routing weight (may require grad).
// Returns y: [N, H], y[n] = sum over n's assignments i, in order, of weight[i] *
// expert(e_i)(x[n]); zero for a token without any (all its slots dropped).
// Experts without rows get a zero gradient in training, as if they had joined the graph
// (MiniMind's `0 * sum(params)`).
// Where `node` takes our node (experts_node), routed_experts_fused.cpp's runs; otherwise the
// plain node above, its fp32 products on `products`' library.
torch::Tensor routed_experts(const torch::Tensor& x, const torch::Tensor& token,
                             const torch::Tensor& weight, const std::vector<int64_t>& counts,
                             const std::vector<FeedForward>& experts, NodeChoice node,
                             const Products& products);

// The experts' forward (node_choice.h): in bf16 our node in every mode (the plain node has
// no bf16 products), in fp32 on oneDNN while training (evaluation keeps the plain node's
// numbers), ATen's form on OpenBLAS.
inline NodeChoice experts_node(const Products& products) {
  return products.precision == Precision::bf16 ? NodeChoice::own : training_node(products);
}

// routed_experts in bf16 or in fp32 on oneDNN (`precision`), on float32 x and weight
// (contiguous), int64 tokens and the experts' gate, up and down weights in turn
// (routed_experts_fused.cpp).
torch::Tensor routed_experts_fused(const torch::Tensor& x, const torch::Tensor& token,
                                   const torch::Tensor& weight, const std::vector<int64_t>& counts,
                                   const torch::autograd::variable_list& weights,
                                   Precision precision);

}  // namespace minimind
