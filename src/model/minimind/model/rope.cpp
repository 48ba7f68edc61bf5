#include "minimind/model/rope.h"

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

torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos,
                           const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  torch::Tensor rotated = torch::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
  // [T, d] -> [T, 1, d] broadcasts over batch and heads.
  return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1);
}

}  // namespace minimind
