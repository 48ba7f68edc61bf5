// The console: a status line rewritten in place after each step (on a terminal), and the
// log lines of the run (intervals with their load rows, evaluations, collapse warnings,
// checkpoints, the end), written to the run's log (console and train.log).
#pragma once

#include <spdlog/spdlog.h>

#include "minimind/train/observer.h"
#include "minimind/util/stopwatch.h"

namespace minimind {

// "45s", "3m07s", "1h02m"; "?" for a negative or unknown duration.
std::string format_duration(double seconds);

class ConsoleObserver : public Observer {
 public:
  // live: show the status line (rank 0, when stdout is a terminal). full: every metric per
  // layer (log.console: full); else lines of at most 120 columns with the timestamp.
  ConsoleObserver(spdlog::logger& log, bool live, bool full = false);
  ~ConsoleObserver() override;  // clears the status line, also when the run fails

  // max_steps here: a resumed run's first interval line comes before its first on_step.
  void on_start(const RunStart& s) override {
    world_size_ = s.world_size;
    max_steps_ = s.max_steps;
  }
  void on_step(const StepInfo& s) override;
  void on_interval(const IntervalInfo& i) override;
  void on_eval(const EvalInfo& e) override;
  void on_collapse(const CollapseRecord& c) override;
  void on_uninformative(const UninformativeRecord& u) override;
  void on_checkpoint(const CheckpointInfo& c) override;
  void on_end(const TrainResult& r) override;

 private:
  void clear_status();
  // One row per MoE layer, then the status line's throughput starts again.
  // With an interval: its router z and router gradients too.
  void log_load_rows(const char* prefix, const ExpertCounts& counts,
                     const IntervalInfo* interval = nullptr);
  spdlog::logger& log_;
  bool live_, full_;
  bool status_shown_ = false;
  int world_size_ = 1;
  bool evaluated_ = false;
  int64_t max_steps_ = 0;
  double eta_ = 0;  // of the last step
  // Throughput for the status line: tokens since the last log line (evaluations excluded).
  int64_t tokens_ = 0;
  bool logged_this_step_ = false;  // a log line came before this step's on_step
  double last_tok_s_ = 0;          // the last interval's, until the next step is timed
  Stopwatch clock_;
};

}  // namespace minimind
