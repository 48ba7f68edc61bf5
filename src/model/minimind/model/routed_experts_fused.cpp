// routed_experts' node where products leave ATen (experts_node: bf16 in every mode, fp32 on
// oneDNN in training): the same work as the plain node (routed_experts.cpp), with the per-expert
// work written on raw buffers, without ATen operations inside the experts' tasks, and every
// product on the operand type E: bf16 bits (uint16_t, fp32 sums; util/matmul.h) or float.
//
// Why its own node: with fine-grained experts (E = 64, top-16, width 52) the plain node's
// shape of work made a step pay, per expert, a dozen ATen views and allocations and
// two extra passes over [N*k, H] rows in memory: the experts' outputs kept for the routing
// weights' gradient, and read back in the backward. Here nothing of width H is kept per
// assignment: the routing weight's gradient gy . ys comes from the product the down
// projection's backward computes anyway, ga = (w gy) @ W_down, as (ga . a) / w, over I
// columns instead of H (a row whose weight is about 0 takes the direct sum).
//
// Precision (docs/precision.md): in bf16, products take bf16 inputs and the gradient each
// product's backward receives is rounded to bf16; the SwiGLU, the weighted sums and the
// routing weights' gradient stay fp32. The routing weight's gradient is the one value whose
// rounding differs from the scheme in tests/reference: it sees w gy rounded, where the scheme
// multiplies the fp32 gy. In fp32 nothing is rounded; (ga . a) / w is gy . ys to fp32's
// rounding, not the plain node's bits.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "minimind/model/expert_rows.h"
#include "minimind/model/routed_experts.h"
#include "minimind/model/swiglu_rows.h"
#include "minimind/model/vector_math.h"
#include "minimind/util/blas_tasks.h"
#include "minimind/util/cpu_clones.h"
#include "minimind/util/matmul.h"
#include "minimind/util/step_part.h"

