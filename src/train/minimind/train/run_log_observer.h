// Rank 0's run logs: expert load of every step, interval means, evaluations and collapse
// events, written as the records of run/run_log.h.
#pragma once

#include "minimind/run/run_log.h"
#include "minimind/train/observer.h"

namespace minimind {

class RunLogObserver : public Observer {
 public:
  // keep_until_step >= 0 (resume): earlier lines up to that step are kept. aux_coef: the
  // model's router_aux_loss_coef, to log each layer's aux loss unscaled.
  RunLogObserver(const std::string& run_dir, int64_t keep_until_step, double aux_coef)
      : writer_(run_dir, keep_until_step), aux_coef_(aux_coef) {}
  void on_step(const StepInfo& s) override;
  void on_interval(const IntervalInfo& i) override { writer_.write(i.record); }
  void on_eval(const EvalInfo& e) override;
  void on_collapse(const CollapseRecord& c) override { writer_.write(c); }
  void on_uninformative(const UninformativeRecord& u) override { writer_.write(u); }
  void write(const InitRecord& r) { writer_.write(r); }
  void write(const FlopsRecord& r) { writer_.write(r); }

 private:
  RunLogWriter writer_;
  double aux_coef_;
};

}  // namespace minimind
