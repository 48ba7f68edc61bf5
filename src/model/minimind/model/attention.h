// Grouped-query self-attention as MiniMind-3: q/k/v/o projections without bias,
// per-head RMSNorm on q and k before RoPE, causal softmax in float32.
#pragma once

#include <torch/torch.h>

#include <utility>

#include "minimind/config.h"
#include "minimind/model/node_choice.h"
#include "minimind/model/packed_rows.h"
#include "minimind/model/rms_norm.h"
#include "minimind/model/rope.h"

namespace minimind {

// Keys and values of one layer for the positions seen so far (generation). The buffers
// grow by doubling, so a token's keys are copied in place instead of `cat`-ing the
// whole history every step.
class LayerKVCache {
 public:
  int64_t length() const { return length_; }
  // Appends k, v [B, T, kv_heads, head_dim]; returns the keys and values of every position
  // so far, views [B, length, kv_heads, head_dim] into the buffers.
  std::pair<torch::Tensor, torch::Tensor> append(const torch::Tensor& k, const torch::Tensor& v);

 private:
  torch::Tensor k_, v_;  // [B, capacity, kv_heads, head_dim], undefined while empty
  int64_t length_ = 0;
};

// The attention's forward (node_choice.h): our node in training where products leave ATen,
// except with dropout, which our node does not draw.
inline NodeChoice attention_node(const Products& products, double dropout) {
  return dropout == 0 ? training_node(products) : NodeChoice::aten;
}

// Causal attention of T queries over the same T positions (no cache before them), in
// query blocks of `block` positions: block b's queries see keys [0, end of b), so the
// scores above the diagonal blocks (future keys) are never computed; only the diagonal
// blocks need a mask. block >= T is the whole masked square, as MiniMind computes it.
// q: [B, T, heads, d], k and v: [B, T, kv_heads, d] -> [B, T, heads * d]. Products as
// `products` say; where `node` takes our node, causal_attention_node. starts [B, T] int64
// (packed rows, packed_rows.h): a query also sees no key before its document's start.
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, int64_t block, double dropout, bool training,
                               const Products& products = {}, NodeChoice node = NodeChoice::aten,
                               const torch::Tensor& starts = {});

// causal_attention's node in training whose products leave ATen, bf16 or fp32 on oneDNN
// (attention_fused.cpp): q [B, T, h, d], k and v [B, T, kv, d], float32 -> [B, T, h * d]
// float32. starts as causal_attention's: each document of a row is computed on its own, as a
// shorter sequence (its keys only).
torch::Tensor causal_attention_node(const torch::Tensor& q, const torch::Tensor& k,
                                    const torch::Tensor& v, int64_t block, Precision precision,
                                    const torch::Tensor& starts = {});

// Query block of causal_attention in training and evaluation (T = 256: 4 blocks, 10/16 of
// the square computed).
constexpr int64_t kAttentionBlock = 64;

class AttentionImpl : public torch::nn::Module {
 public:
  // products: the compute plan's (the forward it picks: attention_node).
  AttentionImpl(const ModelConfig& cfg, const Products& products = {});

  // x: [B, T, H]. Positions start at cache->length() (0 without a cache); a given
  // cache is extended with this call's keys and values. packed: rows of several documents
  // (no cache then), each attended and positioned on its own.
  torch::Tensor forward(const torch::Tensor& x, const RotaryTables& rope,
                        LayerKVCache* cache = nullptr, const PackedRows* packed = nullptr);

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  RMSNorm q_norm{nullptr}, k_norm{nullptr};

  NodeChoice node() const { return node_; }

 private:
  int64_t heads_, kv_heads_, head_dim_;
  double dropout_;
  Products products_;
  NodeChoice node_;
};
TORCH_MODULE(Attention);

}  // namespace minimind
