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

#include <array>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "minimind/util/matmul.h"

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

// The step's products beside their own speed: every product a ProductLog counted over
// `steps` profiled steps, each shape timed again alone on one core (time_product_alone),
// per step and as core time / cores like the breakdown's rows. The gap between a row and its
// lone time is what the products lose inside the step (operands out of cache, the other
// core's traffic); the lone time over all rows bounds the step's MFU from above.
struct ProductsAlone {
  struct Row {
    std::string name;
    double step_ms = -1;  // the breakdown's row; < 0 where that row holds more (attention)
    double alone_ms = 0;
    double gflop = 0;  // per step
  };
  std::vector<Row> rows;  // forward, by input, by weight, attention's, any others
  // The products by family: alike but for the dimension that counts a product's tokens
  // (m forward and by input, k by weight), which varies with each expert's share; attention's
  // by kernel and transposes (its row blocks vary in every dimension). Per step, core time /
  // cores like the rows: in the kernel inside the step (the log's timing) and alone.
  struct Family {
    std::string row;  // its row's name
    Precision precision = Precision::fp32;
    char ta = 'N', tb = 'N';
    std::array<int64_t, 2> m{}, n{}, k{};  // each dimension's smallest and largest
    double per_step = 0, step_ms = 0, alone_ms = 0;
    double lost_ms() const { return step_ms - alone_ms; }
  };
  std::vector<Family> families;  // the most time lost in the step first
  int cores = 1;
  double alone_ms() const;
  double gflop() const;
  // The breakdown's step had its three product rows taken their lone time.
  double step_ms_at_lone_speed(const StepBreakdown& b) const;
};

ProductsAlone time_products_alone(const std::map<ProductShape, ProductTally>& tallies, int steps,
                                  const StepBreakdown& b);

// A Markdown table: each row in the step and alone, its GFLOP/s per core alone and that as
// a share of `peak_gflops` (one core's).
std::string format_products_alone(const ProductsAlone& p, double peak_gflops);
// A Markdown table of the `top` families that lose the most time in the step: their calls a
// step, a call's mean time in the step and alone, and the time lost a step.
std::string format_product_families(const ProductsAlone& p, size_t top);
nlohmann::json products_alone_json(const ProductsAlone& p);

}  // namespace minimind
