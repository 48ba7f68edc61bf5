// MiniMind-3 causal LM: embed_tokens -> dropout -> pre-norm blocks -> norm -> lm_head.
// Module names equal MiniMind's, so named_parameters() are its state-dict names.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <vector>

#include "minimind/config.h"
#include "minimind/model/attention.h"
#include "minimind/model/feed_forward.h"
#include "minimind/model/moe_feed_forward.h"
#include "minimind/model/rms_norm.h"
#include "minimind/model/rope.h"

namespace minimind {

struct BlockOutput {
  torch::Tensor hidden;  // [B, T, H]
  MoEOutput moe;         // the MoE layer's routing (fields undefined for a dense block)
};

// h = x + self_attn(input_layernorm(x)); out = h + mlp(post_attention_layernorm(h)).
class MiniMindBlockImpl : public torch::nn::Module {
 public:
  explicit MiniMindBlockImpl(const ModelConfig& cfg);
  // real: [B*T] bool, false at padding (only used for the MoE load counts); token_ids:
  // [B*T] (only read by the hash router).
  BlockOutput forward(const torch::Tensor& x, const RotaryTables& rope, LayerKVCache* cache,
                      const torch::Tensor& real = {}, const torch::Tensor& token_ids = {},
                      const BatchShard* shard = nullptr);

  Attention self_attn{nullptr};
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  FeedForward dense_mlp{nullptr};   // registered as "mlp" when !use_moe
  MOEFeedForward moe_mlp{nullptr};  // registered as "mlp" when use_moe
};
TORCH_MODULE(MiniMindBlock);

class MiniMindModelImpl : public torch::nn::Module {
 public:
  explicit MiniMindModelImpl(const ModelConfig& cfg);

  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
  std::vector<MiniMindBlock> blocks;  // typed view of `layers`
  RotaryTables rope;
  double dropout;
};
TORCH_MODULE(MiniMindModel);

// Generation state: one KV cache per layer.
using KVCache = std::vector<LayerKVCache>;

// The optimizer step in progress, for the global aux-loss scope (Qwen, Megatron): the
// assignment counts of the step's earlier micro-batches on every rank, and how to sum this
// micro-batch's over the ranks. One per optimizer step; without it a forward is a step of
// one micro-batch on one rank.
struct StepRouting {
  torch::Tensor counts;  // [L, E] float64 running sum over the step; undefined at its start
  double tokens = 0;     // tokens counted in `counts`
  std::function<void(torch::Tensor&)> sum_over_ranks;  // in place; empty: one rank
};

struct ForwardOutput {
  torch::Tensor logits;  // [B, T, V]
  torch::Tensor loss;    // [] mean CE of logits[:, :-1] vs labels[:, 1:]; undefined without labels
  torch::Tensor aux_loss;  // [] sum over MoE layers of their aux loss (0 in eval / dense)
  torch::Tensor z_loss;    // [] sum over MoE layers of their router z-loss (0 unless on)
  std::vector<torch::Tensor> layer_aux;  // per MoE layer: [] its aux loss (detached)
  // per MoE layer: [E] int64 assignments per expert over the non-padding tokens (id != 0)
  std::vector<torch::Tensor> expert_counts;
  std::vector<torch::Tensor> layer_z;        // per MoE layer: [] mean lse^2 (learned router)
  std::vector<torch::Tensor> layer_dropped;  // per MoE layer: [] int64 (capacity on)
  std::vector<torch::Tensor> layer_keep;     // per MoE layer: [B*T, k] kept (capacity on)
  // per MoE layer (training): max over the batch's rows of the row's MaxVio (real tokens)
  std::vector<double> layer_seq_max_vio;
  std::vector<torch::Tensor> layer_index;  // per MoE layer: [B*T, k] the chosen experts
  // per MoE layer, learned routers only: [B*T, E] router probabilities (detached) and
  // [E + 3] float64 their sums over the real tokens (RouterSums)
  std::vector<torch::Tensor> layer_probs, layer_router;
};

class MiniMindForCausalLMImpl : public torch::nn::Module {
 public:
  explicit MiniMindForCausalLMImpl(const ModelConfig& cfg);

  // input_ids: [B, T] int64. labels: [B, T] int64 with -100 = ignored (optional).
  // cache: per-layer KV cache for generation (positions continue after its length).
  // step: the optimizer step this forward belongs to (global aux scope; see StepRouting).
  // head false: stop after the blocks (no logits or loss; the routing analysis only reads
  // the routers, and the LM head is about half of a tiny model's work).
  // shard: input_ids are some rows of a micro-batch trained in shards side by side; the
  // losses are this shard's part of the micro-batch's (they add up over the shards), and
  // with the global aux scope `step` sums its counts over the shards too.
  ForwardOutput forward(const torch::Tensor& input_ids, const torch::Tensor& labels = {},
                        KVCache* cache = nullptr, StepRouting* step = nullptr, bool head = true,
                        const BatchShard* shard = nullptr);

  // Aux-loss-free balancing after an optimizer step: each MoE layer's bias moves by its
  // counts of the whole step (per layer [E], all micro-batches and ranks).
  void update_router_bias(const std::vector<std::vector<int64_t>>& step_counts);
  // Per MoE layer: its selection bias [E]; empty unless router_bias_update_rate > 0.
  std::vector<torch::Tensor> router_biases() const;
  // Per MoE layer with a learned router: the router's weight [E, H] (gate.weight).
  std::vector<torch::Tensor> router_weights() const;

  // The output projection [V, H]: embed_tokens.weight when tied (LibTorch cannot tie by
  // assignment), else lm_head.weight.
  torch::Tensor lm_head_weight() const;

  const ModelConfig& config() const { return cfg_; }

  MiniMindModel model{nullptr};
  torch::nn::Linear lm_head{nullptr};  // only when !tie_word_embeddings

 private:
  ModelConfig cfg_;
};
TORCH_MODULE(MiniMindForCausalLM);

// Fresh weights as MiniMind initialises them: Linear/Embedding ~ N(0, 0.02), norms = 1.
// Uses torch's global generator: call torch::manual_seed first for reproducible weights.
void init_weights(MiniMindForCausalLM& model);

struct ParamCount {
  int64_t total;   // every parameter once (a tied embedding counts once)
  int64_t active;  // per token: only num_experts_per_tok experts of each MoE layer
};
ParamCount count_parameters(const MiniMindForCausalLM& model);

}  // namespace minimind
