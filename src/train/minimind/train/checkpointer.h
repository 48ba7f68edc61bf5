// Rank 0's checkpoints: every train.checkpoint_interval steps, at the last step and when
// the run stops early, keeping the newest train.keep_checkpoints. With expert parallelism
// every rank of the first expert group has one: they gather the experts on rank 0.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>

#include "minimind/config.h"
#include "minimind/model/minimind_model.h"
#include "minimind/run/checkpoint.h"
#include "minimind/train/observer.h"

namespace minimind {

// What to do after training diverged: with `before_any_update` (the first forward of this
// process was already non-finite) the config or the starting weights overflow, not the
// learning rate; otherwise a gentler step, then --resume from `last` (a new start when there
// is no checkpoint yet).
std::string divergence_hint(bool before_any_update, const std::optional<std::string>& last);

class Checkpointer : public Observer {
 public:
  // state: the loop's TrainState (read at each save; its elapsed time is the run's).
  Checkpointer(MiniMindForCausalLM model, torch::optim::AdamW& optimizer, const TrainState& state,
               std::string run_dir, const TrainConfig& cfg, Observer& out,
               const ParallelContext& parallel = {})
      : model_(std::move(model)),
        optimizer_(optimizer),
        state_(state),
        run_dir_(std::move(run_dir)),
        cfg_(cfg),
        out_(out),
        parallel_(parallel) {}
  void on_step_end(const StepInfo& s, bool last) override;

 private:
  MiniMindForCausalLM model_;
  torch::optim::AdamW& optimizer_;
  const TrainState& state_;
  std::string run_dir_;
  const TrainConfig& cfg_;
  Observer& out_;
  ParallelContext parallel_;
};

}  // namespace minimind
