// Reading a run directory's logs (metrics.jsonl, expert_load.jsonl, events.jsonl) for
// inspection and reports. Works on a run still being written: a partial last line is
// ignored.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace minimind {

struct TrainPoint {
  int64_t step = 0;
  double loss = 0, lm_loss = 0, aux_loss = 0, lr = 0, grad_norm = 0, tok_per_s = 0;
};
struct EvalPoint {
  int64_t step = 0;
  double val_loss = 0;
};
struct LoadPoint {
  int64_t step = 0;
  std::vector<int64_t> counts;
  double max_vio = 0, entropy = 0, max_share = 0;
  int64_t dead = 0;
};
struct CollapseMark {
  int64_t step = 0, layer = 0;
  std::string message;
};

struct RunLogs {
  std::string run_dir;
  std::vector<TrainPoint> train;
  std::vector<EvalPoint> eval;
  std::map<int64_t, std::vector<LoadPoint>> train_load;  // layer -> one point per step
  std::map<int64_t, std::vector<LoadPoint>> eval_load;   // layer -> one point per evaluation
  std::vector<CollapseMark> collapses;
  int64_t last_step() const;
};

// Throws DataError when the directory holds no run logs.
RunLogs read_run_logs(const std::string& run_dir);

// Sum of the counts of the last `steps` training steps of a layer.
std::vector<int64_t> recent_counts(const std::vector<LoadPoint>& points, size_t steps);

}  // namespace minimind
