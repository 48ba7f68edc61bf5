// A forward over one shard of a micro-batch (some of its rows), run side by side with the
// other shards (train_step.cpp): every mean over the micro-batch divides by the whole
// micro-batch's count, and the expert shares the micro-batch aux loss reads are summed
// over the shards, so the shards' losses add up to the micro-batch's loss. Not for
// capacity (which ranks the whole batch's tokens), the random router or dropout (which
// draw from torch's one generator); batch_shards() says when shards are allowed.
#pragma once

#include <torch/torch.h>

#include <functional>

#include "minimind/util/side_by_side.h"

namespace minimind {

struct BatchShard {
  int index = 0;                // this shard, 0 .. group->size() - 1
  ShardGroup* group = nullptr;  // the micro-batch's shards
  int64_t rows = 0;             // B of the whole micro-batch
  int64_t tokens = 0;           // B * T of the whole micro-batch
  int64_t targets = 0;          // labels the LM loss counts (labels[:, 1:] != -100), all rows
  int64_t real_tokens = 0;      // tokens that are not padding (input_ids != 0), all rows
  // In place: the sum of `t` over the shards (each shard calls it), then `then` once.
  void sum(torch::Tensor& t, const std::function<void(torch::Tensor&)>& then = {}) const {
    group->sum(index, t, then);
  }
};

}  // namespace minimind
