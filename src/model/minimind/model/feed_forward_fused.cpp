// The dense feed-forward's fused node (dense_swiglu, feed_forward.h): [gate; up] as one
// product, the SwiGLU's row loops (swiglu_rows.h) between the products, the down product.
#include <cmath>

#include "minimind/model/feed_forward.h"
#include "minimind/model/swiglu_rows.h"
#include "minimind/util/blas_tasks.h"
#include "minimind/util/matmul.h"
#include "minimind/util/step_part.h"

namespace minimind {

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
struct DenseSwiGLUFused : torch::autograd::Function<DenseSwiGLUFused<E>> {
  static constexpr Precision kPrecision = operand_precision<E>;
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x_in,
                               const torch::Tensor& gate, const torch::Tensor& up,
                               const torch::Tensor& down) {
    const torch::Tensor x = to_operand(x_in, kPrecision);                           // [N, H]
    const torch::Tensor w_gu = to_operand_cat({gate, up}, kPrecision);              // [2I, H]
    const torch::Tensor w_down = to_operand(down, kPrecision, /*parameter=*/true);  // [H, I]
    const int64_t N = x.size(0), I = gate.size(0);
    torch::Tensor gu;  // [N, 2I] = [g | u], kept
    in_part(StepPart::product_forward, [&] { gu = matmul(x, w_gu.t(), node_products<E>); });
    torch::Tensor sig = torch::empty({N, I}, gu.options());                        // kept
    torch::Tensor a = torch::empty({N, I}, gu.options().dtype(operand_dtype<E>));  // [N, I]
    in_part(StepPart::activation, [&] {
      run_row_blocks(N, kRowBlock, [&](int64_t r0, int64_t n) {
        swiglu_forward_rows(gu.data_ptr<float>() + r0 * 2 * I, sig.data_ptr<float>() + r0 * I,
                            rows_of<E>(a) + r0 * I, n, I);
      });
    });
    torch::Tensor y;  // [N, H]
    in_part(StepPart::product_forward, [&] { y = matmul(a, w_down.t(), node_products<E>); });
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
    in_part(StepPart::product_grad_input, [&] { ga = matmul(gy, w_down, node_products<E>); });
    const auto of_e = gu.options().dtype(operand_dtype<E>);
    torch::Tensor a = torch::empty({N, I}, of_e), drows = torch::empty({N, 2 * I}, of_e);
    in_part(StepPart::activation, [&] {
      run_row_blocks(N, kRowBlock, [&](int64_t r0, int64_t n) {
        swiglu_backward_rows(ga.data_ptr<float>() + r0 * I, nullptr,
                             gu.data_ptr<float>() + r0 * 2 * I, sig.data_ptr<float>() + r0 * I, n,
                             I, nullptr, rows_of<E>(a) + r0 * I, rows_of<E>(drows) + r0 * 2 * I);
      });
    });
    torch::Tensor gx;
    in_part(StepPart::product_grad_input, [&] { gx = matmul(drows, w_gu, node_products<E>); });
    // A frozen feed-forward (train.freeze: [experts]) takes no weight gradients.
    if (!ctx->needs_input_grad(1)) return {gx, torch::Tensor(), torch::Tensor(), torch::Tensor()};
    torch::Tensor g_down, g_gu;
    in_part(StepPart::product_grad_weight, [&] {
      g_down = matmul(gy.t(), a, node_products<E>);   // [H, I]
      g_gu = matmul(drows.t(), x, node_products<E>);  // [2I, H]
    });
    return {gx, g_gu.narrow(0, 0, I), g_gu.narrow(0, I, I), g_down};
  }
};

}  // namespace

torch::Tensor dense_swiglu(const torch::Tensor& x, const torch::Tensor& gate,
                           const torch::Tensor& up, const torch::Tensor& down,
                           const Products& products) {
  TORCH_CHECK(x.dim() == 2 && gate.sizes() == up.sizes() && gate.size(1) == x.size(1) &&
                  down.size(0) == x.size(1) && down.size(1) == gate.size(0),
              "dense_swiglu: x [N, H], gate and up [I, H], down [H, I]");
  TORCH_CHECK(products.leave_aten(), "dense_swiglu: bf16, or fp32 on oneDNN");
  if (products.precision == Precision::bf16)
    return DenseSwiGLUFused<uint16_t>::apply(x.contiguous(), gate, up, down);
  return DenseSwiGLUFused<float>::apply(x.contiguous(), gate, up, down);
}

}  // namespace minimind
