#include "minimind/model/rms_norm.h"

#include <cmath>
#include <type_traits>
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
// the rows. No fused multiply-adds: every machine rounds alike. With gs (x was a residual
// add's sum that also flows on: its own gradient), dL/dx += gs after the rounding above,
// the add autograd would do; with dxb, dL/dx rounded to bf16 for the products that read it.
MINIMIND_NO_FMA_BEGIN
template <typename T, bool kResidual, bool kRound>
MINIMIND_CPU_CLONES void rms_norm_backward_rows(const T* __restrict x, const T* __restrict r,
                                                const T* __restrict g, const T* __restrict w,
                                                const T* __restrict gs, T* __restrict dx,
                                                uint16_t* __restrict dxb, double* __restrict dw,
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
      T d = gi[j] * w[j] * ri - xi[j] * c;
      if constexpr (kResidual) d += gs[i * H + j];
      dxi[j] = d;
      if constexpr (kRound) dxb[i * H + j] = bf16_bits(d);
      dw[j] += static_cast<double>(gi[j] * (xi[j] * ri));
    }
  }
}

// The forward of training outside ATen (bf16, fp32 on oneDNN), one pass per row of H:
// with b, x = x + b first (written to s); r = 1 / sqrt(sum(x^2) / H + eps), y = w * (x * r)
// (the formula's order; the sum in dot_lanes' order where ATen's mean has its own), and
// with yb, y rounded to bf16 for the products that read it.
MINIMIND_NO_TRAPS_BEGIN
MINIMIND_CPU_CLONES void rms_norm_rows(const float* __restrict x, const float* __restrict b,
                                       const float* __restrict w, float eps, float* __restrict s,
                                       float* __restrict y, float* __restrict r,
                                       uint16_t* __restrict yb, int64_t rows, int64_t H) {
  for (int64_t i = 0; i < rows; ++i, x += H, y += H) {
    const float* xs = x;
    if (b) {
      for (int64_t j = 0; j < H; ++j) s[j] = x[j] + b[j];
      xs = s;
      b += H, s += H;
    }
    const float ri = 1.0f / std::sqrt(dot_lanes(xs, xs, H) / static_cast<float>(H) + eps);
    r[i] = ri;
    for (int64_t j = 0; j < H; ++j) y[j] = w[j] * (xs[j] * ri);
    if (yb) {
      for (int64_t j = 0; j < H; ++j) yb[j] = bf16_bits(y[j]);
      yb += H;
    }
  }
}
MINIMIND_NO_TRAPS_END
MINIMIND_NO_FMA_END

// Rows per task of the one-pass forward: 64 rows of 512 floats are 128 KB.
constexpr int64_t kNormRowBlock = 64;

// The node's two halves, shared by the plain norm and the residual add folded into it.
// norm_forward: y = rms_norm(b ? x + b : x) and its saved tensors; s is the sum (x itself
// without b). own_forward: the one-pass forward of training outside ATen (float32 only); with
// rounded_copy it also hands to_bf16 the output's bf16 copy (remember_bf16).
struct NormForward {
  torch::Tensor s, y, r;
};
NormForward norm_forward(const torch::Tensor& x, const torch::Tensor& b,
                         const torch::Tensor& weight, double eps, bool own_forward,
                         bool rounded_copy) {
  NormForward f;
  if (!own_forward) {
    f.s = b.defined() ? x + b : x;
    f.y = plain_rms_norm(f.s, weight, eps, &f.r);
    return f;
  }
  const int64_t H = x.size(-1), rows = x.numel() / H;
  f.s = b.defined() ? torch::empty_like(x) : x;
  f.y = torch::empty_like(x);
  std::vector<int64_t> r_shape = x.sizes().vec();
  r_shape.back() = 1;
  f.r = torch::empty(r_shape, x.options());  // [..., 1]
  torch::Tensor yb;
  if (rounded_copy) yb = torch::empty(x.sizes(), x.options().dtype(torch::kBFloat16));
  auto* yb_bits = rounded_copy ? static_cast<uint16_t*>(yb.data_ptr()) : nullptr;
  run_row_blocks(rows, kNormRowBlock, [&](int64_t r0, int64_t n) {
    const int64_t at = r0 * H;
    rms_norm_rows(x.data_ptr<float>() + at, b.defined() ? b.data_ptr<float>() + at : nullptr,
                  weight.data_ptr<float>(), static_cast<float>(eps),
                  b.defined() ? f.s.data_ptr<float>() + at : nullptr, f.y.data_ptr<float>() + at,
                  f.r.data_ptr<float>() + r0, yb_bits ? yb_bits + at : nullptr, n, H);
  });
  if (rounded_copy) remember_bf16(f.y, yb);
  return f;
}

