#include "minimind/eval/evaluate.h"

#include <cmath>

#include "minimind/data/batcher.h"

namespace minimind {

EvalResult evaluate(MiniMindForCausalLM& model, const TokenFile& docs, int64_t max_seq_len,
                    int64_t batch_size, int64_t max_docs, int64_t rank, int64_t world) {
  const bool was_training = model->is_training();
  model->eval();
  torch::NoGradGuard no_grad;
  EvalResult r;
  const int64_t n = max_docs < 0 ? static_cast<int64_t>(docs.num_docs())
                                 : std::min<int64_t>(max_docs, static_cast<int64_t>(docs.num_docs()));
  double loss_sum = 0;
  for (int64_t first = rank * batch_size; first < n; first += world * batch_size) {
    const int64_t B = std::min(batch_size, n - first);
    // Rows are only as long as the longest document of the batch needs.
    int64_t L = 2;
    for (int64_t d = first; d < first + B; ++d)
      L = std::max<int64_t>(L, std::min<int64_t>(docs.doc_length(d), max_seq_len));
    torch::Tensor ids = torch::empty({B, L}, torch::kLong), labels = torch::empty({B, L}, torch::kLong);
    for (int64_t b = 0; b < B; ++b)
      fill_pad_row(docs, static_cast<uint64_t>(first + b), L, ids.data_ptr<int64_t>() + b * L,
                   labels.data_ptr<int64_t>() + b * L);
    ForwardOutput out = model(ids);
    const int64_t V = out.logits.size(-1);
    torch::Tensor targets = labels.narrow(1, 1, L - 1).reshape({-1});             // [B*(L-1)]
    torch::Tensor ce = torch::nn::functional::cross_entropy(
        out.logits.narrow(1, 0, L - 1).reshape({-1, V}), targets,
        torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kSum));
    loss_sum += ce.item<double>();
    r.tokens += (targets != -100).sum().item<int64_t>();
    r.documents += B;
    if (r.expert_counts.empty()) r.expert_counts.resize(out.expert_counts.size());
    for (size_t l = 0; l < out.expert_counts.size(); ++l) {
      const torch::Tensor& c = out.expert_counts[l];
      auto& acc = r.expert_counts[l];
      acc.resize(c.numel(), 0);
      for (int64_t e = 0; e < c.numel(); ++e) acc[e] += c[e].item<int64_t>();
    }
  }
  r.loss_sum = loss_sum;
  r.loss = r.tokens > 0 ? loss_sum / r.tokens : NAN;
  r.ppl = std::exp(r.loss);
  model->train(was_training);
  return r;
}

}  // namespace minimind
