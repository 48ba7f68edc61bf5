#include "minimind/flops.h"

namespace minimind {

std::vector<std::pair<std::string, double>> FlopsPerToken::components() const {
  return {{"attention_projections", attention_projections},
          {"attention_scores", attention_scores},
          {"feed_forward", feed_forward},
          {"shared_experts", shared_experts},
          {"router", router},
          {"lm_head", lm_head}};
}

FlopsPerToken flops_per_token(const ModelConfig& m, int64_t seq) {
  const auto H = static_cast<double>(m.hidden_size), d = static_cast<double>(m.head_dim());
  const auto layers = static_cast<double>(m.num_hidden_layers);
  const auto heads = static_cast<double>(m.num_attention_heads);
  const auto kv_heads = static_cast<double>(m.num_key_value_heads);
  // 6 FLOPs per weight: 2 forward, 2 for the input's gradient, 2 for the weight's.
  auto weights = [&](double n) { return 6 * layers * n; };
  FlopsPerToken f;
  f.attention_projections = weights(2 * H * heads * d + 2 * H * kv_heads * d);
  // Per head, Q K^T and P V each cost 2 T d forward per token, three times that in training.
  f.attention_scores = 12.0 * layers * static_cast<double>(seq) * heads * d;
  if (m.use_moe) {
    f.feed_forward = weights(static_cast<double>(m.num_experts_per_tok) * 3 * H *
                             static_cast<double>(m.expert_ffn_size()));
    f.shared_experts = weights(static_cast<double>(m.n_shared_experts) * 3 * H *
                               static_cast<double>(m.shared_ffn_size()));
    if (m.learned_router()) f.router = weights(H * static_cast<double>(m.num_experts));
  } else {
    f.feed_forward = weights(3 * H * static_cast<double>(m.ffn_size()));
  }
  f.lm_head = 6 * H * static_cast<double>(m.vocab_size);
  return f;
}

}  // namespace minimind
