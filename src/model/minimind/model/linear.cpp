#include "minimind/model/linear.h"

#include <vector>

#include "minimind/util/step_part.h"

namespace minimind {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The products of the two nodes below, from the precision they saved: they run only where
// products leave ATen (project, batched_product), so fp32 there is oneDNN's.
Products node_products_of(int64_t precision) {
  return {static_cast<Precision>(precision), MatmulBackend::onednn};
}

// y = x @ w^T, dx = dy @ w, dw = dy^T @ x, each through matmul_into. In bf16 the node keeps
// x rounded (half the memory of x) and w's rounded copy, so the backward rounds only dy.
struct Projection : torch::autograd::Function<Projection> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               int64_t precision) {
    const auto p = static_cast<Precision>(precision);
    const torch::Tensor xs = p == Precision::bf16 ? to_bf16(x) : x;        // [N, in]
    const torch::Tensor ws = p == Precision::bf16 ? to_bf16(w, true) : w;  // [out, in]
    ctx->save_for_backward({xs, ws});
    ctx->saved_data["precision"] = precision;
    const StepScope part(StepPart::product_forward);
    return matmul(xs, ws.t(), node_products_of(precision));  // [N, out] fp32
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &xs = saved[0], &ws = saved[1];
    const Products p = node_products_of(ctx->saved_data["precision"].toInt());
    torch::Tensor gy = grad_out[0].contiguous();  // [N, out]
    if (p.precision == Precision::bf16) gy = to_bf16(gy);
    torch::Tensor gx, gw;
    if (ctx->needs_input_grad(0)) {
      const StepScope part(StepPart::product_grad_input);
      gx = matmul(gy, ws, p);  // [N, in]
    }
    if (ctx->needs_input_grad(1)) {
      const StepScope part(StepPart::product_grad_weight);
      gw = matmul(gy.t(), xs, p);  // [out, in]
    }
    return {gx, gw, torch::Tensor()};
  }
};

// c = a @ b over a leading batch dimension; da = dc @ b^T, db = a^T @ dc.
struct BatchedProduct : torch::autograd::Function<BatchedProduct> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& a, const torch::Tensor& b,
                               int64_t precision) {
    const auto p = static_cast<Precision>(precision);
    const torch::Tensor as = p == Precision::bf16 ? to_bf16(a) : a;  // [n, M, K]
    const torch::Tensor bs = p == Precision::bf16 ? to_bf16(b) : b;  // [n, K, N]
    ctx->save_for_backward({as, bs});
    ctx->saved_data["precision"] = precision;
    return batched_matmul(as, bs, node_products_of(precision));  // [n, M, N] fp32
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const StepScope part(StepPart::attention);
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &as = saved[0], &bs = saved[1];
    const Products p = node_products_of(ctx->saved_data["precision"].toInt());
    torch::Tensor gc = grad_out[0].contiguous();  // [n, M, N]
    if (p.precision == Precision::bf16) gc = to_bf16(gc);
    torch::Tensor ga, gb;
    if (ctx->needs_input_grad(0)) ga = batched_matmul(gc, bs.transpose(1, 2), p);  // [n, M, K]
    if (ctx->needs_input_grad(1)) gb = batched_matmul(as.transpose(1, 2), gc, p);  // [n, K, N]
    return {ga, gb, torch::Tensor()};
  }
};

}  // namespace

torch::Tensor project(const torch::Tensor& x, const torch::Tensor& w, const Products& products) {
  const Precision precision = products.precision;
  const bool aten = x.scalar_type() != torch::kFloat32 || !products.leave_aten();
  const bool one_row = x.numel() == x.size(-1);
  if (aten && !one_row) {
    const StepScope part(StepPart::product_forward);
    return torch::linear(x, w);
  }
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = w.size(0);
  if (one_row && (aten || precision == Precision::fp32))  // any library's GEMV wins here
    return torch::mv(w, x.reshape({-1})).view(shape);
  return Projection::apply(x.reshape({-1, x.size(-1)}), w, static_cast<int64_t>(precision))
      .view(shape);
}

torch::Tensor batched_product(const torch::Tensor& a, const torch::Tensor& b,
                              const Products& products) {
  if (a.scalar_type() != torch::kFloat32 || !products.leave_aten()) return torch::matmul(a, b);
  TORCH_CHECK(a.dim() == b.dim() && a.dim() >= 3 &&
                  a.sizes().slice(0, a.dim() - 2) == b.sizes().slice(0, b.dim() - 2),
              "batched_product: shapes ", a.sizes(), " x ", b.sizes());
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  std::vector<int64_t> shape = a.sizes().vec();
  shape.back() = N;
  return BatchedProduct::apply(a.reshape({-1, M, K}), b.reshape({-1, K, N}),
                               static_cast<int64_t>(products.precision))
      .view(shape);
}

}  // namespace minimind
