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

namespace {

// The evaluation loop: rows [0, total) in batches of batch_size over the ranks, each row
// filled by fill(row, L, ids, labels) (L: the batch's row length, room for `length(row)`
// ids; ids prefilled with `pad`, labels with -100); the loss summed over labelled targets.
template <class Length, class Fill>
void evaluate_rows(MiniMindForCausalLM& model, int64_t total, int64_t batch_size, int64_t pad,
                   const ParallelContext& parallel, Length length, Fill fill, EvalResult& r) {
  const bool was_training = model->is_training();
  model->eval();
  // Inference mode: no autograd bookkeeping (version counters, view tracking) on any op.
  c10::InferenceMode inference;
  Distributed* dist = parallel.job;
  const int64_t rank = dist ? dist->rank() : 0, world = dist ? dist->world_size() : 1;
  r.rows = total;
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
      model(torch::full({1, 2}, pad, torch::kLong));
      continue;
    }
    const int64_t B = std::min(batch_size, total - first);
    // Rows are only as long as the longest of the batch needs.
    int64_t L = 2;
    for (int64_t b = first; b < first + B; ++b) L = std::max(L, length(b));
    torch::Tensor ids = torch::full({B, L}, pad, torch::kLong);      // [B, L]
    torch::Tensor labels = torch::full({B, L}, -100, torch::kLong);  // [B, L]
    for (int64_t b = 0; b < B; ++b)
      fill(first + b, L, ids.data_ptr<int64_t>() + b * L, labels.data_ptr<int64_t>() + b * L);
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
}

// A result sized from the config, so that a rank that gets no batch still sums with the
// others.
EvalResult empty_result(const MiniMindForCausalLM& model) {
  const ModelConfig& m = model->config();
  EvalResult r;
  r.expert_counts =
      ExpertCounts::zeros(m.use_moe ? m.num_hidden_layers : 0, static_cast<size_t>(m.num_experts),
                          m.use_moe && m.learned_router());
  return r;
}

}  // namespace

EvalResult evaluate(MiniMindForCausalLM& model, const TokenFile& docs, int64_t max_seq_len,
                    int64_t batch_size, int64_t max_docs, LongDocuments long_documents,
                    const ParallelContext& parallel) {
  EvalResult r = empty_result(model);
  const auto all_docs = static_cast<int64_t>(docs.num_docs());
  const int64_t n = max_docs < 0 ? all_docs : std::min<int64_t>(max_docs, all_docs);
  r.documents = n;
  r.corpus_documents = all_docs;
  r.corpus_tokens = static_cast<int64_t>(docs.num_tokens()) - all_docs;
  const std::vector<EvalWindow> rows = eval_windows(docs, n, max_seq_len, long_documents);
  evaluate_rows(
      model, static_cast<int64_t>(rows.size()), batch_size, docs.pad_id(), parallel,
      [&](int64_t b) { return rows[static_cast<size_t>(b)].length; },
      [&](int64_t b, int64_t, int64_t* row, int64_t* labels) {
        const EvalWindow& w = rows[static_cast<size_t>(b)];
        docs.copy(docs.doc_start(w.doc) + static_cast<uint64_t>(w.start),
                  static_cast<uint64_t>(w.length), row);
        if (w.eos_at_end) row[w.length - 1] = docs.eos_of(static_cast<uint64_t>(w.doc));
        std::copy(row, row + w.length, labels);
      },
      r);
  return r;
}

EvalResult evaluate_chat(MiniMindForCausalLM& model, const TokenFile& docs, const SftIndex& index,
                         int64_t max_seq_len, int64_t batch_size, int64_t max_docs,
                         const ParallelContext& parallel) {
  EvalResult r = empty_result(model);
  const auto all = static_cast<int64_t>(docs.num_docs() / 2);
  const int64_t n = max_docs < 0 ? all : std::min<int64_t>(max_docs, all);
  r.documents = n;
  r.corpus_documents = all;
  std::vector<int64_t> ids(static_cast<size_t>(max_seq_len)), labels(ids.size());
  for (int64_t c = 0; c < all; ++c) {
    fill_sft_eval_row(docs, index, static_cast<uint64_t>(c), max_seq_len, ids.data(),
                      labels.data());
    for (size_t t = 1; t < labels.size(); ++t) r.corpus_tokens += labels[t] != -100;
  }
  evaluate_rows(
      model, n, batch_size, docs.pad_id(), parallel,
      [&](int64_t c) {
        return std::min<int64_t>(
            max_seq_len, static_cast<int64_t>(docs.doc_length(static_cast<uint64_t>(2 * c))));
      },
      [&](int64_t c, int64_t L, int64_t* row, int64_t* row_labels) {
        fill_sft_eval_row(docs, index, static_cast<uint64_t>(c), L, row, row_labels);
      },
      r);
  return r;
}

}  // namespace minimind
