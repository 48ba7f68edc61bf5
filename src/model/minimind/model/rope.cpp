#include "minimind/model/rope.h"

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

// x' = x * cos + rotate_half(x) * sin without building rotate_half(x): per half,
// x'1 = x1 * cos1 - x2 * sin1 and x'2 = x2 * cos2 + x1 * sin2, the same products and sums
// (a + (-b) is a - b). Autograd of the cat/neg/slice form allocated and zeroed a full-width
// gradient per slice (two per call, 8 calls per forward); this backward writes one:
// dx1 = g1 * cos1 + g2 * sin2, dx2 = g2 * cos2 - g1 * sin1, again the same numbers
// (the slices' zeros add nothing).
struct Rotary : torch::autograd::Function<Rotary> {
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
