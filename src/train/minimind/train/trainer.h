// The training run: MiniMind's loop (loss = (LM + summed aux) / accumulation_steps per
// micro-step; clip, AdamW, cosine lr per optimizer step), validation, expert-load logs,
// checkpoints and exact resume. minimind-train is a thin CLI around train().
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "minimind/config.h"
#include "minimind/dist/distributed.h"
#include "minimind/model/minimind_model.h"

#include "minimind/error.h"

namespace minimind {

struct TrainOptions {
  std::string out_dir;     // run directory; empty: runs/<run.name>
  bool resume = false;     // continue from the newest complete checkpoint in out_dir
  bool overwrite = false;  // start afresh in an out_dir that holds an earlier run
  // Called after each optimizer step (tests: to stop, poison weights, or raise a signal);
  // returning true stops the run as SIGINT would (a checkpoint is written first).
  std::function<bool(int64_t step, MiniMindForCausalLM& model)> after_step;
  // Several ranks (torchrun's variables): data sharded by rank, gradients averaged, only
  // rank 0 writes the run directory. nullptr: one process.
  Distributed* dist = nullptr;
};

struct TrainResult {
  std::string run_dir;
  int64_t step = 0;          // optimizer steps done
  bool interrupted = false;  // stopped by SIGINT/SIGTERM (or stop_after_step)
  int signal = 0;            // the signal that stopped it, if any
  std::vector<double> step_losses;  // loss (LM + aux) of each step run by this call
  double first_val_loss = 0, last_val_loss = 0;
  double seconds = 0;        // wall time of this call's training loop
  int64_t tokens = 0;        // training tokens seen in total (all ranks)
  double comm_seconds = 0;   // in gradient/statistics all-reduces (several ranks)
};

// Runs (or resumes) training. Throws ConfigError, DataError, CheckpointError or
// TrainError (non-finite loss, bad run directory) with a clear message.
TrainResult train(const Config& cfg, const TrainOptions& options);

}  // namespace minimind
