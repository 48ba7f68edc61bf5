#include "minimind/model/routed_experts.h"

#include "minimind/model/expert_rows.h"
#include "minimind/model/linear.h"
#include "minimind/model/swiglu_rows.h"
#include "minimind/util/blas_tasks.h"
#include "minimind/util/cpu_clones.h"
#include "minimind/util/matmul.h"
#include "minimind/util/step_part.h"

namespace minimind {

namespace {

using namespace expert_rows;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Inputs: x, the routing weights, then per expert gate_proj, up_proj, down_proj weights
// ([I, H], [I, H], [H, I]); the tokens, counts and fp32 library (a MatmulBackend) ride along
// as constants. fp32 products run on that library (util/matmul.h), float64 ones (the tests)
// on ATen's.
struct RoutedSwiGLU : torch::autograd::Function<RoutedSwiGLU> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& token,
                               std::vector<int64_t> counts, int64_t fp32_library,
                               at::TensorList weights_in) {
    const StepScope part(StepPart::dispatch);
    const Products p{Precision::fp32, static_cast<MatmulBackend>(fp32_library)};
    const variable_list weights = weights_in.vec();
    const int64_t N = x.size(0), H = x.size(1), M = token.size(0), I = weights[0].size(0);
    const std::vector<int64_t> first = row_offsets(counts);
    // gu = [g | u]: gate and up projections side by side, so the backward gets both weights'
    // gradients from one GEMM over dgu = [d/dg | d/du].
    const auto opts = x.options();
    torch::Tensor gu = torch::empty({M, 2 * I}, opts);  // [M, 2I]
    torch::Tensor silu_g = torch::empty({M, I}, opts);  // [M, I], kept for the backward
    torch::Tensor a = torch::empty({M, I}, opts);       // [M, I] silu(g) * u
    // Tasks one after another add their rows into y as they go; side by side, y is summed
    // over the tokens afterwards (the same bits).
    const bool serial = blas_tasks_serial(side_by_side(I));
    torch::Tensor y = serial ? torch::zeros({N, H}, opts) : torch::Tensor();  // [N, H]
    torch::Tensor ys = torch::empty({M, H}, opts);  // [M, H] each row's expert output
    const int64_t* tokens = token.data_ptr<int64_t>();
    run_blas_tasks(
        expert_order(counts, serial),
        [&](int64_t e) {
          const int64_t off = first[e], m = counts[e];
          torch::Tensor xe = scratch(kRows, m, H, x.scalar_type());  // [m, H]
          gather_rows(x, tokens + off, xe);
          const torch::Tensor rows = gu.narrow(0, off, m);
          const torch::Tensor g = rows.narrow(1, 0, I), u = rows.narrow(1, I, I);  // [m, I] each
          in_part(StepPart::product_forward, [&] {
            matmul_into(g, xe, weights[3 * e].t(), p);
            matmul_into(u, xe, weights[3 * e + 1].t(), p);
          });
          torch::Tensor s = silu_g.narrow(0, off, m), a_e = a.narrow(0, off, m);
          in_part(StepPart::activation, [&] { at::mul_out(a_e, at::silu_out(s, g), u); });
          torch::Tensor ys_e = ys.narrow(0, off, m);  // [m, H]
          in_part(StepPart::product_forward,
                  [&] { matmul_into(ys_e, a_e, weights[3 * e + 2].t(), p); });
          if (serial) add_to_tokens(ys_e, weight, off, tokens + off, y);
        },
        side_by_side(I));
    if (!serial) y = sum_per_token(ys, weight, rows_of_tokens(token, N), N);
    ctx->save_for_backward({x, weight, gu, a, silu_g, ys});
    ctx->saved_data["token"] = token;
    ctx->saved_data["counts"] = counts;
    ctx->saved_data["weights"] = weights;
    ctx->saved_data["fp32_library"] = fp32_library;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const StepScope part(StepPart::dispatch);
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &weight = saved[1], &gu = saved[2], &a = saved[3],
                        &silu_g = saved[4], &ys = saved[5];
    const torch::Tensor token = ctx->saved_data["token"].toTensor();
    const std::vector<int64_t> counts = ctx->saved_data["counts"].toIntVector();
    const variable_list weights = ctx->saved_data["weights"].toTensorVector();
    const torch::Tensor gy = grad_out[0].contiguous();  // [N, H]
    const int64_t N = x.size(0), H = gy.size(1), E = static_cast<int64_t>(counts.size()),
                  I = a.size(1);
    const std::vector<int64_t> first = row_offsets(counts);
    variable_list gw(3 * E);
    for (int64_t e = 0; e < E; ++e)
      if (counts[e] == 0)  // an idle expert: zero gradients, as MiniMind's 0 * sum(params)
        for (int j = 0; j < 3; ++j) gw[3 * e + j] = torch::zeros_like(weights[3 * e + j]);
    const auto type = gy.scalar_type();
    torch::Tensor gweight = torch::empty_like(weight);  // [M]
    // The input gradient: added into gx as the tasks go when they run one after another,
    // else each row's kept in gxs [M, H] and summed over the tokens afterwards.
    const bool serial = blas_tasks_serial(side_by_side(I));
    torch::Tensor gx = serial ? torch::zeros_like(gy) : torch::Tensor();  // [N, H]
    torch::Tensor gxs = serial ? torch::Tensor() : torch::empty({weight.size(0), H}, gy.options());
    const int64_t* tokens = token.data_ptr<int64_t>();
    const Products p{Precision::fp32,
                     static_cast<MatmulBackend>(ctx->saved_data["fp32_library"].toInt())};
    run_blas_tasks(
        expert_order(counts, serial),
        [&](int64_t e) {
          const int64_t off = first[e], m = counts[e];
          const torch::Tensor a_e = a.narrow(0, off, m);
          torch::Tensor gweight_e = gweight.narrow(0, off, m);  // [m]
          torch::Tensor ga_e = scratch(kGa, m, I, type);        // [m, I] d/da
          // The weighted sum's backward: each row gets its token's gradient (gy_e), the
          // routing weight gy_e . ys_i, and the expert output gy_e * w_i (as MulBackward).
          torch::Tensor gy_e = scratch(kGradRows, m, H, type);
          gather_rows(gy, tokens + off, gy_e);
          torch::Tensor prod = scratch(kTemp, m, H, type);
          at::sum_out(gweight_e, at::mul_out(prod, gy_e, ys.narrow(0, off, m)), {1});
          gy_e.mul_(weight.narrow(0, off, m).unsqueeze(1));
          // Through down_proj: d/da = gy_e @ W_down, d/dW_down = gy_e^T @ a_e (MmBackward's).
          in_part(StepPart::product_grad_input,
                  [&] { matmul_into(ga_e, gy_e, weights[3 * e + 2], p); });
          gw[3 * e + 2] =
              in_part(StepPart::product_grad_weight, [&] { return matmul(gy_e.t(), a_e, p); });
          // Through a = silu(g) * u (as MulBackward and SiluBackward).
          const torch::Tensor rows = gu.narrow(0, off, m);
          torch::Tensor drows = scratch(kDgu, m, 2 * I, type);  // [m, 2I] = [d/dg | d/du]
          torch::Tensor dg = drows.narrow(1, 0, I), du = drows.narrow(1, I, I);
          in_part(StepPart::activation, [&] {
            swiglu_backward(ga_e, rows.narrow(1, 0, I), rows.narrow(1, I, I),
                            silu_g.narrow(0, off, m), dg, du);
          });
          torch::Tensor xe = scratch(kRows, m, H, x.scalar_type());  // [m, H]
          gather_rows(x, tokens + off, xe);
          const torch::Tensor gw_gu = in_part(StepPart::product_grad_weight, [&] {
            return matmul(drows.t(), xe, p);  // [2I, H]: both weights' grads
          });
          gw[3 * e] = gw_gu.narrow(0, 0, I);
          gw[3 * e + 1] = gw_gu.narrow(0, I, I);
          // The row's two uses (gate and up) each give a gradient; they add up (a + b == b + a).
          torch::Tensor gx_e = serial ? scratch(kOut, m, H, type) : gxs.narrow(0, off, m);
          torch::Tensor up = scratch(kTemp, m, H, type);
          in_part(StepPart::product_grad_input, [&] {
            matmul_into(gx_e, dg, weights[3 * e], p);
            matmul_into(up, du, weights[3 * e + 1], p);
          });
          gx_e.add_(up);
          if (serial) add_to_tokens(gx_e, torch::Tensor(), 0, tokens + off, gx);
        },
        side_by_side(I));
    // The gather's backward: each token adds its rows' gradients in order (index_add).
    if (!serial) gx = sum_per_token(gxs, torch::Tensor(), rows_of_tokens(token, N), N);
    variable_list grads{gx, gweight, torch::Tensor(), torch::Tensor(), torch::Tensor()};
    grads.insert(grads.end(), gw.begin(), gw.end());
    return grads;
  }
};

}  // namespace

