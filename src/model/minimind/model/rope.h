// Rotary position embeddings, rotate-half convention (NeoX / HF-Llama), as MiniMind.
#pragma once

#include <torch/torch.h>

namespace minimind {

// cos/sin tables of width head_dim for positions [0, max_positions): the half-width
// table concatenated with itself. Not parameters: never part of the state dict.
struct RotaryTables {
  torch::Tensor cos;  // [max_positions, head_dim]
  torch::Tensor sin;  // [max_positions, head_dim]
};

RotaryTables make_rotary_tables(int64_t head_dim, int64_t max_positions, double theta);

// x' = x * cos + rotate_half(x) * sin, with rotate_half(x) = cat(-x2, x1).
// x: [B, T, heads, head_dim]; cos, sin: [T, head_dim] (rows for x's positions).
torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos,
                           const torch::Tensor& sin);

}  // namespace minimind
