// MiniMind-3 causal LM: embed_tokens -> dropout -> pre-norm blocks -> norm -> lm_head.
// Module names equal MiniMind's, so named_parameters() are its state-dict names.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "minimind/config.h"
#include "minimind/model/attention.h"
#include "minimind/model/feed_forward.h"
#include "minimind/model/moe_feed_forward.h"
#include "minimind/model/rms_norm.h"
#include "minimind/model/rope.h"

namespace minimind {

// The residual stream between blocks, x + delta, left as two tensors: the next norm adds
// them in its own pass (add_rms_norm). delta_from_products: delta is the output of products
// that round its gradient to bf16 (a dense feed-forward), not of routed experts.
struct Residual {
  torch::Tensor x, delta;  // [B, T, H] each; delta undefined before the first block
  bool delta_from_products = false;
};

struct BlockOutput {
  Residual out;
  MoEOutput moe;  // the MoE layer's routing (fields undefined for a dense block)
};

// x = in.x + in.delta; h = x + self_attn(input_layernorm(x));
// out = h + mlp(post_attention_layernorm(h)), returned as {h, mlp(...)}.
class MiniMindBlockImpl : public torch::nn::Module {
 public:
  MiniMindBlockImpl(const ModelConfig& cfg, int64_t layer, const Products& products = {});
  // real: [B*T] bool, false at padding (only used for the MoE load counts); token_ids:
  // [B*T] (only read by the hash router).
  // packed: rows of several documents (packed_rows.h).
  BlockOutput forward(const Residual& in, const RotaryTables& rope, LayerKVCache* cache,
                      const torch::Tensor& real = {}, const torch::Tensor& token_ids = {},
                      const BatchShard* shard = nullptr, const PackedRows* packed = nullptr);

  Attention self_attn{nullptr};
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  FeedForward dense_mlp{nullptr};   // registered as "mlp" when !use_moe
  MOEFeedForward moe_mlp{nullptr};  // registered as "mlp" when use_moe
};
TORCH_MODULE(MiniMindBlock);

class MiniMindModelImpl : public torch::nn::Module {
 public:
  explicit MiniMindModelImpl(const ModelConfig& cfg, const Products& products = {});

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

// How a forward runs beyond its inputs; the defaults are a plain forward with the LM head.
struct ForwardOptions {
  KVCache* cache = nullptr;  // generation: per-layer KV cache (positions continue after it)
  // false: stop after the blocks (no logits or loss; the routing analysis only reads the
  // routers, and the LM head is about half of a tiny model's work)
  bool head = true;
  // false: the caller reads only the losses (training): logits stay undefined, their buffer
  // freed as soon as the loss is formed, and training outside ATen forms them inside the
  // loss (head_next_token_loss).
  bool logits = true;
  // The inputs are some rows of a micro-batch trained in shards side by side (batch_shard.h):
  // the losses are this shard's part of the micro-batch's (they add up over the shards).
  const BatchShard* shard = nullptr;
  // [B, T] int64: rows holding several documents (packed chat rows): for each position, where
  // its document starts in the row. Each document is attended and positioned on its own
  // (packed_rows.h). Undefined: one sequence a row.
  torch::Tensor starts;
};

struct ForwardOutput {
  torch::Tensor logits;  // [B, T, V]; undefined under ForwardOptions::logits = false
  torch::Tensor loss;    // [] mean CE of logits[:, :-1] vs labels[:, 1:]; undefined without labels
  torch::Tensor aux_loss;  // [] sum over MoE layers of their aux loss (0 in eval / dense)
  torch::Tensor z_loss;    // [] sum over MoE layers of their router z-loss (0 unless on)
  // The routers' statistics, per MoE layer (empty for a dense model): counts over the
  // non-padding tokens (id != 0), choices, scores, and the scalars of layer_stats.h.
  std::vector<MoEStats> moe;

  // One tensor of each MoE layer, those defined: per_layer(&MoEStats::counts).
  std::vector<torch::Tensor> per_layer(torch::Tensor MoEStats::*field) const {
    std::vector<torch::Tensor> out;
    for (const MoEStats& m : moe)
      if ((m.*field).defined()) out.push_back(m.*field);
    return out;
  }
};

class MiniMindForCausalLMImpl : public torch::nn::Module {
 public:
  // The whole model; apply_expert_parallel then keeps a shard of the routed experts.
  // products: the compute plan's (ComputePlan::products()). Each module picks its forward from
  // them here (node_choice.h): fp32 on OpenBLAS, the default, is ATen's forms throughout,
  // PyTorch's numbers; bf16 or fp32 on oneDNN take our own nodes in training.
  explicit MiniMindForCausalLMImpl(const ModelConfig& cfg, const Products& products = {});