namespace minimind {

namespace {

using namespace expert_rows;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

MINIMIND_NO_FMA_BEGIN
MINIMIND_NO_TRAPS_BEGIN

// The gradient rows one expert's down projection receives: gy_w = gy[tok] * w (rounded in
// bf16), [m, H].
template <typename E>
MINIMIND_CPU_CLONES void weighted_gradient_rows(const float* __restrict gy,
                                                const float* __restrict w,
                                                const int64_t* __restrict tok, int64_t m, int64_t H,
                                                E* __restrict gy_w) {
  for (int64_t i = 0; i < m; ++i) {
    if (i + kPrefetchRows < m) prefetch_row(gy + tok[i + kPrefetchRows] * H, H * sizeof(float));
    const float* g = gy + tok[i] * H;
    const float wi = w[i];
    for (int64_t h = 0; h < H; ++h) gy_w[i * H + h] = as_operand<E>(g[h] * wi);
  }
}

MINIMIND_NO_TRAPS_END

// gy . ys for one row, ys = a @ W_down^T recomputed (a [I], W_down [H, I] as operands).
template <typename E>
float direct_weight_gradient(const float* gy, const E* a, const E* w_down, int64_t H, int64_t I) {
  float sum = 0;
  for (int64_t h = 0; h < H; ++h) {
    float ys = 0;
    for (int64_t j = 0; j < I; ++j) ys += widen(a[j]) * widen(w_down[h * I + j]);
    sum += gy[h] * ys;
  }
  return sum;
}
MINIMIND_NO_FMA_END

// Inputs: x [N, H] and the routing weights [M] (fp32), then per expert gate_proj, up_proj and
// down_proj weights; the tokens and counts ride along as constants. Each expert's gate and
// up weights are one [2I, H] operand, so one product gives [g | u] forward and one the
// input gradient backward. T: the products' operands, bf16 bits (uint16_t) or float.
template <typename T>
struct RoutedSwiGLUFused : torch::autograd::Function<RoutedSwiGLUFused<T>> {
  static constexpr Precision kPrecision = operand_precision<T>;
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x_in,
                               const torch::Tensor& weight, const torch::Tensor& token,
                               std::vector<int64_t> counts, at::TensorList weights_in) {
    const StepScope part(StepPart::dispatch);
    const torch::Tensor x = to_operand(x_in, kPrecision);  // [N, H]
    const int64_t N = x.size(0), H = x.size(1), M = token.size(0), I = weights_in[0].size(0);
    const auto E = static_cast<int64_t>(counts.size());
    variable_list weights(2 * E);  // per expert: [gate; up] [2I, H], down [H, I], as operands
    for (int64_t e = 0; e < E; ++e) {
      weights[2 * e] = to_operand_cat({weights_in[3 * e], weights_in[3 * e + 1]}, kPrecision);
      weights[2 * e + 1] = to_operand(weights_in[3 * e + 2], kPrecision, /*parameter=*/true);
    }
    const std::vector<int64_t> first = row_offsets(counts);
    const auto opts = weight.options();
    torch::Tensor gu = torch::empty({M, 2 * I}, opts);  // [M, 2I] = [g | u], kept
    torch::Tensor sig = torch::empty({M, I}, opts);     // [M, I] sigmoid(g), kept
    // One after another, the tasks add their rows into y as they go; side by side, the rows
    // are summed over the tokens afterwards (the same bits).
    const bool serial = blas_tasks_serial(side_by_side(I));
    torch::Tensor y = serial ? torch::zeros({N, H}, opts) : torch::Tensor();   // [N, H]
    torch::Tensor ys = serial ? torch::Tensor() : torch::empty({M, H}, opts);  // [M, H]
    const int64_t* tok = token.data_ptr<int64_t>();
    const auto* xp = static_cast<const T*>(x.data_ptr());
    const float* w = weight.data_ptr<float>();
    run_blas_tasks(
        expert_order(counts, serial),
        [&](int64_t e) {
          const int64_t off = first[e], m = counts[e];
          auto* xe = scratch_of<T>(kRows, m * H);  // [m, H]
          gather_rows(xp, H * sizeof(T), tok + off, m, xe);
          float* gu_e = gu.data_ptr<float>() + off * 2 * I;  // [m, 2I]
          in_part(StepPart::product_forward, [&] {
            gemm_rows('N', 'T', m, 2 * I, H, xe, H,
                      static_cast<const T*>(weights[2 * e].data_ptr()), H, gu_e, 2 * I);
          });
          auto* a = scratch_of<T>(kRounded, m * I);  // [m, I]
          in_part(StepPart::activation,
                  [&] { swiglu_forward_rows(gu_e, sig.data_ptr<float>() + off * I, a, m, I); });
          float* ys_e = serial ? scratch_of<float>(kOut, m * H) : ys.data_ptr<float>() + off * H;
          in_part(StepPart::product_forward, [&] {
            gemm_rows('N', 'T', m, H, I, a, I, static_cast<const T*>(weights[2 * e + 1].data_ptr()),
                      I, ys_e, H);
          });
          if (serial) add_to_tokens(ys_e, w + off, tok + off, m, y.data_ptr<float>(), H);
        },
        side_by_side(I));
    if (!serial) y = sum_per_token(ys, weight, rows_of_tokens(token, N), N);
    ctx->save_for_backward({x, weight, gu, sig});
    ctx->saved_data["token"] = token;
    ctx->saved_data["counts"] = counts;
    ctx->saved_data["weights"] = weights;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const StepScope part(StepPart::dispatch);
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &weight = saved[1], &gu = saved[2], &sig = saved[3];
    const torch::Tensor token = ctx->saved_data["token"].toTensor();
    const std::vector<int64_t> counts = ctx->saved_data["counts"].toIntVector();
    const variable_list weights = ctx->saved_data["weights"].toTensorVector();
    const torch::Tensor gy = grad_out[0].contiguous();  // [N, H]
    const int64_t N = x.size(0), H = x.size(1), M = token.size(0), I = sig.size(1);
    const auto E = static_cast<int64_t>(counts.size());
    const std::vector<int64_t> first = row_offsets(counts);
    // Every expert's weight gradients in one buffer: per expert [gate [I, H]; up [I, H];
    // down [H, I]], zero for an idle expert (MiniMind's 0 * sum(params)).
    const int64_t per_expert = 3 * I * H;
    // Frozen experts (train.freeze): no weight gradients to form. The edges are the tensor
    // inputs only: x, weight, token, then the experts' weights.
    const bool weight_grads = ctx->needs_input_grad(3);
    torch::Tensor grads =
        torch::empty({weight_grads ? E : 0, per_expert}, weight.options());  // [E, 3IH]
    for (int64_t e = 0; e < E && weight_grads; ++e)
      if (counts[e] == 0) grads[e].zero_();
    torch::Tensor gweight = torch::empty_like(weight);  // [M]
    // The input gradient: added into gx as the tasks go when they run one after another,
    // else each row's kept in gxs [M, H] and summed over the tokens afterwards.
    const bool serial = blas_tasks_serial(side_by_side(I));
    torch::Tensor gx = serial ? torch::zeros({N, H}, gy.options()) : torch::Tensor();
    torch::Tensor gxs = serial ? torch::Tensor() : torch::empty({M, H}, gy.options());
    const int64_t* tok = token.data_ptr<int64_t>();
    const auto* xp = static_cast<const T*>(x.data_ptr());
    const float* w = weight.data_ptr<float>();
    run_blas_tasks(
        expert_order(counts, serial),
        [&](int64_t e) {
          const int64_t off = first[e], m = counts[e];
          const auto* w_gu = static_cast<const T*>(weights[2 * e].data_ptr());
          const auto* w_down = static_cast<const T*>(weights[2 * e + 1].data_ptr());
          float* g_e = weight_grads ? grads.data_ptr<float>() + e * per_expert : nullptr;
          auto* gy_w = scratch_of<T>(kWeightedRows, m * H);  // [m, H]
          weighted_gradient_rows(gy.data_ptr<float>(), w + off, tok + off, m, H, gy_w);
          auto* ga = scratch_of<float>(kGa, m * I);  // [m, I] d/da = gy_w @ W_down
          in_part(StepPart::product_grad_input,
                  [&] { gemm_rows('N', 'N', m, I, H, gy_w, H, w_down, I, ga, I); });
          auto* a = scratch_of<T>(kRounded, m * I);      // [m, I]
          auto* drows = scratch_of<T>(kDgu, m * 2 * I);  // [m, 2I] = [d/dg | d/du]
          float* gweight_e = gweight.data_ptr<float>() + off;
          in_part(StepPart::activation, [&] {
            swiglu_backward_rows(ga, w + off, gu.data_ptr<float>() + off * 2 * I,
                                 sig.data_ptr<float>() + off * I, m, I, gweight_e, a, drows);
          });
          for (int64_t i = 0; i < m; ++i)
            if (std::fabs(w[off + i]) < kTinyWeight)
              gweight_e[i] = direct_weight_gradient(gy.data_ptr<float>() + tok[off + i] * H,
                                                    a + i * I, w_down, H, I);
          if (weight_grads) {
            // d/dW_down [H, I] = gy_w^T @ a.
            in_part(StepPart::product_grad_weight,
                    [&] { gemm_rows('T', 'N', H, I, m, gy_w, H, a, I, g_e + 2 * I * H, I); });
            // [d/dW_gate; d/dW_up] [2I, H] = drows^T @ x_e.
            auto* xe = scratch_of<T>(kRows, m * H);  // [m, H]
            gather_rows(xp, H * sizeof(T), tok + off, m, xe);
            in_part(StepPart::product_grad_weight,
                    [&] { gemm_rows('T', 'N', 2 * I, H, m, drows, 2 * I, xe, H, g_e, H); });
          }
          // The rows' input gradient [m, H] = drows @ [W_gate; W_up]: both uses in one sum.
          float* gx_e = serial ? scratch_of<float>(kOut, m * H) : gxs.data_ptr<float>() + off * H;
          in_part(StepPart::product_grad_input,
                  [&] { gemm_rows('N', 'N', m, H, 2 * I, drows, 2 * I, w_gu, H, gx_e, H); });
          if (serial) add_to_tokens(gx_e, nullptr, tok + off, m, gx.data_ptr<float>(), H);
        },
        side_by_side(I));
    // The gather's backward: each token adds its rows' gradients in order (index_add).
    if (!serial) gx = sum_per_token(gxs, torch::Tensor(), rows_of_tokens(token, N), N);
    // Each weight's gradient a view of `grads` made in one op (select, narrow and view made
    // four: 3,000 ops a step with E = 64).
    variable_list result{gx, gweight, torch::Tensor(), torch::Tensor()};
    if (!weight_grads) result.resize(4 + 3 * E);  // undefined: frozen
    for (int64_t e = 0; e < E && weight_grads; ++e) {
      const int64_t at = grads.storage_offset() + e * per_expert;
      result.push_back(grads.as_strided({I, H}, {H, 1}, at));
      result.push_back(grads.as_strided({I, H}, {H, 1}, at + I * H));
      result.push_back(grads.as_strided({H, I}, {I, 1}, at + 2 * I * H));
    }
    return result;
  }
};

}  // namespace

torch::Tensor routed_experts_fused(const torch::Tensor& x, const torch::Tensor& token,
                                   const torch::Tensor& weight, const std::vector<int64_t>& counts,
                                   const torch::autograd::variable_list& weights,
                                   Precision precision) {
  if (precision == Precision::bf16)
    return RoutedSwiGLUFused<uint16_t>::apply(x, weight, token, counts, at::TensorList(weights));
  return RoutedSwiGLUFused<float>::apply(x, weight, token, counts, at::TensorList(weights));
}

}  // namespace minimind
