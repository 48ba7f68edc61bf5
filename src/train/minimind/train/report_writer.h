// The live report: report.html rewritten while the run trains (analysis/report.h renders
// it). An observer of the training loop, so it lives with the loop.
#pragma once

#include <cstdint>

#include "minimind/analysis/report.h"
#include "minimind/train/observer.h"
#include "minimind/util/stopwatch.h"

namespace minimind {

// Writes the report on rank 0: at the end of the run, and with interval_seconds > 0 (the
// run's log.report_interval) also while it trains, after every evaluation and whenever
// that many seconds have passed since the last page. A page that cannot be written (a full
// disk) is a warning; training goes on. minimind-train adds it to the trainer's observers.
class ReportWriter : public Observer {
 public:
  explicit ReportWriter(int64_t interval_seconds = 0) : interval_(interval_seconds) {}
  void on_start(const RunStart& s) override;
  void on_eval(const EvalInfo& e) override;
  void on_step_end(const StepInfo& s, bool last) override;
  void on_end(const TrainResult& r) override;

 private:
  void write(bool running);  // running: a page with the status line and a refresh
  RunStart start_;
  bool started_ = false;  // the evaluation before step 1 comes before this observer's start
  int64_t interval_;
  int64_t step_ = 0, max_steps_ = 0;
  Stopwatch since_last_;     // since the last page
  double seconds_live_ = 0;  // spent writing pages while training
  int64_t pages_ = 0;
};

}  // namespace minimind