// dL/dx and dL/dw from the saved {x, weight, r} and g = dL/dy; with gs, x's own gradient
// (x was a sum that flows on) is added in; with round, dL/dx's bf16 copy goes to to_bf16.
std::pair<torch::Tensor, torch::Tensor> norm_backward(const variable_list& saved,
                                                      const torch::Tensor& g_out,
                                                      const torch::Tensor& gs_out, bool round) {
  const torch::Tensor &x = saved[0], &weight = saved[1], &r = saved[2];
  const torch::Tensor g = g_out.contiguous();
  const torch::Tensor gs = gs_out.defined() ? gs_out.contiguous() : gs_out;
  const int64_t H = x.size(-1), rows = x.numel() / H;
  torch::Tensor dx = torch::empty_like(x);
  torch::Tensor dxb;
  if (round) dxb = torch::empty(x.sizes(), x.options().dtype(torch::kBFloat16));
  std::vector<double> dw(static_cast<size_t>(H), 0.0);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rms_norm_backward", [&] {
    const scalar_t* gs_data = gs.defined() ? gs.data_ptr<scalar_t>() : nullptr;
    auto* dxb_data = round ? static_cast<uint16_t*>(dxb.data_ptr()) : nullptr;
    auto rows_with = [&](auto residual) {
      constexpr bool kResidual = decltype(residual)::value;
      if constexpr (std::is_same_v<scalar_t, float>) {
        if (round)
          return rms_norm_backward_rows<scalar_t, kResidual, true>(
              x.data_ptr<scalar_t>(), r.data_ptr<scalar_t>(), g.data_ptr<scalar_t>(),
              weight.data_ptr<scalar_t>(), gs_data, dx.data_ptr<scalar_t>(), dxb_data, dw.data(),
              rows, H);
      }
      rms_norm_backward_rows<scalar_t, kResidual, false>(
          x.data_ptr<scalar_t>(), r.data_ptr<scalar_t>(), g.data_ptr<scalar_t>(),
          weight.data_ptr<scalar_t>(), gs_data, dx.data_ptr<scalar_t>(), nullptr, dw.data(), rows,
          H);
    };
    if (gs_data) {
      rows_with(std::true_type{});
    } else {
      rows_with(std::false_type{});
    }
  });
  if (round) remember_bf16(dx, dxb);
  torch::Tensor dweight = torch::tensor(dw, torch::kFloat64).to(weight.scalar_type());  // [H]
  return {dx, dweight};
}

struct RMSNormFused : torch::autograd::Function<RMSNormFused> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, double eps, bool own_forward,
                               bool rounded_copy) {
    NormForward f = norm_forward(x, {}, weight, eps, own_forward, rounded_copy);
    ctx->save_for_backward({x, weight, f.r});
    return f.y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const StepScope part(StepPart::norm);
    auto [dx, dweight] = norm_backward(ctx->get_saved_variables(), grad_out[0], {}, false);
    return {dx, dweight, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// s = a + b and y = rms_norm(s) in one node: the residual stream's add and the norm that
// reads its sum. The backward adds s's own gradient into dL/ds as it forms it, where autograd
// would add the two in a pass of their own, and hands a and b the same tensor, as an add's
// backward does. With grad_copy (bf16 training, b made by products that round their output's
// gradient) that gradient's bf16 copy is written in the same pass and handed to to_bf16.
struct AddRMSNormFused : torch::autograd::Function<AddRMSNormFused> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& a, const torch::Tensor& b,
                               const torch::Tensor& weight, double eps, bool own_forward,
                               bool rounded_copy, bool grad_copy) {
    NormForward f = norm_forward(a, b, weight, eps, own_forward, rounded_copy);
    ctx->set_materialize_grads(false);  // an output nobody read: undefined, not zeros
    ctx->save_for_backward({f.s, weight, f.r});
    ctx->saved_data["grad_copy"] = grad_copy;
    return {f.s, f.y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const StepScope part(StepPart::norm);
    const torch::Tensor &gs = grad_out[0], &gy = grad_out[1];
    torch::Tensor ds, dweight;
    if (gy.defined()) {
      std::tie(ds, dweight) =
          norm_backward(ctx->get_saved_variables(), gy, gs, ctx->saved_data["grad_copy"].toBool());
    } else {
      ds = gs;  // only the sum was read
    }
    return {ds, ds, dweight, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// Whether the fused nodes take x and weight: float32 or float64 alike, contiguous, rows of
// weight's length. Without gradients (generation, evaluation) a node is overhead only: a
// generated token makes 17 norm calls.
bool node_takes(const torch::Tensor& x, const torch::Tensor& weight, bool needs_grad) {
  const auto type = x.scalar_type();
  return needs_grad && torch::GradMode::is_enabled() &&
         (type == torch::kFloat32 || type == torch::kDouble) && weight.scalar_type() == type &&
         x.is_contiguous() && weight.is_contiguous() && x.size(-1) == weight.numel();
}

}  // namespace

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                       const NormNode& node) {
  const StepScope part(StepPart::norm);
  if (!node_takes(x, weight, x.requires_grad() || weight.requires_grad()))
    return plain_rms_norm(x, weight, eps);
  // Training outside ATen takes the one-pass forward; only bf16 keeps a rounded copy.
  const bool own = runs_own_node(node.node, x);
  return RMSNormFused::apply(x, weight, eps, own, own && node.bf16 && node.rounded_copy);
}

AddNormed add_rms_norm(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& weight,
                       double eps, const NormNode& node, bool grad_copy) {
  if (!b.defined()) return {a, rms_norm(a, weight, eps, node)};
  const bool needs_grad = a.requires_grad() || b.requires_grad() || weight.requires_grad();
  if (!node_takes(a, weight, needs_grad) || b.scalar_type() != a.scalar_type() ||
      b.sizes() != a.sizes() || !b.is_contiguous()) {
    torch::Tensor s = a + b;
    return {s, rms_norm(s, weight, eps, node)};
  }
  const StepScope part(StepPart::norm);
  const bool own = runs_own_node(node.node, a);
  const bool bf16 = own && node.bf16;
  variable_list out =
      AddRMSNormFused::apply(a, b, weight, eps, own, bf16 && node.rounded_copy, bf16 && grad_copy);
  return {out[0], out[1]};
}

}  // namespace minimind
