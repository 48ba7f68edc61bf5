// Shards of one micro-batch trained side by side, one thread and one core each: the
// serial third of a step (elementwise ops, softmax, norms, autograd bookkeeping) then runs
// on every core instead of one while OpenBLAS's other threads wait in sched_yield.
//
// Why: with OpenBLAS on both cores only the GEMMs use the second core; two one-thread
// processes train more tokens/s than one two-thread process (measured in
// docs/benchmarks/2026-12-01-data-and-processes.md).
//
// The shards of a micro-batch meet where a loss needs the whole micro-batch (an expert's
// share of its assignments): `ShardGroup::sum`, which adds every shard's tensor in shard
// order, so each shard gets the same bits, run after run.
#pragma once

#include <torch/torch.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

namespace minimind {

class ShardGroup {
 public:
  explicit ShardGroup(int shards) : parts_(static_cast<size_t>(shards)) {}

  int size() const { return static_cast<int>(parts_.size()); }

  // Every shard calls it, in the same order of calls; `t` becomes the sum over the shards
  // (shard 0 + shard 1 + ...), to which the last shard to arrive first applies `then` (once
  // for the group: e.g. the sum over a job's ranks). Throws once the group is aborted.
  void sum(int shard, torch::Tensor& t, const std::function<void(torch::Tensor&)>& then = {});

  // A shard failed: the others stop waiting in sum() (they throw) instead of forever.
  void abort();

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<torch::Tensor> parts_;
  torch::Tensor result_;
  int arrived_ = 0;
  int64_t round_ = 0;
  bool aborted_ = false;
};

// Runs task(0) .. task(n - 1) at once, task 0 on the calling thread and each other on a
// thread of its own (all n are needed: the tasks wait for each other in ShardGroup::sum),
// with OpenBLAS at one thread meanwhile and restored after. The threads carry the caller's
// ATen thread-local state (grad mode, profiler). When a task throws, `group` is aborted so
// the others stop; the first exception is rethrown here once every thread has stopped.
void run_side_by_side(int n, ShardGroup& group, const std::function<void(int)>& task);

}  // namespace minimind
