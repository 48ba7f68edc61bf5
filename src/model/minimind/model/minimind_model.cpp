#include "minimind/model/minimind_model.h"

#include <map>
#include <optional>

#include "minimind/model/linear.h"
#include "minimind/model/next_token_loss.h"
#include "minimind/util/step_part.h"

namespace minimind {

MiniMindBlockImpl::MiniMindBlockImpl(const ModelConfig& cfg, int64_t layer,
                                     const Products& products) {
  self_attn = register_module("self_attn", Attention(cfg, products));
  input_layernorm =
      register_module("input_layernorm", RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, products,
                                                 /*rounded_copy=*/true));
  post_attention_layernorm =
      register_module("post_attention_layernorm",
                      RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, products, /*rounded_copy=*/true));
  if (cfg.use_moe) {
    moe_mlp = register_module("mlp", MOEFeedForward(MoEOptions::from(cfg, layer, products)));
  } else {
    dense_mlp = register_module("mlp", FeedForward(cfg.hidden_size, cfg.ffn_size(), products));
  }
}

BlockOutput MiniMindBlockImpl::forward(const Residual& in, const RotaryTables& rope,
                                       LayerKVCache* cache, const torch::Tensor& real,
                                       const torch::Tensor& token_ids, const BatchShard* shard,
                                       const PackedRows* packed) {
  const AddNormed x = input_layernorm->forward_add(in.x, in.delta, in.delta_from_products);
  const AddNormed h =
      post_attention_layernorm->forward_add(x.sum, self_attn(x.normed, rope, cache, packed),
                                            /*grad_copy=*/true);  // [B, T, H] each
  if (moe_mlp) {
    // Generation (a KV cache) reads only the logits: no router statistics.
    MoEOutput moe = moe_mlp(h.normed, real, token_ids, /*stats=*/cache == nullptr, shard);
    return {{h.sum, moe.y, false}, std::move(moe)};
  }
  return {{h.sum, dense_mlp(h.normed), true}, {}};
}

MiniMindModelImpl::MiniMindModelImpl(const ModelConfig& cfg, const Products& products)
    : dropout(cfg.dropout) {
  embed_tokens =
      register_module("embed_tokens", torch::nn::Embedding(cfg.vocab_size, cfg.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    blocks.emplace_back(cfg, i, products);
    layers->push_back(blocks.back());
  }
  norm = register_module(
      "norm", RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, products, /*rounded_copy=*/true));
  rope = make_rotary_tables(cfg.head_dim(), cfg.max_position_embeddings, cfg.rope_theta);
}

MiniMindForCausalLMImpl::MiniMindForCausalLMImpl(const ModelConfig& cfg, const Products& products)
    : cfg_(cfg), products_(products), head_node_(training_node(products)) {
  model = register_module("model", MiniMindModel(cfg, products));
  if (!cfg.tie_word_embeddings) {
    lm_head = register_module("lm_head", linear_no_bias(cfg.hidden_size, cfg.vocab_size));
  }
}

ExpertShard MiniMindForCausalLMImpl::expert_shard() const {
  for (const auto& block : model->blocks)
    if (block->moe_mlp) return block->moe_mlp->shard();
  return {};
}

