#include "minimind/model/rms_norm.h"

#include <cmath>
#include <vector>

#include "minimind/model/linear.h"
#include "minimind/model/vector_math.h"
#include "minimind/util/blas_tasks.h"
#include "minimind/util/cpu_clones.h"
#include "minimind/util/matmul.h"
#include "minimind/util/step_part.h"

namespace minimind {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The formula as ATen ops (MiniMind's order): xf * rsqrt(mean(xf^2) + eps), times w.
torch::Tensor plain_rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                             torch::Tensor* r_out = nullptr) {
  const torch::Tensor xf = x.scalar_type() == torch::kDouble ? x : x.to(torch::kFloat32);
  torch::Tensor r = torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);  // [..., 1]
  if (r_out) *r_out = r;
  return (weight * (xf * r)).to(x.scalar_type());
}

// For each row of H values (x, r = 1 / rms, g = dL/dy):
//   gn = g * w,  dL/dx = gn * r - x * (r^3 / H) * sum(gn * x),  dL/dw += g * (x * r).
// sum(gn * x) in 16 partial sums (so the loop vectorises), dw per column in double over
// the rows. No fused multiply-adds: every machine rounds alike.
MINIMIND_NO_FMA_BEGIN
template <typename T>
MINIMIND_CPU_CLONES void rms_norm_backward_rows(const T* __restrict x, const T* __restrict r,
                                                const T* __restrict g, const T* __restrict w,
                                                T* __restrict dx, double* __restrict dw,
                                                int64_t rows, int64_t H) {
  constexpr int64_t kLanes = 16;
  for (int64_t i = 0; i < rows; ++i) {
    const T* xi = x + i * H;
    const T* gi = g + i * H;
    T* dxi = dx + i * H;
    const T ri = r[i];
    T lanes[kLanes] = {};
    int64_t j = 0;
    for (; j + kLanes <= H; j += kLanes)
      for (int64_t l = 0; l < kLanes; ++l) lanes[l] += gi[j + l] * w[j + l] * xi[j + l];
    T dot = 0;
    for (; j < H; ++j) dot += gi[j] * w[j] * xi[j];
    for (int64_t l = 0; l < kLanes; ++l) dot += lanes[l];
    const T c = dot * (ri * ri * ri / static_cast<T>(H));
    for (j = 0; j < H; ++j) {
      dxi[j] = gi[j] * w[j] * ri - xi[j] * c;
      dw[j] += static_cast<double>(gi[j] * (xi[j] * ri));
    }
  }
}

// bf16 training's forward, one pass per row of H: r = 1 / sqrt(sum(x^2) / H + eps),
// y = w * (x * r) (the formula's order; the sum in dot_lanes' order where ATen's mean has
// its own), and with yb, y rounded to bf16 for the products that read it.
MINIMIND_NO_TRAPS_BEGIN
MINIMIND_CPU_CLONES void rms_norm_rows(const float* __restrict x, const float* __restrict w,
                                       float eps, float* __restrict y, float* __restrict r,
                                       uint16_t* __restrict yb, int64_t rows, int64_t H) {
  for (int64_t i = 0; i < rows; ++i, x += H, y += H) {
    const float ri = 1.0f / std::sqrt(dot_lanes(x, x, H) / static_cast<float>(H) + eps);
    r[i] = ri;
    for (int64_t j = 0; j < H; ++j) y[j] = w[j] * (x[j] * ri);
    if (yb) {
      for (int64_t j = 0; j < H; ++j) yb[j] = bf16_bits(y[j]);
      yb += H;
    }
  }
}
MINIMIND_NO_TRAPS_END
MINIMIND_NO_FMA_END

// Rows per task of bf16 training's forward: 64 rows of 512 floats are 128 KB.
constexpr int64_t kNormRowBlock = 64;

struct FusedRMSNorm : torch::autograd::Function<FusedRMSNorm> {
  // own_forward: bf16 training's one-pass forward (float32 only); with rounded_copy it also
  // hands to_bf16 the output's bf16 copy (remember_bf16).
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, double eps, bool own_forward,
                               bool rounded_copy) {
    torch::Tensor r, y;
    if (own_forward) {
      const int64_t H = x.size(-1), rows = x.numel() / H;
      y = torch::empty_like(x);
      std::vector<int64_t> r_shape = x.sizes().vec();
      r_shape.back() = 1;
      r = torch::empty(r_shape, x.options());  // [..., 1]
      torch::Tensor yb;
      if (rounded_copy) yb = torch::empty(x.sizes(), x.options().dtype(torch::kBFloat16));
      auto* yb_bits = rounded_copy ? static_cast<uint16_t*>(yb.data_ptr()) : nullptr;
      run_row_blocks(rows, kNormRowBlock, [&](int64_t r0, int64_t n) {
        rms_norm_rows(x.data_ptr<float>() + r0 * H, weight.data_ptr<float>(),
                      static_cast<float>(eps), y.data_ptr<float>() + r0 * H,
                      r.data_ptr<float>() + r0, yb_bits ? yb_bits + r0 * H : nullptr, n, H);
      });
      if (rounded_copy) remember_bf16(y, yb);
    } else {
      y = plain_rms_norm(x, weight, eps, &r);
    }
    ctx->save_for_backward({x, weight, r});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const StepScope part(StepPart::norm);
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &weight = saved[1], &r = saved[2];
    const torch::Tensor g = grad_out[0].contiguous();
    const int64_t H = x.size(-1), rows = x.numel() / H;
    torch::Tensor dx = torch::empty_like(x);
    std::vector<double> dw(static_cast<size_t>(H), 0.0);
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rms_norm_backward", [&] {
      rms_norm_backward_rows<scalar_t>(x.data_ptr<scalar_t>(), r.data_ptr<scalar_t>(),
                                       g.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(),
                                       dx.data_ptr<scalar_t>(), dw.data(), rows, H);
    });
    torch::Tensor dweight = torch::tensor(dw, torch::kFloat64).to(weight.scalar_type());  // [H]
    return {dx, dweight, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                       bool rounded_copy) {
  const StepScope part(StepPart::norm);
  const auto type = x.scalar_type();
  const bool fused = (type == torch::kFloat32 || type == torch::kDouble) &&
                     weight.scalar_type() == type && x.is_contiguous() && weight.is_contiguous() &&
                     x.size(-1) == weight.numel();
  // Without gradients (generation, evaluation) the autograd node is overhead only: a
  // generated token makes 17 of these calls.
  const bool needs_grad =
      torch::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad());
  if (!fused || !needs_grad) return plain_rms_norm(x, weight, eps);
  const bool own = type == torch::kFloat32 && bf16_training_node(x);
  return FusedRMSNorm::apply(x, weight, eps, own, own && rounded_copy);
}

}  // namespace minimind
