// A weight cast to the exported type, refused when the cast or the weight itself is not
// finite: f16 holds magnitudes up to 65,504, and a file must never carry inf or NaN that a
// runtime would compute with silently.
#pragma once

#include <fmt/format.h>
#include <torch/torch.h>

#include <string>

#include "minimind/error.h"

namespace minimind {

inline torch::Tensor checked_cast(const std::string& name, const torch::Tensor& t,
                                  c10::ScalarType type) {
  const torch::Tensor c = t.detach().to(torch::kCPU).to(type).contiguous();
  if (!t.is_floating_point() || c.isfinite().all().item<bool>()) return c;
  if (!t.detach().isfinite().all().item<bool>())
    throw WeightsError("tensor " + name + " holds NaN or infinite values",
                       "the checkpoint diverged or is damaged; export an earlier one");
  const double largest = t.detach().abs().max().item<double>();
  throw WeightsError(
      fmt::format("tensor {} holds a value of magnitude {:.6g}, beyond {}'s largest ({:.6g})", name,
                  largest, c10::toString(type), type == torch::kFloat16 ? 65504.0 : 3.38953e38),
      "export with --dtype bf16 (the range of f32) or --dtype f32");
}

}  // namespace minimind
