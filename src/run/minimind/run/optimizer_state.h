// AdamW's state in a checkpoint (optimizer.pt). Format 2 is a plain torch.save-compatible
// pickle of {name: tensor}, so it goes through the same hardened reader as the weights (and
// Python's torch.load reads it): for the optimizer's i-th parameter, "i.step" (int64
// scalar), "i.exp_avg" and "i.exp_avg_sq" (the parameter's shape, float32). A parameter
// without state (no step taken yet) has no entries. Format 1 checkpoints hold
// torch::save(optimizer), a TorchScript archive read by LibTorch's TorchScript importer.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

namespace minimind {

// AdamW's state of one parameter; step < 0: none yet.
struct ParamState {
  int64_t step = -1;
  torch::Tensor exp_avg, exp_avg_sq;
};

// The optimizer's states in its parameters' order.
std::vector<ParamState> optimizer_states(torch::optim::AdamW& optimizer);
// optimizer.pt's bytes for the states of parameters 0, 1, ... (the whole model's order).
std::vector<char> optimizer_state_bytes(const std::vector<ParamState>& states);
std::vector<char> optimizer_state_bytes(torch::optim::AdamW& optimizer);

// Replaces the optimizer's state with the file's. CheckpointError naming the file and the
// entry when it does not fit the optimizer's parameters; WeightsError when it is no pickle.
// whole_index (expert parallelism): the file's index of each of the optimizer's parameters,
// of whole_count in the file; entries of the others (other ranks' experts) are left. Empty:
// the optimizer holds every parameter, in the file's order.
void load_optimizer_state(torch::optim::AdamW& optimizer, const std::string& file,
                          int format_version, const std::vector<int64_t>& whole_index = {},
                          int64_t whole_count = 0);

}  // namespace minimind
