#include "minimind/model/swiglu_fused.h"

#include <cmath>

#include "minimind/model/vector_math.h"
#include "minimind/util/blas_tasks.h"
#include "minimind/util/cpu_clones.h"
#include "minimind/util/matmul.h"
#include "minimind/util/step_part.h"

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

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The SwiGLU loops run over blocks of this many rows spread over the cores.
constexpr int64_t kRowBlock = 64;

template <typename E>
E* rows_of(const torch::Tensor& t) {
  return static_cast<E*>(t.data_ptr());
}

// E: the products' operands, bf16 bits (uint16_t) or float.
template <typename E>
struct DenseSwiGLU : torch::autograd::Function<DenseSwiGLU<E>> {
  static constexpr Precision kPrecision = operand_precision<E>;
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x_in,
                               const torch::Tensor& gate, const torch::Tensor& up,
                               const torch::Tensor& down) {
    const torch::Tensor x = to_operand(x_in, kPrecision);                           // [N, H]
    const torch::Tensor w_gu = to_operand_cat({gate, up}, kPrecision);              // [2I, H]
    const torch::Tensor w_down = to_operand(down, kPrecision, /*parameter=*/true);  // [H, I]
    const int64_t N = x.size(0), I = gate.size(0);
    torch::Tensor gu;  // [N, 2I] = [g | u], kept
    in_part(StepPart::product_forward, [&] { gu = matmul(x, w_gu.t(), kPrecision); });
    torch::Tensor sig = torch::empty({N, I}, gu.options());                        // kept
    torch::Tensor a = torch::empty({N, I}, gu.options().dtype(operand_dtype<E>));  // [N, I]
    in_part(StepPart::activation, [&] {
      run_row_blocks(N, kRowBlock, [&](int64_t r0, int64_t n) {
        swiglu_forward_rows(gu.data_ptr<float>() + r0 * 2 * I, sig.data_ptr<float>() + r0 * I,
                            rows_of<E>(a) + r0 * I, n, I);
      });
    });
    torch::Tensor y;  // [N, H]
    in_part(StepPart::product_forward, [&] { y = matmul(a, w_down.t(), kPrecision); });
    ctx->save_for_backward({x, gu, sig});
    ctx->saved_data["weights"] = variable_list{w_gu, w_down};
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &gu = saved[1], &sig = saved[2];
    const variable_list weights = ctx->saved_data["weights"].toTensorVector();
    const torch::Tensor &w_gu = weights[0], &w_down = weights[1];
    const int64_t N = x.size(0), I = sig.size(1);
    const torch::Tensor gy = to_operand(grad_out[0].contiguous(), kPrecision);  // [N, H]
    torch::Tensor ga;                                                           // [N, I] d/da
    in_part(StepPart::product_grad_input, [&] { ga = matmul(gy, w_down, kPrecision); });
    const auto of_e = gu.options().dtype(operand_dtype<E>);
    torch::Tensor a = torch::empty({N, I}, of_e), drows = torch::empty({N, 2 * I}, of_e);
    in_part(StepPart::activation, [&] {
      run_row_blocks(N, kRowBlock, [&](int64_t r0, int64_t n) {
        swiglu_backward_rows(ga.data_ptr<float>() + r0 * I, nullptr,
                             gu.data_ptr<float>() + r0 * 2 * I, sig.data_ptr<float>() + r0 * I, n,
                             I, nullptr, rows_of<E>(a) + r0 * I, rows_of<E>(drows) + r0 * 2 * I);
      });
    });
    torch::Tensor g_down, g_gu, gx;
    in_part(StepPart::product_grad_weight, [&] {
      g_down = matmul(gy.t(), a, kPrecision);   // [H, I]
      g_gu = matmul(drows.t(), x, kPrecision);  // [2I, H]
    });
    in_part(StepPart::product_grad_input, [&] { gx = matmul(drows, w_gu, kPrecision); });
    return {gx, g_gu.narrow(0, 0, I), g_gu.narrow(0, I, I), g_down};
  }
};

}  // namespace

torch::Tensor dense_swiglu(const torch::Tensor& x, const torch::Tensor& gate,
                           const torch::Tensor& up, const torch::Tensor& down) {
  TORCH_CHECK(x.dim() == 2 && gate.sizes() == up.sizes() && gate.size(1) == x.size(1) &&
                  down.size(0) == x.size(1) && down.size(1) == gate.size(0),
              "dense_swiglu: x [N, H], gate and up [I, H], down [H, I]");
  const Precision precision = product_settings().precision;
  TORCH_CHECK(products_leave_aten(precision), "dense_swiglu: bf16, or fp32 on oneDNN");
  if (precision == Precision::bf16)
    return DenseSwiGLU<uint16_t>::apply(x.contiguous(), gate, up, down);
  return DenseSwiGLU<float>::apply(x.contiguous(), gate, up, down);
}

}  // namespace minimind
