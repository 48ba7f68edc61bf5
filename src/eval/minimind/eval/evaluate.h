// Evaluation of a model on a token file, one document per row (MiniMind's rule).
#pragma once

#include <cstdint>

#include "minimind/data/token_file.h"
#include "minimind/dist/distributed.h"
#include "minimind/model/minimind_model.h"
#include "minimind/run/expert_counts.h"

namespace minimind {

struct EvalResult {
  double loss = 0;      // mean cross-entropy over all predicted positions of all rows
  double loss_sum = 0;  // summed cross-entropy (loss = loss_sum / tokens)
  double ppl = 0;       // exp(loss)
  int64_t tokens = 0;   // predicted positions
  int64_t documents = 0;
  ExpertCounts expert_counts;  // per MoE layer, over real tokens
};

// Each document becomes the row [bos] + tokens[:max_seq_len - 2] + [eos]. The loss is
// summed over rows and divided by the number of predicted positions, so the batch size
// does not change it. Runs in eval mode without gradients and restores the model's mode.
// max_docs < 0: all documents. With `dist` (several ranks), rank r evaluates batches
// r, r + world, ... and the sums are taken over all ranks: every rank returns the result
// of the whole set.
EvalResult evaluate(MiniMindForCausalLM& model, const TokenFile& docs, int64_t max_seq_len,
                    int64_t batch_size, int64_t max_docs = -1, Distributed* dist = nullptr);

}  // namespace minimind
