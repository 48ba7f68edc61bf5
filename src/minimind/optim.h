// The optimiser as MiniMind's trainer builds it: AdamW over all parameters with
// torch's defaults unless the config says otherwise, and global-norm clipping.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "minimind/config.h"

namespace minimind {

std::unique_ptr<torch::optim::AdamW> make_optimizer(const std::vector<torch::Tensor>& params,
                                                    const TrainConfig& cfg);

// Gives every parameter without a gradient a zero one (MiniMind's graph always reaches
// every parameter, so AdamW must decay and count all of them), clips the global grad
// norm to max_norm (0 = no clipping) and returns the norm before clipping.
double finish_gradients(const std::vector<torch::Tensor>& params, double max_norm);

}  // namespace minimind
