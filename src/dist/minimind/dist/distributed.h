// Data-parallel training on LibTorch's own c10d engine, launched the way torchrun
// launches jobs: every process reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR and MASTER_PORT, meets the others at a TCPStore served by rank 0 and joins
// a ProcessGroupGloo (CPU). Without those variables a process is a world of one and every
// collective below is a no-op.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "minimind/error.h"

namespace minimind {

struct DistEnv {
  int rank = 0, world_size = 1;
  int local_rank = 0, local_world_size = 1;  // on this machine (threads per rank)
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
};

// Reads torchrun's variables. None set (or WORLD_SIZE unset): a single process. Some set
// but not all, or a value out of range: DistError naming the variable.
DistEnv dist_env_from_environment();

class Distributed {
 public:
  // A world of one: no process group, collectives do nothing.
  Distributed();
  // Joins the job: waits at most `timeout` for every rank to arrive, and afterwards fails
  // any collective that waits longer than that (a hung or dead rank), with a DistError.
  Distributed(const DistEnv& env, std::chrono::milliseconds timeout);
  ~Distributed();
  Distributed(const Distributed&) = delete;
  Distributed& operator=(const Distributed&) = delete;

  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  bool is_main() const { return env_.rank == 0; }
  const DistEnv& env() const { return env_; }

  // In place, elementwise over ranks. CPU tensors of any dtype Gloo knows.
  void all_reduce_sum(torch::Tensor& t);
  void all_reduce_max(torch::Tensor& t);
  // The same on plain numbers (counts, loss sums), in place.
  void all_reduce_sum(std::vector<int64_t>& values);
  void all_reduce_sum(std::vector<double>& values);
  // Gradients of `params` (all defined: fill_missing_gradients first) replaced by their
  // mean over ranks, moved in flat buffers of at most bucket_bytes each.
  void average_gradients(const std::vector<torch::Tensor>& params, int64_t bucket_bytes = 64 << 20);
  // The same with the sum divided by `divisor` rather than the world size (expert
  // parallelism: an expert's gradient summed over the ranks holding it, divided by all ranks).
  void sum_gradients_divided(const std::vector<torch::Tensor>& params, double divisor,
                             int64_t bucket_bytes = 64 << 20);
  // Every rank gets rank 0's values (parameters at start-up).
  void broadcast_from_main(const std::vector<torch::Tensor>& tensors);
  void barrier();
  // Rows of `input` [sum(send), ...] go in consecutive blocks of send[q] rows to rank q;
  // returns [sum(recv), ...], the blocks of ranks 0, 1, ... in order (recv[q] rows from
  // rank q). Uneven blocks, empty ones included. A world of one returns `input`.
  torch::Tensor all_to_all(const torch::Tensor& input, const std::vector<int64_t>& send,
                           const std::vector<int64_t>& recv);
  // Every rank's `t` (same shape and dtype on every rank), stacked in rank order: [world, ...]
  // on rank 0; undefined on the others.
  torch::Tensor gather_to_main(const torch::Tensor& t);

  // A group of some of this job's ranks (`ranks`: job ranks, ascending, this one among
  // them) with collectives of its own, over the same store; `name` tells groups apart.
  // Every listed rank calls it with the same arguments, and every rank creates its groups
  // in one order shared by all (a rank waits here for the group's others). In the group,
  // rank() is the place in `ranks`; errors name job ranks.
  std::unique_ptr<Distributed> subgroup(const std::string& name, const std::vector<int>& ranks);

  // Wall time spent in collectives since construction (for the logs).
  double comm_seconds() const { return comm_seconds_; }

 private:
  void run(const char* what, const std::function<void()>& op);
  std::string who() const;  // "rank R of W" in job ranks

  struct Group;  // the c10d store and process group (kept out of this header)
  DistEnv env_;
  // A subgroup: the job ranks of its members and of the whole job's size; empty for the job.
  std::vector<int> job_ranks_;
  int job_world_ = 0;
  std::chrono::milliseconds timeout_{0};
  std::unique_ptr<Group> group_;
  double comm_seconds_ = 0;
};

}  // namespace minimind
