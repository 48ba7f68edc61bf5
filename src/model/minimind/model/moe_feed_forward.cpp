#include "minimind/model/moe_feed_forward.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "minimind/model/linear.h"
#include "minimind/model/routed_experts.h"

namespace minimind {

MOEFeedForwardImpl::MOEFeedForwardImpl(const ModelConfig& cfg)
    : cfg_(cfg), num_experts_(cfg.num_experts), top_k_(cfg.num_experts_per_tok) {
  if (cfg.learned_router()) {
    gate = register_module("gate", linear_no_bias(cfg.hidden_size, num_experts_));
    if (cfg.router_bias_update_rate > 0)
      bias_ = gate->register_buffer("e_score_correction_bias", torch::zeros({num_experts_}));
  }
  experts = register_module("experts", torch::nn::ModuleList());
  for (int64_t e = 0; e < num_experts_; ++e) {
    expert_list_.emplace_back(cfg.hidden_size, cfg.expert_ffn_size());
    experts->push_back(expert_list_.back());
  }
  if (cfg.n_shared_experts > 0) {
    shared_experts = register_module("shared_experts", torch::nn::ModuleList());
    for (int64_t s = 0; s < cfg.n_shared_experts; ++s) {
      shared_list_.emplace_back(cfg.hidden_size, cfg.shared_ffn_size());
      shared_experts->push_back(shared_list_.back());
    }
  }
}

MOEFeedForwardImpl::Routing MOEFeedForwardImpl::route(const torch::Tensor& x_flat,
                                                      const torch::Tensor& token_ids) {
  const int64_t N = x_flat.size(0);
  Routing r;
  if (cfg_.router == "random") {  // uniform k-subset per token, from torch's generator
    r.index = std::get<1>(torch::topk(torch::rand({N, num_experts_}), top_k_, -1));  // [N, k]
    r.weight = torch::full({N, top_k_}, 1.0 / static_cast<double>(top_k_), x_flat.options());
    return r;
  }
  if (cfg_.router == "hash") {  // Roller et al.: expert = token id mod E
    TORCH_CHECK(token_ids.defined(), "the hash router needs the token ids");
    r.index = token_ids.remainder(num_experts_).unsqueeze(1);  // [N, 1]
    r.weight = torch::ones({N, 1}, x_flat.options());
    return r;
  }
  r.logits = project(x_flat, gate->weight);  // [N, E]
  torch::Tensor scores;
  if (cfg_.scoring_func == "sigmoid") {
    scores = torch::sigmoid(r.logits);                    // [N, E] independent affinities
    r.probs = scores / scores.sum(-1, /*keepdim=*/true);  // [N, E] for the aux losses
  } else {
    scores = r.probs = torch::softmax(r.logits, -1);  // [N, E]
  }
  if (bias_.defined()) {
    // The bias only chooses; the mixing weight is the unbiased score.
    r.index = std::get<1>(torch::topk(scores.detach() + bias_, top_k_, -1, true, false));
    r.weight = scores.gather(1, r.index);  // [N, k]
  } else {
    std::tie(r.weight, r.index) =
        torch::topk(scores, top_k_, -1, /*largest=*/true, /*sorted=*/false);
  }
  if (cfg_.norm_topk_prob) r.weight = r.weight / (r.weight.sum(-1, /*keepdim=*/true) + 1e-20);
  return r;
}

torch::Tensor MOEFeedForwardImpl::capacity_keep(const torch::Tensor& index,
                                                const torch::Tensor& weight) const {
  const int64_t N = index.size(0), E = num_experts_;
  const auto capacity = static_cast<int64_t>(
      std::ceil(cfg_.capacity_factor * static_cast<double>(top_k_ * N) / static_cast<double>(E)));
  torch::Tensor flat = index.reshape({-1});  // [N*k] in token order, slots inside a token
  // Rank the assignments inside each expert: "position" keeps token order, "probs" orders
  // by routing weight first (a stable sort, so equal weights keep token order).
  torch::Tensor order;
  if (cfg_.capacity_drop_policy == "probs") {
    torch::Tensor by_weight = std::get<1>(
        torch::sort(weight.detach().reshape({-1}), /*stable=*/true, 0, /*descending=*/true));
    torch::Tensor within =
        std::get<1>(torch::sort(flat.index_select(0, by_weight), true, 0, false));
    order = by_weight.index_select(0, within);  // [N*k] grouped by expert
  } else {
    order = std::get<1>(torch::sort(flat, /*stable=*/true, 0, false));
  }
  torch::Tensor counts = torch::bincount(flat, {}, E);        // [E]
  torch::Tensor starts = torch::cumsum(counts, 0) - counts;   // [E] first slot of each expert
  torch::Tensor sorted_expert = flat.index_select(0, order);  // [N*k]
  torch::Tensor rank = torch::arange(flat.size(0)) - starts.index_select(0, sorted_expert);
  torch::Tensor keep = torch::zeros({flat.size(0)}, torch::kBool);
  keep.index_put_({order}, rank < capacity);
  return keep.view(index.sizes());  // [N, k]
}

torch::Tensor MOEFeedForwardImpl::aux_loss(const Routing& r, int64_t batch,
                                           const BatchShard* shard) const {
  const auto E = static_cast<double>(num_experts_);
  if (cfg_.aux_loss_scope == "sequence") {
    // MiniMind2 seq_aux / DeepSeek-V3: ce[b,e] = count of b's (t, slot) on e / (S*k/E).
    const int64_t S = r.index.size(0) / batch;
    torch::Tensor ce = torch::zeros({batch, num_experts_}, r.probs.options());  // [B, E]
    ce.scatter_add_(1, r.index.reshape({batch, S * top_k_}),
                    torch::ones({batch, S * top_k_}, r.probs.options()));
    ce.div_(static_cast<double>(S * top_k_) / E);
    torch::Tensor p = r.probs.view({batch, S, num_experts_}).mean(1);  // [B, E]
    torch::Tensor per_row = (ce * p).sum(1);                           // [B]
    // A shard's rows are whole sequences: its part of the mean over all rows.
    return (shard ? per_row.sum() / static_cast<double>(shard->rows) : per_row.mean()) *
           cfg_.router_aux_loss_coef;
  }
  // MiniMind's form keeps the top-k axis (load is [k, E]), so its floor is k * coef.
  // load[j][e] = share of tokens whose slot j chose e: counted with bincount over j*E + e
  // (the same integers and division as one_hot(...).mean(0), without the [N, k, E] tensor).
  // A shard: the shares over the whole micro-batch (counts summed over the shards), times
  // this shard's part of the mean score.
  const int64_t N = shard ? shard->tokens : r.index.size(0);
  torch::Tensor slot_expert = r.index + torch::arange(top_k_, r.index.options()) * num_experts_;
  torch::Tensor counts =
      torch::bincount(slot_expert.reshape({-1}), {}, top_k_ * num_experts_);  // [k*E]
  if (shard) shard->sum(counts);
  torch::Tensor load =
      counts.view({top_k_, num_experts_}).to(torch::kFloat32) / static_cast<double>(N);  // [k, E]
  torch::Tensor mean_probs =
      shard ? r.probs.sum(0) / static_cast<double>(N) : r.probs.mean(0);  // [E]
  return (load * mean_probs).sum() * E * cfg_.router_aux_loss_coef;
}

torch::Tensor MOEFeedForwardImpl::dispatch(const torch::Tensor& x_flat, const Routing& r,
                                           MoEOutput& out, torch::Tensor& chosen_counts) {
  const int64_t N = x_flat.size(0);
  const torch::Tensor& weight = r.weight;  // [N, k]
  const torch::Tensor& index = r.index;    // [N, k]
  // One token outside training (a generated token): its k experts run directly, without
  // the sort and scatter below; added in ascending expert order as index_add does.
  if (N == 1 && !is_training() && cfg_.capacity_factor <= 0) {
    const torch::Tensor flat = index.reshape({-1});
    chosen_counts = torch::bincount(flat, {}, num_experts_);  // [E]
    std::vector<std::pair<int64_t, int64_t>> slots;           // (expert, slot)
    for (int64_t j = 0; j < top_k_; ++j) slots.emplace_back(flat[j].item<int64_t>(), j);
    std::sort(slots.begin(), slots.end());
    torch::Tensor y = torch::zeros_like(x_flat);  // [1, H]
    for (const auto& [e, j] : slots) y = y + expert_list_[e](x_flat) * weight.select(1, j);
    return y;
  }

  // Sorted dispatch: order the N*k (token, slot) assignments by expert so each expert
  // runs once on one contiguous slice; a stable sort keeps tokens ascending inside a
  // slice, so each expert sees its rows in the same order as MiniMind's masked loop.
  // Dropped assignments get expert id E and sort to the end, outside every slice.
  torch::Tensor flat_index = index.reshape({-1});  // [N*k]
  if (cfg_.capacity_factor > 0) {
    out.keep = capacity_keep(index, weight);
    flat_index = flat_index.masked_fill(out.keep.reshape({-1}).logical_not(), num_experts_);
  }
  const int64_t bins = num_experts_ + (out.keep.defined() ? 1 : 0);
  torch::Tensor counts = torch::bincount(flat_index, {}, bins);  // [E] (+1: dropped)
  // The dispatch counts are the router's choices when nothing is dropped.
  chosen_counts =
      out.keep.defined() ? torch::bincount(index.reshape({-1}), {}, num_experts_) : counts;  // [E]
  torch::Tensor order = std::get<1>(torch::sort(flat_index, /*stable=*/true, 0, false));
  const int64_t kept =
      flat_index.size(0) - (out.keep.defined() ? counts[num_experts_].item<int64_t>() : 0);
  if (kept < flat_index.size(0)) order = order.narrow(0, 0, kept);
  if (kept == 0) {  // every assignment dropped
    torch::Tensor y = torch::zeros_like(x_flat);
    // As MiniMind: an idle expert joins the graph with a zero gradient, so every parameter
    // gets a gradient on every step (AdamW then decays it, and all ranks agree under DDP).
    // (routed_experts gives idle experts their zero gradients when some rows remain.)
    if (is_training())
      for (const auto& p : experts->parameters()) y = y + 0 * p.sum();
    return y;
  }
  const torch::Tensor token = torch::div(order, top_k_, "floor");              // [kept]
  const torch::Tensor w_sorted = weight.reshape({-1}).index_select(0, order);  // [kept]
  const std::vector<int64_t> rows(counts.data_ptr<int64_t>(),
                                  counts.data_ptr<int64_t>() + num_experts_);
  torch::Tensor y = routed_experts(x_flat, token, w_sorted.to(x_flat.scalar_type()), rows,
                                   expert_list_);  // [N, H]
  return y;
}

MoEOutput MOEFeedForwardImpl::forward(const torch::Tensor& x, const torch::Tensor& real,
                                      const torch::Tensor& token_ids, bool stats,
                                      const BatchShard* shard) {
  TORCH_CHECK(!shard || (cfg_.capacity_factor <= 0 && cfg_.router != "random"),
              "a micro-batch in shards needs a dropless MoE without the random router");
  const int64_t H = x.size(-1);
  torch::Tensor x_flat = x.reshape({-1, H});  // [N, H]
  const Routing r = route(x_flat, token_ids);
  torch::Tensor weight = r.weight, index = r.index;  // [N, k]
  MoEOutput out;
  out.index = index;

  // The router's choices per expert over all N tokens, before any dropping.
  torch::Tensor chosen_counts;                                // [E]
  torch::Tensor y = dispatch(x_flat, r, out, chosen_counts);  // [N, H]
  const torch::Tensor chosen = index.reshape({-1});           // [N*k]
  for (auto& shared : shared_list_) y = y + shared(x_flat);   // always on, no gate

  // Losses: only in training, only the learned router has scores.
  const bool train_router = is_training() && cfg_.learned_router();
  const torch::Tensor zero = torch::zeros({}, x.options());
  out.aux_loss = out.z_loss = zero;
  if (train_router && cfg_.router_aux_loss_coef > 0) {
    if (cfg_.aux_loss_scope == "global") {
      out.route_counts = chosen_counts.to(torch::kFloat64);
      out.probs_mean = shard ? r.probs.sum(0) / static_cast<double>(shard->tokens)
                             : r.probs.mean(0);  // [E] (a shard: its part of the mean)
    } else {
      out.aux_loss = aux_loss(r, x.size(0), shard);
    }
  }
  if (r.logits.defined() && (stats || train_router)) {
    const bool z_trains = train_router && cfg_.router_z_loss_coef > 0;
    // Logged only: keep it out of the graph.
    const c10::AutoGradMode grad_mode(z_trains && c10::GradMode::is_enabled());
    torch::Tensor lse2 = torch::logsumexp(r.logits, -1).pow(2);  // [N]
    torch::Tensor z = shard ? lse2.sum() / static_cast<double>(shard->tokens) : lse2.mean();
    if (z_trains) out.z_loss = z * cfg_.router_z_loss_coef;
    out.z = z.detach();
  }

  // Load statistics over real tokens only, before dropping.
  torch::Tensor real_slots;  // [N*k] bool
  if (real.defined()) real_slots = real.unsqueeze(1).expand_as(index).reshape({-1});
  out.counts = real_slots.defined()
                   ? torch::bincount(chosen.masked_select(real_slots), {}, num_experts_)
                   : chosen_counts;
  if (r.probs.defined() && stats) {
    torch::NoGradGuard no_grad;
    out.probs = r.probs.detach();
    torch::Tensor p = out.probs.to(torch::kFloat64);             // [N, E]
    torch::Tensor entropy = -torch::xlogy(p, p).sum(1);          // [N] nats
    torch::Tensor confidence = p.gather(1, index).sum(1);        // [N] mass on the chosen
    torch::Tensor w = real.defined() ? real.to(torch::kFloat64)  // [N] 1 for real tokens
                                     : torch::ones({p.size(0)}, p.options());
    out.router_sums = torch::cat({torch::matmul(w, p), (entropy * w).sum().view(1),
                                  (confidence * w).sum().view(1), w.sum().view(1)});  // [E + 3]
  }
  if (out.keep.defined()) {
    torch::Tensor dropped = out.keep.reshape({-1}).logical_not();
    if (real_slots.defined()) dropped = dropped.logical_and(real_slots);
    out.dropped = dropped.sum();
  }
  out.y = y.view(x.sizes());
  return out;
}

void MOEFeedForwardImpl::update_bias(const std::vector<int64_t>& step_counts) {
  if (!bias_.defined()) return;
  TORCH_CHECK(static_cast<int64_t>(step_counts.size()) == num_experts_, "expected ", num_experts_,
              " counts, got ", step_counts.size());
  torch::NoGradGuard no_grad;
  torch::Tensor c = torch::tensor(step_counts, torch::kInt64).to(torch::kFloat32);  // [E]
  bias_.add_(torch::sign(c.mean() - c) * cfg_.router_bias_update_rate);
}

}  // namespace minimind
