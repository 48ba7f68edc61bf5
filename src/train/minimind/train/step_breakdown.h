// Where a training step's time goes (minimind-bench --breakdown): the profiler's record of
// one step, each op's exclusive time given to a part of the step (util/step_part.h).
//
// How time is counted: every thread the step runs on (the step's own, shards side by side,
// expert tasks) records its ops. A span's exclusive time is its time minus that of the spans
// inside it on its thread, and goes to
//   - the innermost StepScope around it (products, attention, norms, ...);
//   - in the backward pass, the part whose forward op made the autograd node it runs in
//     (the node's sequence number), unless a StepScope inside the backward says otherwise;
//   - "autograd bookkeeping" for the engine's own time in a node and for AccumulateGrad;
//   - "allocation" for empty tensors (aten::empty, empty_strided, empty_like, resize_);
//   - "other ops" for ops in no part (residual adds, views, the embedding's gather ...);
//   - "between ops" for the step's thread's time in no op at all.
// The cores × the step's wall time not spent so is "idle cores" (a thread waiting for
// another is "waiting"). Rows are core time divided by the cores, so they add up to the
// step's wall time. Products OpenBLAS splits over its own threads count once.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace minimind {

// One op, node or scope as the profiler recorded it.
struct ProfiledSpan {
  std::string name;
  uint64_t thread = 0;
  double start_us = 0, end_us = 0;
  int64_t seq = -1;         // autograd sequence number: of the node a forward op makes, or a node's
  uint64_t fwd_thread = 0;  // a node's: the thread its forward op ran on
  bool backward_node = false;  // an autograd node the engine runs
  bool user_scope = false;     // a StepScope (or another user scope)
};

struct StepBreakdown {
  double step_ms = 0;  // the step's wall time
  int cores = 1;
  // (row, ms of the step): core time / cores, in a fixed order; adds up to step_ms.
  std::vector<std::pair<std::string, double>> rows;
};

// `spans`: at least the step's own "minimind::step" scope, on the thread that ran the step.
StepBreakdown break_down_step(const std::vector<ProfiledSpan>& spans, int cores);

// Several profiled steps, row by row their mean.
StepBreakdown mean_breakdown(const std::vector<StepBreakdown>& steps);

// Records every op on every thread while alive (the legacy CPU profiler); finish() stops
// and returns the spans.
class StepRecorder {
 public:
  StepRecorder();
  ~StepRecorder();
  StepRecorder(const StepRecorder&) = delete;
  StepRecorder& operator=(const StepRecorder&) = delete;
  std::vector<ProfiledSpan> finish();

 private:
  bool on_ = false;
};

// A Markdown table: row, ms, share of the step.
std::string format_breakdown(const StepBreakdown& b);
nlohmann::json breakdown_json(const StepBreakdown& b);

}  // namespace minimind
