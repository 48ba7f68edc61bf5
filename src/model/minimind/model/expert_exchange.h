// Expert parallelism (run.expert_parallel = N): the routed experts of every MoE layer are
// spread over the N ranks of an expert group, rank i of the group holding experts
// [i E/N, (i + 1) E/N); everything else is replicated. After routing, a layer sends each
// assignment's token row to the rank that owns its expert, that rank runs its experts on
// what it received, and the outputs go back (docs/distributed.md, "Expert parallelism").
// The model layer knows no processes: it reaches the other ranks through ExpertExchange,
// which the run layer implements on c10d.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace minimind {

// Which routed experts this process holds: shard `index` of `count` (count 1: all).
struct ExpertShard {
  int64_t index = 0, count = 1;
  bool whole() const { return count == 1; }
  // The first expert of the shard and how many it holds, of E.
  int64_t first(int64_t E) const { return index * (E / count); }
  int64_t size(int64_t E) const { return E / count; }
  bool holds(int64_t e, int64_t E) const { return e >= first(E) && e < first(E) + size(E); }
};

class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  // The group's size (N) and this rank's place in it (its ExpertShard's index).
  virtual int size() const = 0;
  virtual int index() const = 0;
  // Rows of `rows` [sum(send), C] go in consecutive blocks of send[q] rows to the group's
  // rank q; returns [sum(recv), C], the blocks received from ranks 0, 1, ... in order.
  // `channel` is the micro-batch shard that calls (0 without shards): shards side by side
  // each talk over connections of their own, so their messages cannot interleave.
  virtual torch::Tensor all_to_all(const torch::Tensor& rows, const std::vector<int64_t>& send,
                                   const std::vector<int64_t>& recv, int channel) = 0;
};

// all_to_all as an autograd node: the gradient of the rows received goes back to their
// senders by the same exchange reversed (recv and send swapped), over the same channel.
torch::Tensor exchange_rows(ExpertExchange& exchange, const torch::Tensor& rows,
                            const std::vector<int64_t>& send, const std::vector<int64_t>& recv,
                            int channel);

}  // namespace minimind