void apply_expert_parallel(MiniMindForCausalLM& model, ExpertExchange& exchange) {
  TORCH_CHECK(model->config().use_moe, "expert parallelism needs a MoE model (model.use_moe)");
  for (auto& block : model->model->blocks)
    if (block->moe_mlp) block->moe_mlp->keep_expert_shard(exchange);
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
  std::optional<PackedRows> packed;
  if (o.starts.defined()) {
    TORCH_CHECK(o.starts.sizes() == input_ids.sizes(), "starts must be shaped as input_ids ",
                input_ids.sizes(), ", got ", o.starts.sizes());
    packed = packed_rows(o.starts, model->rope);
  }

  ForwardOutput out;
  // Padding (id 0, never produced by the tokenizer for text) is left out of load counts.
  torch::Tensor real, token_ids;
  if (cfg_.use_moe) {
    token_ids = input_ids.reshape({-1});  // [B*T]
    torch::Tensor is_real = token_ids != 0;
    if (!is_real.all().item<bool>()) real = is_real;
  }
  torch::Tensor h = in_part(StepPart::embedding, [&] {
    return torch::dropout(model->embed_tokens(input_ids), model->dropout, is_training());
  });  // [B, T, H]
  Residual stream{h, {}, false};
  for (size_t i = 0; i < model->blocks.size(); ++i) {
    BlockOutput b = model->blocks[i](stream, model->rope, cache ? &(*cache)[i] : nullptr, real,
                                     token_ids, o.shard, packed ? &*packed : nullptr);
    stream = std::move(b.out);
    if (!b.moe.aux_loss.defined()) continue;  // dense block
    out.aux_loss = out.aux_loss.defined() ? out.aux_loss + b.moe.aux_loss : b.moe.aux_loss;
    out.z_loss = out.z_loss.defined() ? out.z_loss + b.moe.z_loss : b.moe.z_loss;
    out.moe.push_back(std::move(b.moe.stats));
  }
  if (!o.head) return out;
  h = model->norm->forward_add(stream.x, stream.delta, stream.delta_from_products).normed;
  if (!out.aux_loss.defined()) out.aux_loss = torch::zeros({}, h.options());
  if (!out.z_loss.defined()) out.z_loss = torch::zeros({}, h.options());
  if (labels.defined() && !o.logits && runs_own_node(head_node_, h)) {
    // Our node: the logits are formed inside the loss, and not kept.
    out.loss = o.shard ? head_next_token_loss(h, lm_head_weight(), labels, products_,
                                              /*mean=*/false) /
                             static_cast<double>(o.shard->targets)
                       : head_next_token_loss(h, lm_head_weight(), labels, products_);
    return out;
  }
  out.logits = project(h, lm_head_weight(), products_);  // [B, T, V]
  if (labels.defined()) {
    // logits[:, t] predict labels[:, t + 1]; a shard's part: its sum over all rows' count
    out.loss = o.shard ? next_token_loss(out.logits, labels, /*mean=*/false, head_node_) /
                             static_cast<double>(o.shard->targets)
                       : next_token_loss(out.logits, labels, /*mean=*/true, head_node_);
    // The loss keeps what its backward needs: without a reader, [B, T, V] floats go now.
    if (!o.logits) out.logits = torch::Tensor();
  }
  return out;
}

void MiniMindForCausalLMImpl::update_router_bias(
    const std::vector<std::vector<int64_t>>& step_counts, const std::vector<torch::Tensor>& qb) {
  size_t l = 0;
  for (auto& block : model->blocks) {
    if (!block->moe_mlp) continue;
    TORCH_CHECK(l < step_counts.size(), "no counts for MoE layer ", l);
    block->moe_mlp->update_bias(step_counts[l], l < qb.size() ? qb[l] : torch::Tensor());
    ++l;
  }
}

std::vector<torch::Tensor> MiniMindForCausalLMImpl::router_biases() const {
  std::vector<torch::Tensor> out;
  bool any = false;
  for (const auto& block : model->blocks)
    if (block->moe_mlp) {
      out.push_back(block->moe_mlp->bias());
      any = any || out.back().defined();
    }
  if (!any) out.clear();
  return out;
}

std::vector<torch::Tensor> MiniMindForCausalLMImpl::router_weights() const {
  std::vector<torch::Tensor> out;
  for (const auto& block : model->blocks)
    if (block->moe_mlp && block->moe_mlp->gate) out.push_back(block->moe_mlp->gate->weight);
  return out;
}

