// The optimiser as MiniMind's trainer builds it: AdamW over all parameters with
// torch's defaults unless the config says otherwise, and global-norm clipping.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "minimind/config.h"
#include "minimind/dist/distributed.h"

namespace minimind {

// torch's AdamW (same options, state and serialisation: checkpoints are unchanged) whose
// step updates a float32 parameter, its two moments and the weight decay in one pass over
// memory: torch's step runs nine tensor ops per parameter (seven passes over three or four
// tensors, three temporaries). The formula and its float roundings are torch's, each
// operation rounded as torch rounds it (no fused multiply-add), so the weights agree
// with torch's AdamW to an ulp or so (tested); other tensors take torch's step. The
// float32 updates run in chunks over the cores (run_blas_tasks), the same numbers as on one.
class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  torch::Tensor step(LossClosure closure = nullptr) override;
  // step() on the gradients times `gradient_scale`, each product formed as the update reads
  // the gradient: the numbers of clip_gradients' multiplication and then step(), without
  // its pass over every gradient (the gradients are left unscaled).
  void step_scaled(float gradient_scale);

 private:
  float gradient_scale_ = 1.0f;  // x 1 is exact: step() is unchanged
};

// A FusedAdamW.
std::unique_ptr<torch::optim::AdamW> make_optimizer(const std::vector<torch::Tensor>& params,
                                                    const TrainConfig& cfg);

// Gives every parameter without a gradient a zero one: MiniMind's graph always reaches
// every parameter, so AdamW must decay and count all of them (and a multi-process
// all-reduce needs the same tensors on every rank).
void fill_missing_gradients(const std::vector<torch::Tensor>& params);

// Clips the global grad norm to max_norm (0 = no clipping); returns the norm before. With
// clipping, torch::nn::utils::clip_grad_norm_'s ops and numbers, its per-tensor norms and
// products spread over the cores. With `deferred`, the gradients are left as they are and
// the scale they would have been multiplied by goes there (1 without clipping), for
// FusedAdamW::step_scaled.
double clip_gradients(const std::vector<torch::Tensor>& params, double max_norm,
                      float* deferred = nullptr);
// The same when some parameters are spread over the ranks of `group` (expert parallelism):
// the norm over `replicated` (alike on every rank) and the `sharded` parameters of all the
// group's ranks; every rank gets the same norm and scale.
double clip_gradients(const std::vector<torch::Tensor>& replicated,
                      const std::vector<torch::Tensor>& sharded, double max_norm,
                      Distributed& group, float* deferred = nullptr);

// Drops the gradients (PyTorch's zero_grad(set_to_none=True)): the next backward stores
// its gradients as they come instead of adding them onto zero-filled buffers, which
// saves a fill and an add over every parameter per step. Same numbers: 0 + g == g.
void clear_gradients(const std::vector<torch::Tensor>& params);

}  // namespace minimind
