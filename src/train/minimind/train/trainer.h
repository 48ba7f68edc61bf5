// The training run: MiniMind's loop (loss = (LM + summed aux) / accumulation_steps per
// micro-step; clip, AdamW, cosine lr per optimizer step) with the observers that log,
// evaluate and checkpoint it, and exact resume. minimind-train is a thin CLI around train().
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "minimind/config.h"
#include "minimind/dist/distributed.h"
#include "minimind/error.h"
#include "minimind/model/minimind_model.h"
#include "minimind/train/observer.h"
#include "minimind/util/stop_flag.h"

namespace minimind {

struct TrainOptions {
  std::string out_dir;     // run directory; empty: runs/<run.name>
  bool resume = false;     // continue from the newest complete checkpoint in out_dir
  bool overwrite = false;  // start afresh in an out_dir that holds an earlier run
  // Checked after every optimizer step: a request stops the run at that step, after a
  // checkpoint (the main sets it from SIGINT/SIGTERM). nullptr: never.
  const StopFlag* stop = nullptr;
  // Several ranks (torchrun's variables): data sharded by rank, gradients averaged, only
  // rank 0 writes the run directory. nullptr: one process.
  Distributed* dist = nullptr;
  // More observers, notified after the trainer's own (minimind-train adds the report).
  std::vector<Observer*> observers;
  // Tests: called after each optimizer step; returning true stops the run like a stop
  // request without a signal.
  std::function<bool(int64_t step, MiniMindForCausalLM& model)> after_step;
};

// Runs (or resumes) training. Throws an Error (ConfigError, DataError, TokenizerError,
// CheckpointError, TrainError for a bad run directory or a non-finite loss, DistError).
TrainResult train(const Config& cfg, const TrainOptions& options);

}  // namespace minimind
