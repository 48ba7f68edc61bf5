#include "minimind/eval/generate.h"

#include <fmt/format.h>

#include <limits>
#include <optional>

#include "minimind/util/blas_check.h"

namespace minimind {

torch::Tensor filter_logits(torch::Tensor logits, const std::vector<int64_t>& seen,
                            const GenerateOptions& o) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  logits = logits / o.temperature;  // [V]
  if (o.repetition_penalty != 1.0 && !seen.empty()) {
    // MiniMind divides the logits of every token already in the sequence by the penalty
    // (also negative ones, which that makes more likely: kept as MiniMind does it).
    torch::Tensor idx = std::get<0>(torch::_unique(torch::tensor(seen, torch::kLong)));
    logits.index_put_({idx}, logits.index({idx}) / o.repetition_penalty);
  }
  if (o.top_k > 0 && o.top_k < logits.size(0)) {
    torch::Tensor kth = std::get<0>(torch::topk(logits, o.top_k)).index({-1});
    logits = logits.masked_fill(logits < kth, neg_inf);
  }
  if (o.top_p < 1.0) {
    auto [sorted, order] = torch::sort(logits, /*dim=*/-1, /*descending=*/true);
    torch::Tensor cum = torch::cumsum(torch::softmax(sorted, -1), -1);
    torch::Tensor remove = cum > o.top_p;
    // Keep the token that crosses top_p: shift the mask right by one, never drop the best.
    remove =
        torch::cat({torch::zeros({1}, remove.options()), remove.narrow(0, 0, remove.size(0) - 1)});
    logits = logits.masked_fill(torch::zeros_like(remove).scatter(0, order, remove), neg_inf);
  }
  return logits;
}

std::vector<int64_t> generate(MiniMindForCausalLM& model, const std::vector<int64_t>& prompt_ids,
                              const GenerateOptions& o,
                              const std::function<void(int64_t)>& on_token) {
  const bool was_training = model->is_training();
  model->eval();
  // Inference mode: no autograd bookkeeping (version counters, views) on any tensor.
  c10::InferenceMode inference;
  torch::Generator gen = at::detail::createCPUGenerator(o.seed);
  const int64_t max_positions = model->model->rope.cos.size(0);
  if (static_cast<int64_t>(prompt_ids.size()) >= max_positions)
    throw Error("the prompt has " + std::to_string(prompt_ids.size()) +
                    " tokens (with <bos>), but the model reads at most "
                    "model.max_position_embeddings = " +
                    std::to_string(max_positions),
                "shorten the prompt");

  // With the cache a token is one row: its matrix-vector products are too small for
  // OpenBLAS's threads to pay their hand-over (300 greedy tokens of the default run:
  // 754-896 tokens/s on one thread against 644-719 on two, 2026-12-01).
  std::optional<OneBlasThread> one_thread;
  if (o.use_cache) one_thread.emplace();

  std::vector<int64_t> seq = prompt_ids, out;
  KVCache cache;
  for (int64_t i = 0; i < o.max_new_tokens && static_cast<int64_t>(seq.size()) < max_positions;
       ++i) {
    // With the cache only the tokens it has not seen are fed; positions continue after it.
    const int64_t past = o.use_cache && !cache.empty() ? cache[0].length() : 0;
    std::vector<int64_t> feed(seq.begin() + past, seq.end());
    torch::Tensor ids = torch::tensor(feed, torch::kLong).unsqueeze(0);  // [1, T]
    ForwardOptions fo;
    fo.cache = o.use_cache ? &cache : nullptr;
    ForwardOutput f = model->forward(ids, torch::Tensor(), fo);
    torch::Tensor logits = f.logits[0][-1].to(torch::kFloat32);  // [V]
    int64_t next;
    if (o.greedy) {
      next = logits.argmax().item<int64_t>();
    } else {
      torch::Tensor probs = torch::softmax(filter_logits(logits, seq, o), -1);
      // An extreme temperature or penalty overflows the logits (the tools refuse values
      // outside [0.01, 100]; a library caller may not): an error, not a torch backtrace.
      if (!torch::isfinite(probs).all().item<bool>())
        throw Error(fmt::format("sampling gave non-finite probabilities (temperature {:g}, "
                                "repetition penalty {:g})",
                                o.temperature, o.repetition_penalty),
                    "use a temperature between 0.1 and 2 and a penalty near 1, or --greedy");
      next = torch::multinomial(probs, 1, false, gen).item<int64_t>();
    }
    if (next == o.eos_id) break;
    seq.push_back(next);
    out.push_back(next);
    if (on_token) on_token(next);
  }
  model->train(was_training);
  return out;
}

}  // namespace minimind
