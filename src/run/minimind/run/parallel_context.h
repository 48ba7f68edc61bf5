// The processes a computation spans, passed as one value to what needs any of them (the
// optimizer step, checkpoints, evaluation): the job's ranks and, under expert parallelism,
// the expert groups. The default is one process holding the whole model.
#pragma once

#include "minimind/dist/distributed.h"
#include "minimind/run/expert_parallel.h"

namespace minimind {

struct ParallelContext {
  // The job's ranks (data parallel: each trains its own rows, gradients are averaged).
  // nullptr: this process alone.
  Distributed* job = nullptr;
  // Expert parallelism (run.expert_parallel > 1): the expert groups the model's shard of the
  // routed experts exchanges rows over (apply_expert_parallel). nullptr: every rank holds
  // every expert.
  ExpertParallel* experts = nullptr;

  int world_size() const { return job ? job->world_size() : 1; }
};

}  // namespace minimind
