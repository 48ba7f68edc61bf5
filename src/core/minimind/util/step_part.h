// The named parts of a training step (products, attention, norms, the loss, ...), marked in
// the code that does them, so that minimind-bench --breakdown (train/step_breakdown.h) can
// say where a step's time goes.
//
// A StepScope is a RecordFunction user scope named "minimind::<part>" while a profiler
// listens, and costs a thread-local store otherwise. The part also follows the work onto the
// helper threads run_blas_tasks and run_side_by_side start (`current_step_part`), since the
// profiler sees those threads' ops without the scopes of the thread that started them.
#pragma once

#include <ATen/record_function.h>

#include <cstdint>
#include <optional>

namespace minimind {

enum class StepPart : uint8_t {
  step,                 // the whole step; ops in no other part are "other ops"
  product_forward,      // projections' and experts' products, forward
  product_grad_input,   // their backward products by the input
  product_grad_weight,  // their backward products by the weight
  attention,            // scores, mask, softmax and the product with v, both ways
  norm,                 // RMSNorm, both ways
  activation,           // SiLU and the gating product, both ways
  rope,                 // rotary embedding, both ways
  routing,              // the router: gate scores, top-k, balancing losses, statistics
  dispatch,             // experts' gather, weighting and scatter, and their exchange
  embedding,            // token embedding, both ways
  loss,                 // logits to loss, both ways
  optimizer,            // gradient clipping, AdamW, the router bias update
  cast,                 // rounding to bf16
  wait,                 // waiting for other threads (shards, tasks) to finish
};
constexpr int kStepParts = static_cast<int>(StepPart::wait) + 1;

// "minimind::product_forward" ...
const char* step_part_scope(StepPart part);

// The innermost part this thread is in (StepPart::step outside any).
StepPart current_step_part();

class StepScope {
 public:
  explicit StepScope(StepPart part);
  ~StepScope();
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;

 private:
  std::optional<at::RecordFunction> record_;
  StepPart outer_;
};

// f() as `part`: in_part(StepPart::activation, [&] { at::silu_out(s, g); }).
template <class F>
decltype(auto) in_part(StepPart part, F&& f) {
  const StepScope scope(part);
  return f();
}

}  // namespace minimind
