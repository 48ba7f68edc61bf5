#include "minimind/model/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "minimind/model/linear.h"
#include "minimind/util/step_part.h"

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

AttentionImpl::AttentionImpl(const ModelConfig& cfg, const Products& products)
    : heads_(cfg.num_attention_heads),
      kv_heads_(cfg.num_key_value_heads),
      head_dim_(cfg.head_dim()),
      dropout_(cfg.dropout),
      products_(products),
      node_(attention_node(products, cfg.dropout)) {
  const int64_t H = cfg.hidden_size;
  q_proj = register_module("q_proj", linear_no_bias(H, heads_ * head_dim_));
  k_proj = register_module("k_proj", linear_no_bias(H, kv_heads_ * head_dim_));
  v_proj = register_module("v_proj", linear_no_bias(H, kv_heads_ * head_dim_));
  o_proj = register_module("o_proj", linear_no_bias(heads_ * head_dim_, H));
  q_norm = register_module("q_norm", RMSNorm(head_dim_, cfg.rms_norm_eps, products));
  k_norm = register_module("k_norm", RMSNorm(head_dim_, cfg.rms_norm_eps, products));
}

namespace {

// Softmax over the last axis in float32 as MiniMind (float64 models stay in float64).
torch::Tensor attention_probs(const torch::Tensor& scores, double dropout, bool training) {
  const auto type = scores.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat32;
  return torch::dropout(torch::softmax(scores.to(type), -1).to(scores.scalar_type()), dropout,
                        training);
}

// Packed rows: -inf where a query's key lies before its document's start. Queries [t0, t0 + n)
// of starts [B, T], keys [0, end), rows (position, head) as the scores' -> [B, 1, n*rep, end].
torch::Tensor document_mask(const torch::Tensor& starts, int64_t t0, int64_t n, int64_t end,
                            int64_t rep, const torch::TensorOptions& options) {
  const torch::Tensor before = torch::arange(end, torch::kLong).view({1, 1, end}) <
                               starts.narrow(1, t0, n).unsqueeze(2);  // [B, n, end]
  return torch::zeros(before.sizes(), options)
      .masked_fill_(before, -std::numeric_limits<double>::infinity())
      .repeat_interleave(rep, 1)
      .unsqueeze(1);  // [B, 1, n*rep, end]
}

}  // namespace

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, int64_t block, double dropout, bool training,
                               const Products& products, NodeChoice node,
                               const torch::Tensor& starts) {
  const StepScope part(StepPart::attention);
  const int64_t B = q.size(0), T = q.size(1), heads = q.size(2), d = q.size(3);
  const int64_t kv = k.size(2), rep = heads / kv;  // query heads per kv head
  const double scale = std::sqrt(static_cast<double>(d));
  // Our node: one node for scores, mask, softmax and the product with v, taking q, k and v in
  // the model's layout. ATen's form below keeps PyTorch's numbers bit for bit on OpenBLAS.
  if (runs_own_node(node, q))
    return causal_attention_node(q, k, v, block, products.precision, starts);
  // GQA without repeating k/v: the rep query heads of a kv head become rows of one matmul,
  // ordered (position, head), so a block of positions is a contiguous range of rows.
  const torch::Tensor qg = q.view({B, T, kv, rep, d})
                               .permute({0, 2, 1, 3, 4})
                               .reshape({B, kv, T * rep, d});                // [B, kv, T*rep, d]
  const torch::Tensor kt = k.permute({0, 2, 3, 1}), vt = v.transpose(1, 2);  // [B, kv, d|T, T|d]
  // The diagonal block's mask: row (t, r) hides keys after t. The same for every block
  // (a shorter last block takes its top-left corner).
  block = std::min(block, T);
  const torch::Tensor pos = torch::arange(block, torch::kLong);
  const torch::Tensor diagonal_mask = torch::zeros({block, block}, q.options())
                                          .masked_fill_(pos.unsqueeze(0) > pos.unsqueeze(1),
                                                        -std::numeric_limits<double>::infinity())
                                          .repeat_interleave(rep, 0);  // [block*rep, block]
  std::vector<torch::Tensor> outs;
  for (int64_t t0 = 0; t0 < T; t0 += block) {
    const int64_t n = std::min(block, T - t0), end = t0 + n;  // queries [t0, end)
    torch::Tensor scores = batched_product(qg.narrow(2, t0 * rep, n * rep), kt.narrow(3, 0, end),
                                           products) /
                           scale;  // [B, kv, n*rep, end]
    torch::Tensor mask = diagonal_mask.narrow(0, 0, n * rep).narrow(1, 0, n);
    if (t0 > 0) mask = torch::cat({torch::zeros({n * rep, t0}, mask.options()), mask}, 1);
    if (starts.defined()) mask = mask + document_mask(starts, t0, n, end, rep, mask.options());
    torch::Tensor probs = attention_probs(scores + mask, dropout, training);
    outs.push_back(batched_product(probs, vt.narrow(2, 0, end), products));  // [B, kv, n*rep, d]
  }
  torch::Tensor out = outs.size() == 1 ? outs[0] : torch::cat(outs, 2);  // [B, kv, T*rep, d]
  return out.view({B, kv, T, rep, d}).permute({0, 2, 1, 3, 4}).reshape({B, T, heads * d});
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const RotaryTables& rope,
                                     LayerKVCache* cache, const PackedRows* packed) {
  TORCH_CHECK(!(packed && cache), "packed rows are for training and scoring, not generation");
  const int64_t B = x.size(0), T = x.size(1);
  const int64_t past = cache ? cache->length() : 0;
  const int64_t rep = heads_ / kv_heads_;  // query heads per kv head

  torch::Tensor q = q_norm(
      project(x, q_proj->weight, products_).view({B, T, heads_, head_dim_}));  // [B, T, h, d]
  torch::Tensor k = k_norm(
      project(x, k_proj->weight, products_).view({B, T, kv_heads_, head_dim_}));  // [B, T, kv, d]
  torch::Tensor v =
      project(x, v_proj->weight, products_).view({B, T, kv_heads_, head_dim_});  // [B, T, kv, d]

  if (packed) {
    // Each position's rope row is its place in its document: the B rows as one of B*T.
    q = apply_rotary(q.reshape({1, B * T, heads_, head_dim_}), packed->cos, packed->sin)
            .view({B, T, heads_, head_dim_});
    k = apply_rotary(k.reshape({1, B * T, kv_heads_, head_dim_}), packed->cos, packed->sin)
            .view({B, T, kv_heads_, head_dim_});
  } else {
    torch::Tensor cos = rope.cos.narrow(0, past, T), sin = rope.sin.narrow(0, past, T);
    q = apply_rotary(q, cos, sin);
    k = apply_rotary(k, cos, sin);
  }
  if (cache) std::tie(k, v) = cache->append(k, v);
  torch::Tensor out;  // [B, T, h*d]
  if (past == 0) {
    out = causal_attention(q, k, v, kAttentionBlock, dropout_, is_training(), products_, node_,
                           packed ? packed->starts : torch::Tensor());
  } else {
    // Queries after cached positions (generation): query i (absolute position past + i)
    // sees keys 0..past + i; a single query (a generated token) sees every key.
    const StepScope part(StepPart::attention);
    const int64_t S = k.size(1);  // keys visible: past + T
    torch::Tensor qg = q.transpose(1, 2).reshape({B, kv_heads_, rep * T, head_dim_});
    torch::Tensor scores = batched_product(qg, k.permute({0, 2, 3, 1}), products_) /
                           std::sqrt(static_cast<double>(head_dim_));  // [B, kv, rep*T, S]
    if (T > 1)
      scores =
          scores + torch::full({T, S}, -std::numeric_limits<float>::infinity(), scores.options())
                       .triu(past + 1)
                       .repeat({rep, 1});
    torch::Tensor probs = attention_probs(scores, dropout_, is_training());
    out = batched_product(probs, v.transpose(1, 2), products_);  // [B, kv, rep*T, d]
    out = out.view({B, heads_, T, head_dim_}).transpose(1, 2).reshape({B, T, heads_ * head_dim_});
  }
  return torch::dropout(project(out, o_proj->weight, products_), dropout_,
                        is_training());  // [B, T, H]
}

}  // namespace minimind
