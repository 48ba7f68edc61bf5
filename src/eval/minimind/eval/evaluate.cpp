#include "minimind/eval/evaluate.h"

#include <cmath>

#include "minimind/data/batcher.h"
#include "minimind/model/next_token_loss.h"

namespace minimind {

EvalResult evaluate(MiniMindForCausalLM& model, const TokenFile& docs, int64_t max_seq_len,
                    int64_t batch_size, int64_t max_docs, Distributed* dist) {
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
  const int64_t n = max_docs < 0
                        ? static_cast<int64_t>(docs.num_docs())
                        : std::min<int64_t>(max_docs, static_cast<int64_t>(docs.num_docs()));
  double loss_sum = 0;
  for (int64_t first = rank * batch_size; first < n; first += world * batch_size) {
    const int64_t B = std::min(batch_size, n - first);
    // Rows are only as long as the longest document of the batch needs.
    int64_t L = 2;
    for (int64_t d = first; d < first + B; ++d)
      L = std::max<int64_t>(L, std::min<int64_t>(docs.doc_length(d), max_seq_len));
    torch::Tensor ids = torch::empty({B, L}, torch::kLong);     // [B, L]
    torch::Tensor labels = torch::empty({B, L}, torch::kLong);  // [B, L]
    for (int64_t b = 0; b < B; ++b)
      fill_pad_row(docs, static_cast<uint64_t>(first + b), L, ids.data_ptr<int64_t>() + b * L,
                   labels.data_ptr<int64_t>() + b * L);
    ForwardOutput out = model(ids);
    torch::Tensor targets = labels.narrow(1, 1, L - 1);  // [B, L-1]
    torch::Tensor ce = next_token_loss(out.logits, labels, /*mean=*/false);
    loss_sum += ce.item<double>();
    r.tokens += (targets != -100).sum().item<int64_t>();
    r.documents += B;
    r.expert_counts.add(out.expert_counts);
    r.expert_counts.add_router(out.layer_router);
  }
  if (dist && world > 1) {
    std::vector<double> sums{loss_sum};
    dist->all_reduce_sum(sums);
    loss_sum = sums[0];
    std::vector<int64_t> totals{r.tokens, r.documents};
    sum_over_ranks(r.expert_counts, totals, *dist);
    r.tokens = totals[0], r.documents = totals[1];
  }
  r.loss_sum = loss_sum;
  r.loss = r.tokens > 0 ? loss_sum / r.tokens : NAN;
  r.ppl = std::exp(r.loss);
  model->train(was_training);
  return r;
}

}  // namespace minimind
