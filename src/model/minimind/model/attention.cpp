#include "minimind/model/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "minimind/model/linear.h"

namespace minimind {

std::pair<torch::Tensor, torch::Tensor> LayerKVCache::append(const torch::Tensor& k,
                                                             const torch::Tensor& v) {
  const int64_t T = k.size(1), needed = length_ + T;
  if (!k_.defined() || needed > k_.size(1)) {
    const int64_t capacity = std::max<int64_t>(needed, k_.defined() ? 2 * k_.size(1) : 64);
    std::vector<int64_t> shape = k.sizes().vec();
    shape[1] = capacity;
    torch::Tensor nk = torch::empty(shape, k.options()), nv = torch::empty(shape, v.options());
    if (length_ > 0) {
      nk.narrow(1, 0, length_).copy_(k_.narrow(1, 0, length_));
      nv.narrow(1, 0, length_).copy_(v_.narrow(1, 0, length_));
    }
    k_ = nk, v_ = nv;
  }
  k_.narrow(1, length_, T).copy_(k);
  v_.narrow(1, length_, T).copy_(v);
  length_ = needed;
  return {k_.narrow(1, 0, length_), v_.narrow(1, 0, length_)};
}

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

  torch::Tensor q =
      q_norm(project(x, q_proj->weight).view({B, T, heads_, head_dim_}));  // [B, T, h, d]
  torch::Tensor k =
      k_norm(project(x, k_proj->weight).view({B, T, kv_heads_, head_dim_}));        // [B, T, kv, d]
  torch::Tensor v = project(x, v_proj->weight).view({B, T, kv_heads_, head_dim_});  // [B, T, kv, d]

  torch::Tensor cos = rope.cos.narrow(0, past, T), sin = rope.sin.narrow(0, past, T);
  q = apply_rotary(q, cos, sin);
  k = apply_rotary(k, cos, sin);
  if (cache) std::tie(k, v) = cache->append(k, v);
  const int64_t S = k.size(1);  // keys visible: past + T

  // GQA without materialising repeated k/v: query head j uses kv head j / rep, so the
  // rep query heads of one kv head are stacked along the row axis of one matmul.
  torch::Tensor qg = q.transpose(1, 2).reshape({B, kv_heads_, rep * T, head_dim_});
  torch::Tensor kt = k.permute({0, 2, 3, 1});  // [B, kv, d, S]
  torch::Tensor scores = torch::matmul(qg, kt) / std::sqrt(static_cast<double>(head_dim_));
  scores = scores.view({B, kv_heads_, rep, T, S});  // [B, kv, rep, T, S]

  // Causal mask: query i (absolute position past + i) sees keys 0..past + i; a single
  // query (a generated token) sees every key, so it needs none.
  if (T > 1) {
    torch::Tensor mask =
        torch::full({T, S}, -std::numeric_limits<float>::infinity(), scores.options())
            .triu(past + 1);
    scores = scores + mask;
  }
  // Softmax in float32 as MiniMind (float64 models stay in float64).
  const auto softmax_type = q.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat32;
  torch::Tensor probs = torch::softmax(scores.to(softmax_type), -1).to(q.scalar_type());
  probs = torch::dropout(probs, dropout_, is_training());

  torch::Tensor out = torch::matmul(probs.view({B, kv_heads_, rep * T, S}),
                                    v.transpose(1, 2));  // [B, kv, rep*T, d]
  out = out.view({B, heads_, T, head_dim_}).transpose(1, 2).reshape({B, T, heads_ * head_dim_});
  return torch::dropout(project(out, o_proj->weight), dropout_, is_training());  // [B, T, H]
}

}  // namespace minimind
