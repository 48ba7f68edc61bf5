#include "minimind/model/minimind_model.h"

#include "minimind/model/linear.h"
#include "minimind/model/next_token_loss.h"

namespace minimind {

MiniMindBlockImpl::MiniMindBlockImpl(const ModelConfig& cfg) {
  self_attn = register_module("self_attn", Attention(cfg));
  input_layernorm = register_module("input_layernorm", RMSNorm(cfg.hidden_size, cfg.rms_norm_eps));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RMSNorm(cfg.hidden_size, cfg.rms_norm_eps));
  if (cfg.use_moe) {
    moe_mlp = register_module("mlp", MOEFeedForward(MoEOptions::from(cfg)));
  } else {
    dense_mlp = register_module("mlp", FeedForward(cfg.hidden_size, cfg.ffn_size()));
  }
}

BlockOutput MiniMindBlockImpl::forward(const torch::Tensor& x, const RotaryTables& rope,
                                       LayerKVCache* cache, const torch::Tensor& real,
                                       const torch::Tensor& token_ids, const BatchShard* shard) {
  torch::Tensor h = x + self_attn(input_layernorm(x), rope, cache);  // [B, T, H]
  torch::Tensor normed = post_attention_layernorm(h);
  if (moe_mlp) {
    // Generation (a KV cache) reads only the logits: no router statistics.
    MoEOutput moe = moe_mlp(normed, real, token_ids, /*stats=*/cache == nullptr, shard);
    torch::Tensor out = h + moe.y;
    return {out, std::move(moe)};
  }
  return {h + dense_mlp(normed), {}};
}

MiniMindModelImpl::MiniMindModelImpl(const ModelConfig& cfg) : dropout(cfg.dropout) {
  embed_tokens =
      register_module("embed_tokens", torch::nn::Embedding(cfg.vocab_size, cfg.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    blocks.emplace_back(cfg);
    layers->push_back(blocks.back());
  }
  norm = register_module("norm", RMSNorm(cfg.hidden_size, cfg.rms_norm_eps));
  rope = make_rotary_tables(cfg.head_dim(), cfg.max_position_embeddings, cfg.rope_theta);
}

MiniMindForCausalLMImpl::MiniMindForCausalLMImpl(const ModelConfig& cfg) : cfg_(cfg) {
  model = register_module("model", MiniMindModel(cfg));
  if (!cfg.tie_word_embeddings) {
    lm_head = register_module("lm_head", linear_no_bias(cfg.hidden_size, cfg.vocab_size));
  }
}

torch::Tensor MiniMindForCausalLMImpl::lm_head_weight() const {
  return lm_head ? lm_head->weight : model->embed_tokens->weight;
}

ForwardOutput MiniMindForCausalLMImpl::forward(const torch::Tensor& input_ids,
                                               const torch::Tensor& labels,
                                               const ForwardOptions& o) {
  TORCH_CHECK(input_ids.dim() == 2, "input_ids must be [B, T], got ", input_ids.sizes());
  TORCH_CHECK(!o.shard || !is_training() || model->dropout == 0,
              "a micro-batch in shards needs dropout 0 (its masks come from one generator)");
  KVCache* cache = o.cache;
  const int64_t past = cache && !cache->empty() ? (*cache)[0].length() : 0;
  TORCH_CHECK(past + input_ids.size(1) <= model->rope.cos.size(0), "sequence of ",
              past + input_ids.size(1), " positions exceeds max_position_embeddings (",
              model->rope.cos.size(0), ")");
  if (cache) cache->resize(model->blocks.size());

  ForwardOutput out;
  // Padding (id 0, never produced by the tokenizer for text) is left out of load counts.
  torch::Tensor real, token_ids;
  if (cfg_.use_moe) {
    token_ids = input_ids.reshape({-1});  // [B*T]
    torch::Tensor is_real = token_ids != 0;
    if (!is_real.all().item<bool>()) real = is_real;
  }
  torch::Tensor h = torch::dropout(model->embed_tokens(input_ids), model->dropout,
                                   is_training());  // [B, T, H]
  for (size_t i = 0; i < model->blocks.size(); ++i) {
    BlockOutput b =
        model->blocks[i](h, model->rope, cache ? &(*cache)[i] : nullptr, real, token_ids, o.shard);
    h = b.hidden;
    if (!b.moe.aux_loss.defined()) continue;  // dense block
    out.aux_loss = out.aux_loss.defined() ? out.aux_loss + b.moe.aux_loss : b.moe.aux_loss;
    out.z_loss = out.z_loss.defined() ? out.z_loss + b.moe.z_loss : b.moe.z_loss;
    out.moe.push_back(std::move(b.moe.stats));
  }
  if (!o.head) return out;
  h = model->norm(h);
  out.logits = project(h, lm_head_weight());  // [B, T, V]
  if (!out.aux_loss.defined()) out.aux_loss = torch::zeros({}, out.logits.options());
  if (!out.z_loss.defined()) out.z_loss = torch::zeros({}, out.logits.options());

  if (labels.defined()) {
    // logits[:, t] predict labels[:, t + 1]; a shard's part: its sum over all rows' count
    out.loss = o.shard ? next_token_loss(out.logits, labels, /*mean=*/false) /
                             static_cast<double>(o.shard->targets)
                       : next_token_loss(out.logits, labels);
  }
  return out;
}

void MiniMindForCausalLMImpl::update_router_bias(
    const std::vector<std::vector<int64_t>>& step_counts) {
  size_t l = 0;
  for (auto& block : model->blocks) {
    if (!block->moe_mlp) continue;
    TORCH_CHECK(l < step_counts.size(), "no counts for MoE layer ", l);
    block->moe_mlp->update_bias(step_counts[l++]);
  }
}

std::vector<torch::Tensor> MiniMindForCausalLMImpl::router_biases() const {
  std::vector<torch::Tensor> out;
  for (const auto& block : model->blocks)
    if (block->moe_mlp && block->moe_mlp->bias().defined()) out.push_back(block->moe_mlp->bias());
  return out;
}

std::vector<torch::Tensor> MiniMindForCausalLMImpl::router_weights() const {
  std::vector<torch::Tensor> out;
  for (const auto& block : model->blocks)
    if (block->moe_mlp && block->moe_mlp->gate) out.push_back(block->moe_mlp->gate->weight);
  return out;
}

void init_weights(MiniMindForCausalLM& model) {
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    const bool is_norm = name.size() >= 11 && name.find("norm.weight") == name.size() - 11;
    if (is_norm) {
      item.value().fill_(1.0);
    } else {
      item.value().normal_(0.0, 0.02);
    }
  }
}

ParamCount count_parameters(const MiniMindForCausalLM& model) {
  const ModelConfig& cfg = model->config();
  ParamCount c{0, 0};
  for (const auto& p : model->parameters()) c.total += p.numel();
  c.active = c.total;
  if (cfg.use_moe) {
    // Shared experts and the router are active for every token; routed experts k of E.
    const int64_t per_expert = 3 * cfg.hidden_size * cfg.expert_ffn_size();
    c.active -= cfg.num_hidden_layers * (cfg.num_experts - cfg.num_experts_per_tok) * per_expert;
  }
  return c;
}

}  // namespace minimind
