#include "minimind/model/grouped_experts.h"

#include "minimind/util/cpu_clones.h"

namespace minimind {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// out = a @ b, written into out (a view into a buffer allocated once per call).
void mm_into(torch::Tensor out, const torch::Tensor& a, const torch::Tensor& b) {
  at::mm_out(out, a, b);
}

// d/dg = (ga * u) * s * (1 + g * (1 - s)) with s = sigmoid(g) (SiluBackward's formula),
// d/du = ga * silu(g), in one pass over the rows (three passes and a temporary as ATen ops);
// g, u, dg, du are column ranges of [M, 2I] buffers. No fused multiply-adds.
MINIMIND_NO_FMA_BEGIN
MINIMIND_CPU_CLONES void swiglu_backward_rows(const float* __restrict ga, const float* __restrict g,
                                              const float* __restrict u,
                                              const float* __restrict sig,
                                              const float* __restrict silu_g, float* __restrict dg,
                                              float* __restrict du, int64_t M, int64_t I,
                                              int64_t stride) {
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
  swiglu_backward_rows(ga.data_ptr<float>(), g.data_ptr<float>(), u.data_ptr<float>(),
                       sig.data_ptr<float>(), silu_g.data_ptr<float>(), dg.data_ptr<float>(),
                       du.data_ptr<float>(), ga.size(0), ga.size(1), g.stride(0));
}

// Inputs: xs, then per expert gate_proj, up_proj, down_proj weights ([I, H], [I, H], [H, I]).
struct GroupedSwiGLU : torch::autograd::Function<GroupedSwiGLU> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& xs,
                               std::vector<int64_t> counts, at::TensorList weights) {
    const int64_t M = xs.size(0), H = xs.size(1), I = weights[0].size(0);
    // Gate and up projections of an expert in one GEMM of width 2I (small experts make
    // narrow GEMMs, which OpenBLAS runs far below its peak): gu = [g | u].
    torch::Tensor gu = torch::empty({M, 2 * I}, xs.options());  // [M, 2I]
    for (size_t e = 0, off = 0; e < counts.size(); off += counts[e], ++e) {
      if (counts[e] == 0) continue;
      const torch::Tensor x = xs.narrow(0, off, counts[e]), rows = gu.narrow(0, off, counts[e]);
      mm_into(rows.narrow(1, 0, I), x, weights[3 * e].t());
      mm_into(rows.narrow(1, I, I), x, weights[3 * e + 1].t());
    }
    const torch::Tensor g = gu.narrow(1, 0, I), u = gu.narrow(1, I, I);  // [M, I] each
    const torch::Tensor silu_g = torch::silu(g);           // [M, I], kept: the backward needs it
    torch::Tensor a = silu_g * u;                          // [M, I]
    torch::Tensor y = torch::empty({M, H}, xs.options());  // [M, H]
    for (size_t e = 0, off = 0; e < counts.size(); off += counts[e], ++e)
      if (counts[e] > 0)
        mm_into(y.narrow(0, off, counts[e]), a.narrow(0, off, counts[e]), weights[3 * e + 2].t());
    ctx->save_for_backward({xs, gu, a, silu_g});
    ctx->saved_data["counts"] = counts;
    ctx->saved_data["weights"] = weights.vec();
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &xs = saved[0], &gu = saved[1], &a = saved[2], &silu_g = saved[3];
    const std::vector<int64_t> counts = ctx->saved_data["counts"].toIntVector();
    const variable_list weights = ctx->saved_data["weights"].toTensorVector();
    const torch::Tensor gy = grad_out[0].contiguous();  // [M, H]
    const int64_t E = static_cast<int64_t>(counts.size()), I = a.size(1);
    const torch::Tensor g = gu.narrow(1, 0, I), u = gu.narrow(1, I, I);
    variable_list gw(3 * E);
    // Through down_proj: d/da = gy_e @ W_down, d/dW_down = gy_e^T @ a_e (MmBackward's forms).
    torch::Tensor ga = torch::empty_like(a);  // [M, I]
    for (int64_t e = 0, off = 0; e < E; off += counts[e], ++e) {
      if (counts[e] == 0) continue;
      const torch::Tensor gy_e = gy.narrow(0, off, counts[e]);
      mm_into(ga.narrow(0, off, counts[e]), gy_e, weights[3 * e + 2]);
      gw[3 * e + 2] = at::mm(gy_e.t(), a.narrow(0, off, counts[e]));
    }
    // Through a = silu(g) * u, over all rows at once (as MulBackward and SiluBackward),
    // into one [M, 2I] buffer laid out as gu, so one GEMM per expert gives both weights'
    // gradients.
    torch::Tensor dgu = torch::empty_like(gu);  // [M, 2I] = [d/dg | d/du]
    torch::Tensor dg = dgu.narrow(1, 0, I), du = dgu.narrow(1, I, I);
    swiglu_backward(ga, g, u, silu_g, dg, du);
    torch::Tensor gx = torch::empty_like(xs), gx_up = torch::empty_like(xs);  // [M, H]
    for (int64_t e = 0, off = 0; e < E; off += counts[e], ++e) {
      if (counts[e] == 0) {  // an idle expert: zero gradients, as MiniMind's 0 * sum(params)
        for (int j = 0; j < 3; ++j) gw[3 * e + j] = torch::zeros_like(weights[3 * e + j]);
        continue;
      }
      const torch::Tensor x = xs.narrow(0, off, counts[e]);
      const torch::Tensor gw_gu = at::mm(dgu.narrow(0, off, counts[e]).t(), x);  // [2I, H]
      gw[3 * e] = gw_gu.narrow(0, 0, I);
      gw[3 * e + 1] = gw_gu.narrow(0, I, I);
      // The row's two uses (gate and up) each give a gradient; added once below.
      mm_into(gx.narrow(0, off, counts[e]), dg.narrow(0, off, counts[e]), weights[3 * e]);
      mm_into(gx_up.narrow(0, off, counts[e]), du.narrow(0, off, counts[e]), weights[3 * e + 1]);
    }
    gx.add_(gx_up);  // the two uses of each row add up (in either order: a + b == b + a)
    variable_list grads{gx, torch::Tensor()};
    grads.insert(grads.end(), gw.begin(), gw.end());
    return grads;
  }
};

}  // namespace

torch::Tensor grouped_experts(const torch::Tensor& xs, const std::vector<int64_t>& counts,
                              const std::vector<FeedForward>& experts) {
  variable_list weights;
  weights.reserve(3 * experts.size());
  for (const auto& ex : experts) {
    weights.push_back(ex->gate_proj->weight);
    weights.push_back(ex->up_proj->weight);
    weights.push_back(ex->down_proj->weight);
  }
  return GroupedSwiGLU::apply(xs, counts, at::TensorList(weights));  // one input per weight
}

}  // namespace minimind
