#include "minimind/model/swiglu_rows.h"

#include <cmath>

#include "minimind/model/vector_math.h"
#include "minimind/util/cpu_clones.h"
#include "minimind/util/matmul.h"

namespace minimind {

namespace {

MINIMIND_NO_FMA_BEGIN
MINIMIND_NO_TRAPS_BEGIN
template <typename E>
__attribute__((always_inline)) inline void swiglu_forward(const float* __restrict gu,
                                                          float* __restrict sig, E* __restrict a,
                                                          int64_t m, int64_t I) {
  for (int64_t i = 0; i < m; ++i) {
    const float *g = gu + i * 2 * I, *u = g + I;
    float* s = sig + i * I;
    E* a_i = a + i * I;
    // Two loops: in one, GCC's AVX2 code for the mixed float and 16-bit stores ran at a
    // third of the speed (2.9 against 1.0 ns per element at m = 1360, I = 2432).
    for (int64_t j = 0; j < I; ++j) s[j] = 1.0f / (1.0f + exp_clamped(-g[j]));
    for (int64_t j = 0; j < I; ++j) a_i[j] = as_operand<E>((g[j] * s[j]) * u[j]);
  }
}

template <typename E>
__attribute__((always_inline)) inline void swiglu_backward(const float* __restrict ga,
                                                           const float* __restrict w,
                                                           const float* __restrict gu,
                                                           const float* __restrict sig, int64_t m,
                                                           int64_t I, float* __restrict gweight,
                                                           E* __restrict a, E* __restrict drows) {
  for (int64_t i = 0; i < m; ++i) {
    const float *g = gu + i * 2 * I, *u = g + I, *s = sig + i * I, *ga_i = ga + i * I;
    E *a_i = a + i * I, *dg = drows + i * 2 * I, *du = dg + I;
    for (int64_t j = 0; j < I; ++j) {
      const float silu = g[j] * s[j];
      a_i[j] = as_operand<E>(silu * u[j]);
      dg[j] = as_operand<E>(((ga_i[j] * u[j]) * s[j]) * (1.0f + g[j] * (1.0f - s[j])));
      du[j] = as_operand<E>(ga_i[j] * silu);
    }
    if (w == nullptr) continue;
    const float dot = dot_lanes(ga_i, a_i, I);
    gweight[i] = std::fabs(w[i]) >= kTinyWeight ? dot / w[i] : 0.0f;
  }
}
MINIMIND_NO_TRAPS_END
MINIMIND_NO_FMA_END

// d/dg = (ga * u) * s * (1 + g * (1 - s)) with s = sigmoid(g) (SiluBackward's formula),
// d/du = ga * silu(g), in one pass over the rows (three passes and a temporary as ATen ops);
// g, u, dg, du are column ranges of [M, 2I] buffers. No fused multiply-adds.
MINIMIND_NO_FMA_BEGIN
MINIMIND_CPU_CLONES void swiglu_backward_plain_rows(
    const float* __restrict ga, const float* __restrict g, const float* __restrict u,
    const float* __restrict sig, const float* __restrict silu_g, float* __restrict dg,
    float* __restrict du, int64_t M, int64_t I, int64_t stride) {
  for (int64_t m = 0; m < M; ++m) {
    const float *ga_m = ga + m * I, *s_m = sig + m * I, *silu_m = silu_g + m * I;
    const float *g_m = g + m * stride, *u_m = u + m * stride;
    float *dg_m = dg + m * stride, *du_m = du + m * stride;
    for (int64_t i = 0; i < I; ++i) {
      const float t = ga_m[i] * u_m[i];
      dg_m[i] = t * s_m[i] * (1.0f + g_m[i] * (1.0f - s_m[i]));
      du_m[i] = ga_m[i] * silu_m[i];
    }
  }
}
MINIMIND_NO_FMA_END

}  // namespace

MINIMIND_NO_FMA_BEGIN
MINIMIND_NO_TRAPS_BEGIN
MINIMIND_CPU_CLONES void swiglu_forward_rows(const float* gu, float* sig, uint16_t* a, int64_t m,
                                             int64_t I) {
  swiglu_forward(gu, sig, a, m, I);
}
MINIMIND_CPU_CLONES void swiglu_forward_rows(const float* gu, float* sig, float* a, int64_t m,
                                             int64_t I) {
  swiglu_forward(gu, sig, a, m, I);
}
MINIMIND_CPU_CLONES void swiglu_backward_rows(const float* ga, const float* w, const float* gu,
                                              const float* sig, int64_t m, int64_t I,
                                              float* gweight, uint16_t* a, uint16_t* drows) {
  swiglu_backward(ga, w, gu, sig, m, I, gweight, a, drows);
}
MINIMIND_CPU_CLONES void swiglu_backward_rows(const float* ga, const float* w, const float* gu,
                                              const float* sig, int64_t m, int64_t I,
                                              float* gweight, float* a, float* drows) {
  swiglu_backward(ga, w, gu, sig, m, I, gweight, a, drows);
}
MINIMIND_NO_TRAPS_END
MINIMIND_NO_FMA_END

// ga, silu_g: [M, I]; g, u, dg, du: [M, I] views with a row stride (columns of gu / dgu).
void swiglu_backward(const torch::Tensor& ga, const torch::Tensor& g, const torch::Tensor& u,
                     const torch::Tensor& silu_g, torch::Tensor& dg, torch::Tensor& du) {
  const bool fused = ga.scalar_type() == torch::kFloat32 && ga.is_contiguous() &&
                     silu_g.is_contiguous() && g.stride(1) == 1 && u.stride(1) == 1 &&
                     dg.stride(1) == 1 && du.stride(1) == 1 && g.stride(0) == u.stride(0) &&
                     g.stride(0) == dg.stride(0) && g.stride(0) == du.stride(0);
  if (!fused) {  // float64 experts (the fp64 tests): ATen's ops
    at::silu_backward_out(dg, ga * u, g);
    at::mul_out(du, ga, silu_g);
    return;
  }
  const torch::Tensor sig = torch::sigmoid(g);  // [M, I] contiguous
  swiglu_backward_plain_rows(ga.data_ptr<float>(), g.data_ptr<float>(), u.data_ptr<float>(),
                             sig.data_ptr<float>(), silu_g.data_ptr<float>(), dg.data_ptr<float>(),
                             du.data_ptr<float>(), ga.size(0), ga.size(1), g.stride(0));
}

}  // namespace minimind
