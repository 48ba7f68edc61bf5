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

// Gives every parameter without a gradient a zero one: MiniMind's graph always reaches
// every parameter, so AdamW must decay and count all of them (and a multi-process
// all-reduce needs the same tensors on every rank).
void fill_missing_gradients(const std::vector<torch::Tensor>& params);

// Clips the global grad norm to max_norm (0 = no clipping); returns the norm before.
double clip_gradients(const std::vector<torch::Tensor>& params, double max_norm);

// Drops the gradients (PyTorch's zero_grad(set_to_none=True)): the next backward stores
// its gradients as they come instead of adding them onto zero-filled buffers, which
// saves a fill and an add over every parameter per step. Same numbers: 0 + g == g.
void clear_gradients(const std::vector<torch::Tensor>& params);

// Both, as one process does at the end of an optimizer step's micro-batches.
double finish_gradients(const std::vector<torch::Tensor>& params, double max_norm);

}  // namespace minimind
