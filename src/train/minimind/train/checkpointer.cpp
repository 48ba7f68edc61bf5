#include "minimind/train/checkpointer.h"

#include <fmt/format.h>

namespace minimind {
namespace {

// A diverged model is never saved: the newest checkpoint must stay one worth resuming. The
// loss of a step is checked as it is computed; the update after it (the last step's, say)
// can still make weights non-finite, so they are checked here, once per checkpoint.
void refuse_non_finite_weights(const MiniMindForCausalLM& model, int64_t step,
                               const std::string& run_dir) {
  torch::NoGradGuard no_grad;
  for (const auto& p : model->named_parameters()) {
    if (p.value().isfinite().all().item<bool>()) continue;
    const auto last = latest_checkpoint(run_dir);
    throw TrainError(fmt::format("non-finite weights after step {} (first in {}); not saved as a "
                                 "checkpoint. The last good checkpoint is {}.",
                                 step, p.key(), last ? *last : std::string("(none yet)")),
                     divergence_hint(false, last));
  }
}

}  // namespace

std::string divergence_hint(bool before_any_update, const std::optional<std::string>& last) {
  if (before_any_update)
    return "the model's output overflows before any update: look for a key that scales it "
           "(model.routed_scaling_factor, model.rope_theta, model.rms_norm_eps) or for "
           "non-finite values in train.init_from's weights";
  return last ? "try a lower train.learning_rate or train.grad_clip, then --resume (from " + *last +
                    ")"
              : std::string(
                    "try a lower train.learning_rate or train.grad_clip and start "
                    "again (there is no checkpoint to resume from yet)");
}

void Checkpointer::on_step_end(const StepInfo& s, bool last) {
  if (s.step % cfg_.checkpoint_interval != 0 && !last) return;
  refuse_non_finite_weights(model_, s.step, run_dir_);
  TrainState snapshot = state_;
  snapshot.elapsed_seconds = s.run_seconds;
  snapshot.monitor = nlohmann::json::object();
  out_.save_state(snapshot.monitor);
  const std::string dir =
      save_checkpoint(run_dir_, model_, optimizer_, snapshot, cfg_.keep_checkpoints, {}, parallel_);
  if (!dir.empty()) out_.on_checkpoint({s.step, dir});  // "": another rank wrote it
}

}  // namespace minimind