  // input_ids: [B, T] int64. labels: [B, T] int64 with -100 = ignored (optional). With the
  // global aux scope, a training forward's aux loss is completed by GlobalAuxScope.
  ForwardOutput forward(const torch::Tensor& input_ids, const torch::Tensor& labels = {},
                        const ForwardOptions& options = {});

  // The selection biases after an optimizer step, from the whole step's figures (all
  // micro-batches and ranks): per MoE layer its counts [E] (the sign rule) and quantile
  // balancing's statistic (StepStats::qb; may be shorter or empty without it).
  void update_router_bias(const std::vector<std::vector<int64_t>>& step_counts,
                          const std::vector<torch::Tensor>& qb = {});
  // Per MoE layer: its selection bias [E] (undefined for a layer without one, such as a
  // hash-routed layer); empty when no layer has one.
  std::vector<torch::Tensor> router_biases() const;
  // Per MoE layer with a learned router: the router's weight [E, H] (gate.weight).
  std::vector<torch::Tensor> router_weights() const;
  // Per MoE layer: the Gram matrix [E, E] (float64) of its routed experts, each expert's
  // gate_proj, up_proj and down_proj flattened into one vector. Under expert parallelism
  // each rank fills the rows of the experts it holds (zeros elsewhere) and `sum_over_group`
  // (summing over the expert group) completes them; unset for a whole model.
  std::vector<torch::Tensor> expert_grams(
      const std::function<void(torch::Tensor&)>& sum_over_group = {}) const;

  // The output projection [V, H]: embed_tokens.weight when tied (LibTorch cannot tie by
  // assignment), else lm_head.weight.
  torch::Tensor lm_head_weight() const;

  const ModelConfig& config() const { return cfg_; }
  // What the model was built with, for models built beside it (a twin, a probe).
  const Products& products() const { return products_; }
  // The head and loss's forward (training_node: head_next_token_loss where it takes ours).
  NodeChoice head_node() const { return head_node_; }
  // The routed experts this process holds (every MoE layer holds the same shard).
  ExpertShard expert_shard() const;

  MiniMindModel model{nullptr};
  torch::nn::Linear lm_head{nullptr};  // only when !tie_word_embeddings

 private:
  ModelConfig cfg_;
  Products products_;
  NodeChoice head_node_;
};
TORCH_MODULE(MiniMindForCausalLM);

// Expert parallelism, applied from outside the model as one step after it is built (and its
// weights set): every MoE layer keeps shard exchange.index() of exchange.size() of its
// routed experts and exchanges token rows over `exchange` (keep_expert_shard). A model is
// whole or a shard with its exchange, never a shard without one. Throws c10::Error for a
// dense model, a shard count that does not divide the experts, or a model already sharded.
void apply_expert_parallel(MiniMindForCausalLM& model, ExpertExchange& exchange);

// The whole model's parameters in named_parameters() order, whichever experts this process
// holds: a slot per parameter with its name and shape, and the tensor when held here
// (undefined for the routed experts of other ranks). The one order checkpoints use.
struct ParamSlot {
  std::string name;
  std::vector<int64_t> shape;
  torch::Tensor local;
  int64_t expert = -1;  // a routed expert's (held here or not): its id; -1 otherwise
};
std::vector<ParamSlot> full_parameters(const MiniMindForCausalLM& model);

// Fresh weights as MiniMind initialises them: Linear/Embedding ~ N(0, 0.02), norms = 1.
// Uses torch's global generator: call torch::manual_seed first for reproducible weights.
// A process holding some of the experts draws the others' values too (and drops them), so
// its weights are those of the whole model.
void init_weights(MiniMindForCausalLM& model);

struct ParamCount {
  int64_t total;   // every parameter of the whole model once (a tied embedding counts once)
  int64_t active;  // per token: only num_experts_per_tok experts of each MoE layer
};
ParamCount count_parameters(const MiniMindForCausalLM& model);

}  // namespace minimind
