// MiniMind's learning-rate schedule, with an optional linear warm-up.
#pragma once

#include <cmath>
#include <cstdint>

namespace minimind {

// lr at optimizer step t (0-based) of T: warm-up lr * (t + 1) / W for t < W, then
// MiniMind's cosine lr * (0.1 + 0.45 * (1 + cos(pi * t' / T'))) over the remaining
// T' = T - W steps (t' = t - W), which falls from lr to 0.1 * lr.
inline double learning_rate_at(int64_t t, int64_t T, double lr, int64_t warmup) {
  if (t < warmup) return lr * static_cast<double>(t + 1) / static_cast<double>(warmup);
  const double progress = static_cast<double>(t - warmup) / static_cast<double>(T - warmup);
  return lr * (0.1 + 0.45 * (1.0 + std::cos(M_PI * progress)));
}

}  // namespace minimind
