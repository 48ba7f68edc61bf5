// Everything a training run works on, made ready before the loop: the run directory, the
// run's log, the data, the model and optimizer, and the state to continue from.
#pragma once

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>

#include "minimind/compute_plan.h"
#include "minimind/config.h"
#include "minimind/data/batcher.h"
#include "minimind/data/token_file.h"
#include "minimind/dist/distributed.h"
#include "minimind/model/minimind_model.h"
#include "minimind/run/checkpoint.h"
#include "minimind/run/parallel_context.h"
#include "minimind/util/stop_flag.h"

namespace minimind {

struct TrainSession {
  RunDirectory run;
  // The run's log: the default logger's sinks (the console the main set up) plus
  // run_dir/train.log on rank 0; other ranks print warnings only, tagged with their rank.
  std::shared_ptr<spdlog::logger> log;
  // run_dir/train.log alone (rank 0; null elsewhere): the fatal error of a failed run goes
  // here, while the main prints it on the console.
  std::shared_ptr<spdlog::logger> file_log;
  // How this process computes (precision, library, threads, shards, expert parallelism),
  // decided once from the config and the machine; `compute` applies it for the session's
  // life (the trainer's loop runs inside it).
  ComputePlan plan;
  std::optional<ComputeScope> compute;
  TokenFile train_tokens;
  std::optional<TokenFile> val_tokens;  // none when there is no validation split
  // data.mode sft: the token files' chat indexes (SftIndex); null otherwise.
  std::shared_ptr<const SftIndex> train_chat, val_chat;
  std::optional<BatchSampler> sampler;  // draws from train_tokens, positioned to continue
  // Expert parallelism (run.expert_parallel > 1): the expert groups; the model holds this
  // rank's shard of the experts and exchanges rows over it. Null otherwise.
  std::unique_ptr<ExpertParallel> ep;
  ParallelContext parallel;  // the job's ranks and `ep`
  MiniMindForCausalLM model{nullptr};
  std::unique_ptr<torch::optim::AdamW> optimizer;
  TrainState state;  // fresh, or restored from run.checkpoint
};

// Opens (or resumes) the run in run_dir: checks a resumed run's config against its
// checkpoint (a different model is a CheckpointError naming the keys), writes config.yaml,
// decides and applies the compute plan (compute_plan.h), sets the seed, prepares the data (rank 0
// first, the others then find it in the cache), builds or restores model, optimizer and data
// position, and gives every rank rank 0's weights. Not movable: the sampler refers to train_tokens.
// A request on `stop` during data preparation throws Interrupted.
std::unique_ptr<TrainSession> open_session(const Config& cfg, const std::string& run_dir,
                                           bool resume, bool overwrite, Distributed& dist,
                                           const StopFlag* stop = nullptr);

// Writes a run's fatal error to its train.log (the console gets it from the main).
void log_failure(const TrainSession& s, const std::exception& e);

}  // namespace minimind
