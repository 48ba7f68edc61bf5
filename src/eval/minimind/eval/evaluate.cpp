#include "minimind/eval/evaluate.h"

#include <algorithm>
#include <cmath>

#include "minimind/data/token_file.h"
#include "minimind/model/next_token_loss.h"

namespace minimind {

std::vector<EvalWindow> eval_windows(const TokenFile& docs, int64_t n, int64_t max_seq_len,
                                     LongDocuments long_documents) {
  std::vector<EvalWindow> rows;
  rows.reserve(static_cast<size_t>(n));
  for (int64_t d = 0; d < n; ++d) {
    const auto doc = static_cast<uint64_t>(d);
    const auto len = static_cast<int64_t>(docs.doc_length(doc));
    if (len <= max_seq_len) {
      rows.push_back({doc, 0, len, false});
    } else if (long_documents == LongDocuments::truncate) {
      rows.push_back({doc, 0, max_seq_len, true});
    } else {
      // The last window holds at least two tokens: its start is before the last token.
      for (int64_t at = 0; at < len - 1; at += max_seq_len - 1)
        rows.push_back({doc, at, std::min(max_seq_len, len - at), false});
    }
  }
  return rows;
}

EvalResult evaluate(MiniMindForCausalLM& model, const TokenFile& docs, int64_t max_seq_len,
                    int64_t batch_size, int64_t max_docs, LongDocuments long_documents,
                    const ParallelContext& parallel) {
  Distributed* dist = parallel.job;
  const bool was_training = model->is_training();
  model->eval();
  // Inference mode: no autograd bookkeeping (version counters, view tracking) on any op.
  c10::InferenceMode inference;
  const int64_t rank = dist ? dist->rank() : 0, world = dist ? dist->world_size() : 1;
  const ModelConfig& m = model->config();
  EvalResult r;
  // Sized from the config, so that a rank that gets no batch still sums with the others.
  r.expert_counts =
      ExpertCounts::zeros(m.use_moe ? m.num_hidden_layers : 0, static_cast<size_t>(m.num_experts),
                          m.use_moe && m.learned_router());
  const auto all_docs = static_cast<int64_t>(docs.num_docs());
  const int64_t n = max_docs < 0 ? all_docs : std::min<int64_t>(max_docs, all_docs);
  r.documents = n;
  r.corpus_documents = all_docs;
  r.corpus_tokens = static_cast<int64_t>(docs.num_tokens()) - all_docs;
  const std::vector<EvalWindow> rows = eval_windows(docs, n, max_seq_len, long_documents);
  r.rows = static_cast<int64_t>(rows.size());
  const auto total = static_cast<int64_t>(rows.size());
  double loss_sum = 0;
  int64_t tokens = 0;
  // Experts spread over the ranks (expert parallelism): every forward exchanges rows with
  // the others, so every rank runs as many forwards, one with a pad row when it has no
  // batch left (its output unread).
  const bool in_step = !model->expert_shard().whole();
  const int64_t rounds = (total + world * batch_size - 1) / (world * batch_size);
  for (int64_t round = 0, first = rank * batch_size; in_step ? round < rounds : first < total;
       ++round, first += world * batch_size) {
    if (first >= total) {
      model(torch::full({1, 2}, docs.pad_id(), torch::kLong));
      continue;
    }
    const int64_t B = std::min(batch_size, total - first);
    // Rows are only as long as the longest of the batch needs.
    int64_t L = 2;
    for (int64_t b = first; b < first + B; ++b)
      L = std::max(L, rows[static_cast<size_t>(b)].length);
    torch::Tensor ids = torch::full({B, L}, docs.pad_id(), torch::kLong);  // [B, L]
    torch::Tensor labels = torch::full({B, L}, -100, torch::kLong);        // [B, L]
    for (int64_t b = 0; b < B; ++b) {
      const EvalWindow& w = rows[static_cast<size_t>(first + b)];
      int64_t* row = ids.data_ptr<int64_t>() + b * L;
      docs.copy(docs.doc_start(w.doc) + static_cast<uint64_t>(w.start),
                static_cast<uint64_t>(w.length), row);
      if (w.eos_at_end) row[w.length - 1] = docs.eos_of(static_cast<uint64_t>(w.doc));
      std::copy(row, row + w.length, labels.data_ptr<int64_t>() + b * L);
    }
    ForwardOutput out = model(ids);
    torch::Tensor ce = next_token_loss(out.logits, labels, /*mean=*/false);
    loss_sum += ce.item<double>();
    tokens += (labels.narrow(1, 1, L - 1) != -100).sum().item<int64_t>();  // [B, L-1]
    r.expert_counts.add(out.per_layer(&MoEStats::counts));
    r.expert_counts.add_router(out.per_layer(&MoEStats::router_sums));
  }
  if (dist && world > 1) {
    std::vector<double> sums{loss_sum};
    dist->all_reduce_sum(sums);
    loss_sum = sums[0];
    std::vector<int64_t> totals{tokens};
    sum_over_ranks(r.expert_counts, totals, *dist);
    tokens = totals[0];
  }
  r.tokens = tokens;
  r.loss_sum = loss_sum;
  r.loss = r.tokens > 0 ? loss_sum / r.tokens : NAN;
  r.ppl = std::exp(r.loss);
  model->train(was_training);
  return r;
}

}  // namespace minimind
