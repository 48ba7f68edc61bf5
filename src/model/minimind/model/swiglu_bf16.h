// The SwiGLU in bf16 training (run.precision: bf16): the row loops the experts' node
// (routed_experts_bf16.cpp) and the dense feed-forward's node share, and that node.
// Precision (docs/precision.md): products on bf16 inputs with fp32 sums; the SwiGLU in fp32,
// its output and its gradients rounded to bf16 as the products take them.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace minimind {

// SwiGLU forward of m rows of gu [m, 2I] = [g | u]: sig = sigmoid(g) [m, I] (kept for the
// backward) and a = bf16(silu(g) * u) [m, I] as bf16 bits, the down projection's input.
void swiglu_forward_rows(const float* gu, float* sig, uint16_t* a, int64_t m, int64_t I);

// Below this routing weight, (ga . a) / w would lose the routing weight's gradient in
// w gy's rounding (or divide by zero).
constexpr float kTinyWeight = 1e-20f;

// SwiGLU backward of m rows, in one pass over [m, I], from ga [m, I] = d/da:
//   dg = ga * u * s * (1 + g * (1 - s)), du = ga * silu(g)   (SiluBackward's formula)
// rounded into drows [m, 2I] = [dg | du], with a = bf16(silu(g) * u) recomputed bit for bit
// as the forward made it (returned in a, for the down weight's gradient). With routing
// weights w [m] (ga being bf16(w gy) @ W_down), also gweight[i] = (ga_i . a_i) / w_i, the
// routing weight's gradient gy_i . ys_i; rows with |w_i| < kTinyWeight get 0 there, for the
// caller to fill. w = nullptr: no routing weights, gweight is not written.
void swiglu_backward_rows(const float* ga, const float* w, const float* gu, const float* sig,
                          int64_t m, int64_t I, float* gweight, uint16_t* a, uint16_t* drows);

// The dense feed-forward down(silu(x @ gate^T) * (x @ up^T)) as one node in bf16 training:
// x [N, H] float32, gate and up [I, H], down [H, I]; -> [N, H]. The gate and up weights are
// one rounded [2I, H] copy, so one product gives [g | u] and one the input gradient.
torch::Tensor dense_swiglu_bf16(const torch::Tensor& x, const torch::Tensor& gate,
                                const torch::Tensor& up, const torch::Tensor& down);

}  // namespace minimind
