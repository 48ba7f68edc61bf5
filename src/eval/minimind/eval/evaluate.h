// Evaluation of a model on a token file: every token of every document predicted once.
#pragma once

#include <cstdint>
#include <vector>

#include "minimind/data/sft.h"
#include "minimind/data/token_file.h"
#include "minimind/model/minimind_model.h"
#include "minimind/run/expert_counts.h"
#include "minimind/run/parallel_context.h"

namespace minimind {

// What happens to a document longer than max_seq_len tokens.
enum class LongDocuments {
  windows,   // consecutive windows, so that every token is predicted once (the default)
  truncate,  // MiniMind's PretrainDataset rule: the first window only, [eos] appended
};

struct EvalResult {
  double loss = 0;      // mean cross-entropy over all predicted positions of all rows
  double loss_sum = 0;  // summed cross-entropy (loss = loss_sum / tokens)
  double ppl = 0;       // exp(loss)
  int64_t tokens = 0;   // predicted positions
  int64_t documents = 0;
  int64_t rows = 0;           // windows evaluated (= documents when every document fits)
  int64_t corpus_tokens = 0;  // predictable positions of the whole file (all but each bos)
  int64_t corpus_documents = 0;
  ExpertCounts expert_counts;  // per MoE layer, over real tokens
};

// One row of an evaluation: `length` tokens of document `doc` from `start` (relative to
// the document). With `eos_at_end`, the row's last token is replaced by [eos] (truncate).
struct EvalWindow {
  uint64_t doc = 0;
  int64_t start = 0, length = 0;
  bool eos_at_end = false;
};

// The rows that evaluate the first `n` documents. A document of at most max_seq_len
// tokens ([bos] text [eos]) is one row, itself. A longer one is cut into windows of
// max_seq_len tokens that overlap by one token: window w starts at w * (max_seq_len - 1),
// so its first token is the previous window's last, given as context and predicted by
// the window before; every token but the leading bos is predicted exactly once.
std::vector<EvalWindow> eval_windows(const TokenFile& docs, int64_t n, int64_t max_seq_len,
                                     LongDocuments long_documents);

// The loss is summed over rows and divided by the number of predicted positions, so the
// batch size does not change it. Runs in eval mode without gradients and restores the
// model's mode. max_docs < 0: all documents. With several ranks (`parallel.job`), rank r
// evaluates batches r, r + world, ... and the sums are taken over all ranks: every rank
// returns the result of the whole set.
EvalResult evaluate(MiniMindForCausalLM& model, const TokenFile& docs, int64_t max_seq_len,
                    int64_t batch_size, int64_t max_docs = -1,
                    LongDocuments long_documents = LongDocuments::windows,
                    const ParallelContext& parallel = {});

// Chat data (data.mode: sft; docs/fine-tuning.md): each conversation one row, its rendering
// without augmentation cut at max_seq_len; the loss over the labelled targets only (the
// answers), summed over rows and divided by their count (`tokens`). corpus_tokens: the
// labelled targets of all conversations; documents: conversations. max_docs < 0: all.
EvalResult evaluate_chat(MiniMindForCausalLM& model, const TokenFile& docs, const SftIndex& index,
                         int64_t max_seq_len, int64_t batch_size, int64_t max_docs = -1,
                         const ParallelContext& parallel = {});

}  // namespace minimind
