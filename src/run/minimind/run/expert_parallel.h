// Expert parallelism on c10d (run.expert_parallel = N, docs/distributed.md): the job's ranks
// form expert groups of N consecutive ranks (ranks r and r' share one when r / N == r' / N);
// rank r holds shard r % N of every MoE layer's routed experts, and the ranks holding the
// same shard in different groups (r % N equal) are its replicas. Within a group the MoE
// layers exchange token rows all-to-all (model/expert_exchange.h); the gradient of an expert
// is summed over its replicas; a checkpoint gathers group 0's shards on rank 0 and is the
// whole model's, whatever N is.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "minimind/dist/distributed.h"
#include "minimind/model/expert_exchange.h"
#include "minimind/model/minimind_model.h"
#include "minimind/model/weights_io.h"
#include "minimind/run/optimizer_state.h"

namespace minimind {

class ExpertParallel final : public ExpertExchange {
 public:
  // Forms the groups (every rank of the job calls this, in step). `channels`: the
  // micro-batch shards each rank trains side by side (each gets connections of its own).
  // N must divide the job's ranks (the session checks it first).
  ExpertParallel(Distributed& job, int n, int channels);

  int size() const override { return n_; }
  int index() const override { return index_; }
  torch::Tensor all_to_all(const torch::Tensor& rows, const std::vector<int64_t>& send,
                           const std::vector<int64_t>& recv, int channel) override;

  ExpertShard shard() const { return {index_, n_}; }
  bool in_first_group() const { return group_id_ == 0; }
  Distributed& group() { return *channels_.at(0); }  // this rank's expert group
  Distributed& replicas() { return *replicas_; }     // the ranks holding the same shard
  Distributed& job() { return job_; }

  // What this rank's exchanges moved since the last call, which resets it. (The token rows
  // each rank sends to each, per layer, are in LayerStats::exchange.)
  struct Traffic {
    int64_t bytes = 0;   // to and from other ranks, every exchange, forward and backward
    double seconds = 0;  // in the exchanges (shards side by side: their mean)
  };
  Traffic take_traffic();

 private:
  Distributed& job_;
  int n_, index_, group_id_;
  std::vector<std::unique_ptr<Distributed>> channels_;  // the group, once per channel
  std::unique_ptr<Distributed> replicas_;
  std::mutex traffic_mutex_;
  Traffic traffic_;
  double seconds_taken_ = 0;  // the channels' exchange time up to the last take_traffic
};

// The model's parameters apart: replicated on every rank, and the routed experts held here.
struct SplitParameters {
  std::vector<torch::Tensor> replicated, experts;
};
SplitParameters split_parameters(const MiniMindForCausalLM& model);

// The whole model a checkpoint holds, from ranks holding parts of it: on the job's rank 0
// the weights (state_dict order) and AdamW's states (whole-model order); nothing elsewhere.
// Every rank of the first expert group takes part (a gather per expert tensor); the others
// return at once.
struct WholeModel {
  NamedTensors weights;
  std::vector<ParamState> optimizer;
};
std::optional<WholeModel> gather_whole_model(const MiniMindForCausalLM& model,
                                             torch::optim::AdamW& optimizer, ExpertParallel& ep);

// The optimizer's parameters' places in the whole model (load_optimizer_state's
// whole_index) and the whole model's parameter count.
std::vector<int64_t> whole_parameter_index(const MiniMindForCausalLM& model, int64_t* count);

}  // namespace minimind
