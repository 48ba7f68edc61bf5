// The SwiGLU's row loops, the one home of them: those the fused nodes share (the routed
// experts', routed_experts_fused.cpp, and the dense feed-forward's, feed_forward_fused.cpp),
// for the products' two operand types, bf16 bits (uint16_t) and float; and the plain routed
// experts' backward (routed_experts.cpp).
// Precision (docs/precision.md): products on those operands with fp32 sums; the SwiGLU in
// fp32, its output and its gradients rounded to bf16 in bf16 as the products take them.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace minimind {

// SwiGLU forward of m rows of gu [m, 2I] = [g | u]: sig = sigmoid(g) [m, I] (kept for the
// backward) and a = silu(g) * u [m, I] (rounded to bf16 bits), the down projection's input.
void swiglu_forward_rows(const float* gu, float* sig, uint16_t* a, int64_t m, int64_t I);
void swiglu_forward_rows(const float* gu, float* sig, float* a, int64_t m, int64_t I);

// Below this routing weight, (ga . a) / w would lose the routing weight's gradient in
// w gy's rounding (or divide by zero).
constexpr float kTinyWeight = 1e-20f;

// SwiGLU backward of m rows, in one pass over [m, I], from ga [m, I] = d/da:
//   dg = ga * u * s * (1 + g * (1 - s)), du = ga * silu(g)   (SiluBackward's formula)
// into drows [m, 2I] = [dg | du] (rounded in bf16), with a = silu(g) * u recomputed bit for
// bit as the forward made it (returned in a, for the down weight's gradient). With routing
// weights w [m] (ga being (w gy) @ W_down), also gweight[i] = (ga_i . a_i) / w_i, the
// routing weight's gradient gy_i . ys_i; rows with |w_i| < kTinyWeight get 0 there, for the
// caller to fill. w = nullptr: no routing weights, gweight is not written.
void swiglu_backward_rows(const float* ga, const float* w, const float* gu, const float* sig,
                          int64_t m, int64_t I, float* gweight, uint16_t* a, uint16_t* drows);
void swiglu_backward_rows(const float* ga, const float* w, const float* gu, const float* sig,
                          int64_t m, int64_t I, float* gweight, float* a, float* drows);

// The plain routed experts' SwiGLU backward (routed_experts.cpp), from the kept silu(g):
// dg = (ga * u) * s * (1 + g * (1 - s)), du = ga * silu_g, with s = sigmoid(g) (SiluBackward's
// formula), one pass over the rows for float32, ATen's ops for float64. ga, silu_g: [M, I];
// g, u, dg, du: [M, I] views with a row stride (columns of [M, 2I] buffers).
void swiglu_backward(const torch::Tensor& ga, const torch::Tensor& g, const torch::Tensor& u,
                     const torch::Tensor& silu_g, torch::Tensor& dg, torch::Tensor& du);

}  // namespace minimind
