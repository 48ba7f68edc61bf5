// Training FLOPs per token by component: what the run log counts (metrics.jsonl's `flops`,
// the `flops` event) and the benchmarks' model GFLOP/s divide by. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "minimind/config.h"

namespace minimind {

// Model FLOPs of training one token (forward and backward: 6 per weight a token passes
// through, 12 per attention score element and weighted sum), by component. A matrix
// product of [1, K] by [K, N] is 2 K N FLOPs forward and twice that backward (by input and
// by weight). Attention counts the full T x T matrix as computed, T = data.max_seq_len
// (every batch row has that length). With a capacity this is the nominal count: dropped
// assignments are work the model skips. Norms, activations, softmax and the optimizer are
// not counted (they are O(H) per token, not O(H^2)).
struct FlopsPerToken {
  double attention_projections = 0;  // q, k, v, o
  double attention_scores = 0;       // Q K^T and the weighted sum of V
  double feed_forward = 0;           // the dense SwiGLU, or the k routed experts a token uses
  double shared_experts = 0;         // always-on experts
  double router = 0;                 // the learned router's projection
  double lm_head = 0;                // the output projection to the vocabulary

  double total() const {
    return attention_projections + attention_scores + feed_forward + shared_experts + router +
           lm_head;
  }
  // (name, value) of each component, in the order above.
  std::vector<std::pair<std::string, double>> components() const;
};

FlopsPerToken flops_per_token(const ModelConfig& m, int64_t seq);

}  // namespace minimind
