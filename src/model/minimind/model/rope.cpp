#include "minimind/model/rope.h"

#include "minimind/util/blas_tasks.h"
#include "minimind/util/cpu_clones.h"
#include "minimind/util/step_part.h"

namespace minimind {

RotaryTables make_rotary_tables(int64_t head_dim, int64_t max_positions, double theta) {
  // freq_i = 1 / theta^(2i/d), computed in float32 exactly as MiniMind does.
  torch::Tensor exponents =
      torch::arange(0, head_dim, 2, torch::kLong).slice(0, 0, head_dim / 2).to(torch::kFloat32) /
      static_cast<double>(head_dim);
  torch::Tensor freqs = 1.0 / torch::pow(theta, exponents);             // [d/2]
  torch::Tensor pos = torch::arange(max_positions, torch::kLong);       // [P]
  torch::Tensor angles = torch::outer(pos, freqs).to(torch::kFloat32);  // [P, d/2]
  return {torch::cat({torch::cos(angles), torch::cos(angles)}, -1),
          torch::cat({torch::sin(angles), torch::sin(angles)}, -1)};
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The rotation of rows [r0, r1) of x [rows, d] (row r at position (r / heads) % T, table
// rows cs, sn [T, d]) into out: the products and sums of Rotary::rotate's ATen ops, each
// rounded as they round it (no contraction to FMA), so bitwise the same; one pass instead
// of four ops and their temporaries.
MINIMIND_NO_FMA_BEGIN
MINIMIND_CPU_CLONES void rotate_rows(const float* __restrict x, const float* __restrict cs,
                                     const float* __restrict sn, float* __restrict out, int64_t r0,
                                     int64_t r1, int64_t heads, int64_t T, int64_t d, int sign) {
  const int64_t half = d / 2;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t t = (r / heads) % T;  // the row's position
    const float *xr = x + r * d, *c = cs + t * d, *s = sn + t * d;
    float* o = out + r * d;
    if (sign > 0) {
      for (int64_t j = 0; j < half; ++j) o[j] = xr[j] * c[j] - xr[j + half] * s[j];
      for (int64_t j = half; j < d; ++j) o[j] = xr[j] * c[j] + xr[j - half] * s[j];
    } else {
      for (int64_t j = 0; j < half; ++j) o[j] = xr[j] * c[j] + xr[j + half] * s[j + half];
      for (int64_t j = half; j < d; ++j) o[j] = xr[j] * c[j] - xr[j - half] * s[j - half];
    }
  }
}
MINIMIND_NO_FMA_END

// x' = x * cos + rotate_half(x) * sin without building rotate_half(x): per half,
// x'1 = x1 * cos1 - x2 * sin1 and x'2 = x2 * cos2 + x1 * sin2, the same products and sums
// (a + (-b) is a - b). Autograd of the cat/neg/slice form allocated and zeroed a full-width
// gradient per slice (two per call, 8 calls per forward); this backward writes one:
// dx1 = g1 * cos1 + g2 * sin2, dx2 = g2 * cos2 - g1 * sin1, again the same numbers
// (the slices' zeros add nothing).
struct Rotary : torch::autograd::Function<Rotary> {
  static constexpr int64_t kRowBlock = 512;  // rows of d floats per task
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& cos, const torch::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return rotate(x, cos, sin, 1);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const StepScope part(StepPart::rope);
    const variable_list saved = ctx->get_saved_variables();
    return {rotate(grad_out[0], saved[0], saved[1], -1), torch::Tensor(), torch::Tensor()};
  }

  // sign 1: the rotation; -1: its transpose (the backward).
  static torch::Tensor rotate(const torch::Tensor& x, const torch::Tensor& cos,
                              const torch::Tensor& sin, int sign) {
    const int64_t half = x.size(-1) / 2;
    if (x.dim() == 4 && x.scalar_type() == torch::kFloat32 && x.is_contiguous() &&
        cos.scalar_type() == torch::kFloat32 && sin.scalar_type() == torch::kFloat32 &&
        cos.is_contiguous() && sin.is_contiguous() && cos.size(0) == x.size(1) &&
        x.size(-1) % 2 == 0) {
      // [B, T, h, d] float32: the same numbers in one pass over the cores.
      const int64_t heads = x.size(2), T = x.size(1), d = x.size(3);
      torch::Tensor out = torch::empty_like(x);
      const float *xp = x.data_ptr<float>(), *cp = cos.data_ptr<float>(),
                  *sp = sin.data_ptr<float>();
      float* op = out.data_ptr<float>();
      run_row_blocks(x.numel() / d, kRowBlock, [&](int64_t r0, int64_t n) {
        rotate_rows(xp, cp, sp, op, r0, r0 + n, heads, T, d, sign);
      });
      return out;
    }
    // [T, d] -> [T, 1, d] broadcasts over batch and heads.
    const torch::Tensor c = cos.unsqueeze(1), s = sin.unsqueeze(1);
    const torch::Tensor x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
    const torch::Tensor s1 = s.narrow(-1, 0, half), s2 = s.narrow(-1, half, half);
    torch::Tensor out = x * c;  // [B, T, h, d]
    if (sign > 0) {
      out.narrow(-1, 0, half).sub_(x2 * s1);
      out.narrow(-1, half, half).add_(x1 * s2);
    } else {
      out.narrow(-1, 0, half).add_(x2 * s2);
      out.narrow(-1, half, half).sub_(x1 * s1);
    }
    return out;
  }
};

}  // namespace

torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos,
                           const torch::Tensor& sin) {
  const StepScope part(StepPart::rope);
  if (!torch::GradMode::is_enabled() || !x.requires_grad())  // generation: no node
    return Rotary::rotate(x, cos, sin, 1);
  return Rotary::apply(x, cos, sin);
}

}  // namespace minimind
