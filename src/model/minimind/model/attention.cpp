#include "minimind/model/attention.h"

#include <cmath>
#include <limits>

#include "minimind/model/linear.h"

namespace minimind {

AttentionImpl::AttentionImpl(const ModelConfig& cfg)
    : heads_(cfg.num_attention_heads),
      kv_heads_(cfg.num_key_value_heads),
      head_dim_(cfg.head_dim()),
      dropout_(cfg.dropout) {
  const int64_t H = cfg.hidden_size;
  q_proj = register_module("q_proj", linear_no_bias(H, heads_ * head_dim_));
  k_proj = register_module("k_proj", linear_no_bias(H, kv_heads_ * head_dim_));
  v_proj = register_module("v_proj", linear_no_bias(H, kv_heads_ * head_dim_));
  o_proj = register_module("o_proj", linear_no_bias(heads_ * head_dim_, H));
  q_norm = register_module("q_norm", RMSNorm(head_dim_, cfg.rms_norm_eps));
  k_norm = register_module("k_norm", RMSNorm(head_dim_, cfg.rms_norm_eps));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const RotaryTables& rope,
                                     LayerKVCache* cache) {
  const int64_t B = x.size(0), T = x.size(1);
  const int64_t past = cache ? cache->length() : 0;
  const int64_t rep = heads_ / kv_heads_;  // query heads per kv head

  torch::Tensor q = q_norm(q_proj(x).view({B, T, heads_, head_dim_}));     // [B, T, h, d]
  torch::Tensor k = k_norm(k_proj(x).view({B, T, kv_heads_, head_dim_}));  // [B, T, kv, d]
  torch::Tensor v = v_proj(x).view({B, T, kv_heads_, head_dim_});          // [B, T, kv, d]

  torch::Tensor cos = rope.cos.narrow(0, past, T), sin = rope.sin.narrow(0, past, T);
  q = apply_rotary(q, cos, sin);
  k = apply_rotary(k, cos, sin);
  if (cache) {
    if (past > 0) {
      k = torch::cat({cache->k, k}, 1);
      v = torch::cat({cache->v, v}, 1);
    }
    cache->k = k;
    cache->v = v;
  }
  const int64_t S = k.size(1);  // keys visible: past + T

  // GQA without materialising repeated k/v: query head j uses kv head j / rep, so the
  // rep query heads of one kv head are stacked along the row axis of one matmul.
  torch::Tensor qg = q.transpose(1, 2).reshape({B, kv_heads_, rep * T, head_dim_});
  torch::Tensor kt = k.permute({0, 2, 3, 1});  // [B, kv, d, S]
  torch::Tensor scores = torch::matmul(qg, kt) / std::sqrt(static_cast<double>(head_dim_));
  scores = scores.view({B, kv_heads_, rep, T, S});  // [B, kv, rep, T, S]

  // Causal mask: query i (absolute position past + i) sees keys 0..past + i.
  torch::Tensor mask =
      torch::full({T, S}, -std::numeric_limits<float>::infinity(), scores.options()).triu(past + 1);
  scores = scores + mask;
  // Softmax in float32 as MiniMind (float64 models stay in float64).
  const auto softmax_type = q.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat32;
  torch::Tensor probs = torch::softmax(scores.to(softmax_type), -1).to(q.scalar_type());
  probs = torch::dropout(probs, dropout_, is_training());

  torch::Tensor out = torch::matmul(probs.view({B, kv_heads_, rep * T, S}),
                                    v.transpose(1, 2));  // [B, kv, rep*T, d]
  out = out.view({B, heads_, T, head_dim_}).transpose(1, 2).reshape({B, T, heads_ * head_dim_});
  return torch::dropout(o_proj(out), dropout_, is_training());  // [B, T, H]
}

}  // namespace minimind
