// What the training loop tells the pieces around it, and the interface they implement.
//
// The loop (trainer.cpp) only trains: step, non-finite guard, stop agreement. Everything
// else is an Observer it notifies: the interval means, the console, the run logs, the
// collapse watcher, the evaluator, the checkpointer, and whatever the caller adds (the
// report writer). Observers are called in the order they were added; a piece that has news
// of its own (interval means, an evaluation, a collapse, a checkpoint) passes it to all of
// them through the Observers it was given.
#pragma once

#include <spdlog/spdlog.h>

#include <cstdint>
#include <string>
#include <vector>

#include "minimind/run/expert_counts.h"
#include "minimind/run/run_log.h"
#include "minimind/train/step_stats.h"

namespace minimind {

struct RunStart {
  std::string run_dir;
  bool main_rank = true;  // only rank 0 writes the run directory
  int world_size = 1;
  int64_t step = 0;  // where the run starts: 0, or the checkpoint's step
  bool resumed = false;
  spdlog::logger* log = nullptr;  // the run's log: console and run_dir/train.log
  int64_t max_steps = 0;
};

// After each optimizer step.
struct StepInfo {
  int64_t step = 0;  // optimizer steps done, this one included
  int64_t max_steps = 0;
  int64_t first_step = 0;   // the step this call started at
  int64_t tokens = 0;       // training tokens so far, all ranks
  double lr = 0;            // this step's learning rate
  double loop_seconds = 0;  // wall time of this call's loop so far
  double run_seconds = 0;   // training time of the whole run so far, earlier calls included
  const StepStats* stats = nullptr;
};

// Every log.interval steps and at the last step: means over the interval's steps.
struct IntervalInfo {
  TrainRecord record;
  ExpertCounts counts;  // summed over the interval (with the router sums)
  // per MoE layer over the interval's steps, as layer_stats.h combines them (z: the mean;
  // the router gradient by source: the last step's)
  std::vector<LayerStats> layers;
};

// After each evaluation of the validation split.
struct EvalInfo {
  EvalRecord record;
  ExpertCounts counts;
  int64_t documents = 0;
  double seconds = 0;
};

struct CheckpointInfo {
  int64_t step = 0;
  std::string dir;
};

struct TrainResult {
  std::string run_dir;
  int64_t step = 0;        // optimizer steps done
  int64_t start_step = 0;  // where this call started (a resumed run's checkpoint)
  int64_t tokens = 0;      // training tokens seen in total (all ranks)
  int64_t start_tokens = 0;
  bool interrupted = false;         // stopped by a stop request (signal) or the after_step hook
  int signal = 0;                   // the signal that stopped it, if any
  std::vector<double> step_losses;  // loss (LM + aux) of each step run by this call
  double first_val_loss = 0, last_val_loss = 0;  // of this call's evaluations
  double seconds = 0;                            // wall time of this call's training loop
  double comm_seconds = 0;         // in gradient/statistics all-reduces (several ranks)
  double router_grad_seconds = 0;  // measuring the router gradient by source (log steps)
  // Expert parallelism, this rank's: time in the experts' all-to-all exchanges and the
  // bytes they moved to and from other ranks.
  double exchange_seconds = 0;
  int64_t exchange_bytes = 0;
};

class Observer {
 public:
  virtual ~Observer() = default;
  virtual void on_start(const RunStart&) {}
  virtual void on_step(const StepInfo&) {}
  virtual void on_interval(const IntervalInfo&) {}
  virtual void on_eval(const EvalInfo&) {}
  virtual void on_collapse(const CollapseRecord&) {}
  virtual void on_uninformative(const UninformativeRecord&) {}
  // After the ranks agreed whether to stop; `last`: the run ends after this step.
  virtual void on_step_end(const StepInfo&, bool /*last*/) {}
  virtual void on_checkpoint(const CheckpointInfo&) {}
  virtual void on_end(const TrainResult&) {}
  // State that must survive a resume for the run to log what an uninterrupted one would
  // (saved in each checkpoint); a monitor without such state keeps the defaults.
  virtual void save_state(nlohmann::json& /*into*/) const {}
  virtual void restore_state(const nlohmann::json& /*from*/) {}
};

// Passes every notification on to its observers, in the order they were added.
class Observers : public Observer {
 public:
  void add(Observer& o) { list_.push_back(&o); }
  void on_start(const RunStart& x) override { each(&Observer::on_start, x); }
  void on_step(const StepInfo& x) override { each(&Observer::on_step, x); }
  void on_interval(const IntervalInfo& x) override { each(&Observer::on_interval, x); }
  void on_eval(const EvalInfo& x) override { each(&Observer::on_eval, x); }
  void on_collapse(const CollapseRecord& x) override { each(&Observer::on_collapse, x); }
  void on_uninformative(const UninformativeRecord& x) override {
    each(&Observer::on_uninformative, x);
  }
  void on_step_end(const StepInfo& x, bool last) override {
    for (Observer* o : list_) o->on_step_end(x, last);
  }
  void on_checkpoint(const CheckpointInfo& x) override { each(&Observer::on_checkpoint, x); }
  void on_end(const TrainResult& x) override { each(&Observer::on_end, x); }
  void save_state(nlohmann::json& into) const override {
    for (const Observer* o : list_) o->save_state(into);
  }
  void restore_state(const nlohmann::json& from) override {
    for (Observer* o : list_) o->restore_state(from);
  }

 private:
  template <class Event>
  void each(void (Observer::*hook)(const Event&), const Event& x) {
    for (Observer* o : list_) (o->*hook)(x);
  }
  std::vector<Observer*> list_;
};

}  // namespace minimind