torch::Tensor routed_experts(const torch::Tensor& x, const torch::Tensor& token,
                             const torch::Tensor& weight, const std::vector<int64_t>& counts,
                             const std::vector<FeedForward>& experts, NodeChoice node,
                             const Products& products) {
  TORCH_CHECK(x.dim() == 2 && token.dim() == 1 && weight.sizes() == token.sizes(),
              "routed_experts: x [N, H], token and weight [M]");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), "routed_experts: weight dtype ",
              weight.scalar_type(), " differs from x's ", x.scalar_type());
  const torch::Tensor tokens = token.to(torch::kLong).contiguous();
  TORCH_CHECK(tokens.numel() == 0 ||
                  (tokens.min().item<int64_t>() >= 0 && tokens.max().item<int64_t>() < x.size(0)),
              "routed_experts: a token outside [0, ", x.size(0), ")");
  variable_list weights;
  weights.reserve(3 * experts.size());
  for (const auto& ex : experts) {
    weights.push_back(ex->gate_proj->weight);
    weights.push_back(ex->up_proj->weight);
    weights.push_back(ex->down_proj->weight);
  }
  if (runs_own_node(node, x))
    return routed_experts_fused(x.contiguous(), tokens, weight.contiguous(), counts, weights,
                                products.precision);
  return RoutedSwiGLU::apply(x.contiguous(), weight.contiguous(), tokens, counts,
                             static_cast<int64_t>(products.fp32),
                             at::TensorList(weights));  // one input per weight
}

}  // namespace minimind
