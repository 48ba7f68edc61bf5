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
    moe_mlp = register_module("mlp", MOEFeedForward(cfg));
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

namespace {

// Max over the batch's rows of each row's MaxVio, (max c - mean c) / mean c of the row's
// real-token assignments; rows without a real token are left out (0 if none is left).
double sequence_max_vio(const torch::Tensor& index, const torch::Tensor& real, int64_t rows,
                        int64_t num_experts) {
  // c[b][e]: assignments of row b's real tokens to e, a bincount over b*E + e.
  const int64_t N = index.size(0), k = index.size(1);
  torch::Tensor row = torch::arange(N, index.options()).div(N / rows, "floor");  // [N]
  torch::Tensor bin = (index + (row * num_experts).unsqueeze(1)).reshape({-1});  // [N*k]
  if (real.defined()) bin = bin.masked_select(real.unsqueeze(1).expand({N, k}).reshape({-1}));
  torch::Tensor c = torch::bincount(bin, {}, rows * num_experts)
                        .view({rows, num_experts})
                        .to(torch::kFloat64);  // [B, E]
  torch::Tensor mean = c.mean(1);              // [B]
  torch::Tensor used = mean > 0;
  if (!used.any().item<bool>()) return 0.0;
  torch::Tensor vio = (std::get<0>(c.max(1)) - mean) / mean;  // [B]
  return vio.masked_select(used).max().item<double>();
}

}  // namespace

ForwardOutput MiniMindForCausalLMImpl::forward(const torch::Tensor& input_ids,
                                               const torch::Tensor& labels, KVCache* cache,
                                               StepRouting* step, bool head,
                                               const BatchShard* shard) {
  TORCH_CHECK(input_ids.dim() == 2, "input_ids must be [B, T], got ", input_ids.sizes());
  TORCH_CHECK(!shard || !is_training() || model->dropout == 0,
              "a micro-batch in shards needs dropout 0 (its masks come from one generator)");
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
                                   is_training());      // [B, T, H]
  std::vector<torch::Tensor> route_counts, probs_mean;  // global aux scope
  for (size_t i = 0; i < model->blocks.size(); ++i) {
    BlockOutput b =
        model->blocks[i](h, model->rope, cache ? &(*cache)[i] : nullptr, real, token_ids, shard);
    h = b.hidden;
    const MoEOutput& m = b.moe;
    if (!m.aux_loss.defined()) continue;  // dense block
    out.aux_loss = out.aux_loss.defined() ? out.aux_loss + m.aux_loss : m.aux_loss;
    out.z_loss = out.z_loss.defined() ? out.z_loss + m.z_loss : m.z_loss;
    out.layer_aux.push_back(m.aux_loss.detach());
    out.expert_counts.push_back(m.counts);
    if (m.z.defined()) out.layer_z.push_back(m.z);
    if (m.dropped.defined()) out.layer_dropped.push_back(m.dropped);
    if (m.keep.defined()) out.layer_keep.push_back(m.keep);
    out.layer_index.push_back(m.index);
    if (m.router_sums.defined()) {
      out.layer_probs.push_back(m.probs);
      out.layer_router.push_back(m.router_sums);
    }
    if (is_training())  // a training statistic: two syncs per layer, not paid in eval
      out.layer_seq_max_vio.push_back(
          sequence_max_vio(m.index, real, input_ids.size(0), cfg_.num_experts));
    if (m.route_counts.defined()) {
      route_counts.push_back(m.route_counts);
      probs_mean.push_back(m.probs_mean);
    }
  }
  if (!route_counts.empty()) {
    // Global scope: f_e from the counts of every micro-batch of this step so far, on every
    // rank, over the tokens counted (not this micro-batch's); P_e stays this micro-batch's.
    torch::Tensor local = torch::cat(
        {torch::stack(route_counts).reshape({-1}),
         torch::full({1}, static_cast<double>(input_ids.numel()), torch::kFloat64)});  // [L*E + 1]
    StepRouting one_step;
    StepRouting& st = step ? *step : one_step;
    if (shard) {
      shard->sum(local, st.sum_over_ranks);  // each shard keeps its own StepRouting, alike
    } else if (st.sum_over_ranks) {
      st.sum_over_ranks(local);
    }
    const auto L = static_cast<int64_t>(route_counts.size());
    torch::Tensor counts = local.narrow(0, 0, L * cfg_.num_experts).view({L, cfg_.num_experts});
    st.counts = st.counts.defined() ? st.counts + counts : counts;
    st.tokens += local[L * cfg_.num_experts].item<double>();
    torch::Tensor f = (st.counts / st.tokens).to(torch::kFloat32);  // [L, E]
    for (int64_t l = 0; l < L; ++l) {
      torch::Tensor aux = (f[l] * probs_mean[static_cast<size_t>(l)]).sum() *
                          static_cast<double>(cfg_.num_experts) * cfg_.router_aux_loss_coef;
      out.aux_loss = out.aux_loss + aux;
      out.layer_aux[static_cast<size_t>(l)] = aux.detach();
    }
  }
  if (!head) return out;
  h = model->norm(h);
  out.logits = project(h, lm_head_weight());  // [B, T, V]
  if (!out.aux_loss.defined()) out.aux_loss = torch::zeros({}, out.logits.options());
  if (!out.z_loss.defined()) out.z_loss = torch::zeros({}, out.logits.options());

  if (labels.defined()) {
    // logits[:, t] predict labels[:, t + 1]; a shard's part: its sum over all rows' count
    out.loss = shard ? next_token_loss(out.logits, labels, /*mean=*/false) /
                           static_cast<double>(shard->targets)
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
