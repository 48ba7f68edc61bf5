// Evaluation of a model on a token file, one document per row (MiniMind's rule).
#pragma once

#include <cstdint>
#include <vector>

#include "minimind/data/token_file.h"
#include "minimind/model/minimind_model.h"

namespace minimind {

struct EvalResult {
  double loss = 0;         // mean cross-entropy over all predicted positions of all rows
  double loss_sum = 0;     // summed cross-entropy (loss = loss_sum / tokens)
  double ppl = 0;          // exp(loss)
  int64_t tokens = 0;      // predicted positions
  int64_t documents = 0;
  std::vector<std::vector<int64_t>> expert_counts;  // per MoE layer, over real tokens
};

// Each document becomes the row [bos] + tokens[:max_seq_len - 2] + [eos]. The loss is
// summed over rows and divided by the number of predicted positions, so the batch size
// does not change it. Runs in eval mode without gradients and restores the model's mode.
// max_docs < 0: all documents. Rank r of `world` evaluates batches r, r + world, ...;
// the caller sums loss_sum, tokens, documents and counts over ranks (reduce_eval_result).
EvalResult evaluate(MiniMindForCausalLM& model, const TokenFile& docs, int64_t max_seq_len,
                    int64_t batch_size, int64_t max_docs = -1, int64_t rank = 0, int64_t world = 1);

}  // namespace minimind