std::vector<torch::Tensor> MiniMindForCausalLMImpl::expert_grams(
    const std::function<void(torch::Tensor&)>& sum_over_group) const {
  torch::NoGradGuard no_grad;
  const int64_t E = cfg_.num_experts;
  const ExpertShard shard = expert_shard();
  std::vector<torch::Tensor> out;
  for (const auto& block : model->blocks) {
    if (!block->moe_mlp) continue;
    const MOEFeedForward& moe = block->moe_mlp;
    torch::Tensor gram = torch::zeros({E, E}, torch::kFloat64);
    for (int m = 0; m < 3; ++m) {  // one matrix at a time: [E, numel] stays small
      auto weight = [&](int64_t e) {
        const FeedForward f = moe->expert(e);
        return (m == 0 ? f->gate_proj : m == 1 ? f->up_proj : f->down_proj)->weight;
      };
      const int64_t first = shard.first(E), held = shard.size(E);
      torch::Tensor rows = torch::zeros({E, weight(first).numel()}, torch::kFloat32);  // [E, n]
      for (int64_t e = first; e < first + held; ++e) rows[e].copy_(weight(e).flatten());
      if (!shard.whole() && sum_over_group) sum_over_group(rows);
      const torch::Tensor v = rows.to(torch::kFloat64);
      gram += v.mm(v.t());  // [E, E]
    }
    out.push_back(gram);
  }
  return out;
}

std::vector<ParamSlot> full_parameters(const MiniMindForCausalLM& model) {
  const int64_t E = model->config().num_experts;
  const ExpertShard shard = model->expert_shard();
  std::vector<ParamSlot> out;
  // A routed expert's parameter is named PREFIX.experts.ID.REST; the experts of a layer come
  // one after another, so the held ones are replaced, at the first, by all E in order.
  const std::string mark = ".experts.";
  std::string prefix;  // of the layer whose experts are being read
  std::vector<std::pair<std::string, std::vector<int64_t>>> rest;  // one expert's parameters
  std::map<std::string, torch::Tensor> held;                       // this layer's, by name
  auto flush = [&] {
    if (prefix.empty()) return;
    for (int64_t e = 0; e < E; ++e)
      for (const auto& [suffix, shape] : rest) {
        const std::string name = prefix + mark + std::to_string(e) + "." + suffix;
        const auto it = held.find(name);
        out.push_back({name, shape, it == held.end() ? torch::Tensor() : it->second, e});
      }
    prefix.clear(), rest.clear(), held.clear();
  };
  const int64_t first = shard.first(E);
  for (const auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    const size_t at = name.find(mark);
    if (at == std::string::npos || name.find("shared_experts") != std::string::npos) {
      flush();
      out.push_back({name, item.value().sizes().vec(), item.value(), -1});
      continue;
    }
    const std::string p = name.substr(0, at);
    if (p != prefix) flush(), prefix = p;
    const size_t dot = name.find('.', at + mark.size());
    const std::string id = name.substr(at + mark.size(), dot - at - mark.size());
    if (std::stoll(id) == first)
      rest.emplace_back(name.substr(dot + 1), item.value().sizes().vec());
    held[name] = item.value();
  }
  flush();
  return out;
}

void init_weights(MiniMindForCausalLM& model) {
  torch::NoGradGuard no_grad;
  for (const ParamSlot& slot : full_parameters(model)) {
    const std::string& name = slot.name;
    const bool is_norm = name.size() >= 11 && name.find("norm.weight") == name.size() - 11;
    // Another rank's expert: drawn all the same, so the generator stays where the whole
    // model's initialisation leaves it.
    torch::Tensor t = slot.local.defined() ? slot.local : torch::empty(slot.shape);
    if (is_norm) {
      t.fill_(1.0);
    } else {
      t.normal_(0.0, 0.02);
    }
  }
}

ParamCount count_parameters(const MiniMindForCausalLM& model) {
  const ModelConfig& cfg = model->config();
  ParamCount c{0, 0};
  for (const ParamSlot& p : full_parameters(model)) c.total += c10::multiply_integers(p.shape);
  c.active = c.total;
  if (cfg.use_moe) {
    // Shared experts and the router are active for every token; routed experts k of E.
    const int64_t per_expert = 3 * cfg.hidden_size * cfg.expert_ffn_size();
    c.active -= cfg.num_hidden_layers * (cfg.num_experts - cfg.num_experts_per_tok) * per_expert;
  }
  return c;
}

}  // namespace minimind
