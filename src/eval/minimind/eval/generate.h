// Text generation with a KV cache, sampling as MiniMind's generate():
// logits / temperature -> repetition penalty -> top-k -> top-p -> sample (or argmax).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "minimind/error.h"
#include "minimind/model/minimind_model.h"

namespace minimind {

struct GenerateOptions {
  int64_t max_new_tokens = 256;
  double temperature = 0.85;        // MiniMind's defaults
  int64_t top_k = 50;               // 0: off
  double top_p = 0.85;              // 1: off
  double repetition_penalty = 1.0;  // 1: off
  bool greedy = false;              // argmax instead of sampling
  bool use_cache = true;            // false: recompute the whole sequence every token
  uint64_t seed = 42;
  int64_t eos_id = 2;  // the tokenizer's (Tokenizer::specials); -1: never stop at one
};

// Continues prompt_ids ([bos] + prompt tokens); calls on_token(id) for each new token as it
// is produced; stops at eos (not emitted), after max_new_tokens, or when the sequence
// reaches max_position_embeddings. Returns the new ids. Throws Error for a prompt that
// already fills the model's positions and for sampling settings that give non-finite
// probabilities.
std::vector<int64_t> generate(MiniMindForCausalLM& model, const std::vector<int64_t>& prompt_ids,
                              const GenerateOptions& options,
                              const std::function<void(int64_t)>& on_token = {});

// The next-token distribution step on one row of logits [V] (exposed for tests): applies
// temperature, MiniMind's repetition penalty over `seen`, top-k and top-p; returns logits
// with the removed entries at -inf.
torch::Tensor filter_logits(torch::Tensor logits, const std::vector<int64_t>& seen,
                            const GenerateOptions& options);

}  // namespace minimind
