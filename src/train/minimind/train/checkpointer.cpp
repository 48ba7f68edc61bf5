#include "minimind/train/checkpointer.h"

namespace minimind {

void Checkpointer::on_step_end(const StepInfo& s, bool last) {
  if (s.step % cfg_.checkpoint_interval != 0 && !last) return;
  TrainState snapshot = state_;
  snapshot.elapsed_seconds = s.run_seconds;
  snapshot.monitor = nlohmann::json::object();
  out_.save_state(snapshot.monitor);
  const std::string dir =
      save_checkpoint(run_dir_, model_, optimizer_, snapshot, cfg_.keep_checkpoints, {}, ep_);
  if (!dir.empty()) out_.on_checkpoint({s.step, dir});  // "": another rank wrote it
}

}  // namespace minimind
