// The means of one log interval: sums the steps' losses, gradient norms, counts, tokens and
// all-reduce time, and every log.interval steps (and at the last step) tells the observers.
#pragma once

#include "minimind/train/observer.h"
#include "minimind/util/stopwatch.h"

namespace minimind {

class IntervalWindow : public Observer {
 public:
  // `out`: where the IntervalInfo goes (all observers). multi_rank: report all-reduce time.
  // The router z-loss is reported when the steps train one, the dropped fraction when they
  // report drops (a capacity). flops_per_token: what a trained token costs (flops.h), for
  // the records' running FLOPs.
  IntervalWindow(int64_t interval, Observer& out, bool multi_rank, double flops_per_token)
      : interval_(interval),
        out_(out),
        multi_rank_(multi_rank),
        flops_per_token_(flops_per_token) {}
  void on_step(const StepInfo& s) override;
  // Evaluation time is not training throughput.
  void on_eval(const EvalInfo&) override { clock_.restart(); }
  // The sums of an interval a checkpoint cut in two ("interval" in state.json).
  void save_state(nlohmann::json& into) const override;
  void restore_state(const nlohmann::json& from) override;

 private:
  int64_t interval_;
  Observer& out_;
  bool multi_rank_, z_loss_on_ = false;
  double flops_per_token_;
  double loss_ = 0, lm_ = 0, aux_ = 0, z_ = 0, grad_norm_ = 0, comm_ = 0;
  int64_t steps_ = 0, tokens_ = 0, real_tokens_ = 0;
  // Capacity: dropped and all assignments, all layers; both stay 0 while no step reports
  // drops (no capacity), and then the interval has no dropped fraction.
  int64_t dropped_ = 0, assigned_ = 0;
  ExpertCounts counts_;
  std::vector<LayerStats> layers_;  // per MoE layer, summed over the interval's steps
  Stopwatch clock_;
};

}  // namespace minimind
