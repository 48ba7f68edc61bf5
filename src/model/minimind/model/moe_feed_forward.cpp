#include "minimind/model/moe_feed_forward.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "minimind/model/balancing/balancing.h"
#include "minimind/model/linear.h"
#include "minimind/model/routed_experts.h"
#include "minimind/util/cpu_clones.h"
#include "minimind/util/step_part.h"

namespace minimind {

namespace {

// Rows [0, rows) of x [rows, E] and the k columns top-k chose in each, index [rows, k]:
// the smallest chosen value minus the largest one left, into out [rows]. False at the first
// NaN (its place among the others is torch::topk's to say).
MINIMIND_CPU_CLONES bool margin_rows(const float* __restrict x, const int64_t* __restrict index,
                                     float* __restrict out, int64_t rows, int64_t E, int64_t k) {
  std::vector<char> chosen(static_cast<size_t>(E));
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * E;
    std::fill(chosen.begin(), chosen.end(), 0);
    float low = xr[index[r * k]];
    for (int64_t j = 0; j < k; ++j) {
      const float v = xr[index[r * k + j]];
      chosen[static_cast<size_t>(index[r * k + j])] = 1;
      low = v < low ? v : low;
    }
    float high = -std::numeric_limits<float>::infinity();
    for (int64_t e = 0; e < E; ++e) {
      if (xr[e] != xr[e]) return false;
      if (!chosen[static_cast<size_t>(e)]) high = xr[e] > high ? xr[e] : high;
    }
    out[r] = low - high;
  }
  return true;
}

}  // namespace

// The k-th largest of a row is the smallest of the k that top-k chose and the (k+1)-th the
// largest of the rest, whichever of tied values it took: one pass over the row instead of
// sorting it (the margin's top k + 1 by counting, E^2 comparisons a row, took 7 core-ms of a
// step with 64 experts; ATen's topk a little less).
torch::Tensor routing_margins(const torch::Tensor& x, const torch::Tensor& index) {
  const int64_t k = index.size(1);
  TORCH_CHECK(x.dim() == 2 && index.dim() == 2 && index.scalar_type() == torch::kLong &&
                  index.size(0) == x.size(0) && k >= 1 && k < x.size(1),
              "routing_margins: x [N, E] and int64 index [N, k], 1 <= k < E");
  if (x.scalar_type() == torch::kFloat32) {
    const torch::Tensor in = x.contiguous(), chosen = index.contiguous();
    torch::Tensor out = torch::empty({x.size(0)}, x.options());
    if (margin_rows(in.data_ptr<float>(), chosen.data_ptr<int64_t>(), out.data_ptr<float>(),
                    x.size(0), x.size(1), k))
      return out;
  }
  const torch::Tensor top = std::get<0>(torch::topk(x, k + 1, -1));  // [N, k+1]
  return top.select(1, k - 1) - top.select(1, k);
}

MOEFeedForwardImpl::MOEFeedForwardImpl(const MoEOptions& options)
    : opt_(options),
      num_experts_(options.num_experts),
      top_k_(options.top_k),
      experts_node_(minimind::experts_node(options.products)) {
  if (opt_.learned_router()) {
    gate = register_module("gate", linear_no_bias(opt_.hidden_size, num_experts_));
    if (opt_.hash_layer) {
      tid2eid_ = gate->register_buffer(
          "tid2eid", hash_routing_table(opt_.hash_table, opt_.vocab_size, num_experts_, top_k_));
    } else if (opt_.balancing.selection_bias()) {
      bias_ = gate->register_buffer("e_score_correction_bias", torch::zeros({num_experts_}));
    }
  }
  TORCH_CHECK(opt_.shard.whole(), "a MoE layer is built whole (keep_expert_shard shards it)");
  experts = register_module("experts", std::make_shared<torch::nn::Module>());
  for (int64_t e = 0; e < num_experts_; ++e) {
    expert_list_.emplace_back(opt_.hidden_size, opt_.expert_ffn_size, opt_.products);
    experts->register_module(std::to_string(e), expert_list_.back());
  }
  if (opt_.shared_experts > 0) {
    shared_experts = register_module("shared_experts", torch::nn::ModuleList());
    for (int64_t s = 0; s < opt_.shared_experts; ++s) {
      shared_list_.emplace_back(opt_.hidden_size, opt_.shared_ffn_size, opt_.products);
      shared_experts->push_back(shared_list_.back());
    }
  }
}

void MOEFeedForwardImpl::keep_expert_shard(ExpertExchange& exchange) {
  const ExpertShard shard{exchange.index(), exchange.size()};
  TORCH_CHECK(opt_.shard.whole() && !exchange_, "expert parallelism applied twice: this layer ",
              "already holds shard ", opt_.shard.index, " of ", opt_.shard.count);
  TORCH_CHECK(shard.count >= 1 && num_experts_ % shard.count == 0 && shard.index >= 0 &&
                  shard.index < shard.count,
              "expert parallelism over ", shard.count, " ranks (this one number ", shard.index,
              ") cannot split ", num_experts_, " experts evenly");
  std::vector<FeedForward> kept;
  for (int64_t e = 0; e < num_experts_; ++e) {
    if (shard.holds(e, num_experts_))
      kept.push_back(expert_list_[static_cast<size_t>(e)]);
    else
      experts->unregister_module(std::to_string(e));
  }
  expert_list_ = std::move(kept);
  opt_.shard = shard;
  exchange_ = &exchange;
}

FeedForward MOEFeedForwardImpl::expert(int64_t e) const {
  TORCH_CHECK(opt_.shard.holds(e, num_experts_), "expert ", e, " is held by another rank");
  return expert_list_.at(static_cast<size_t>(e - opt_.shard.first(num_experts_)));
}

MOEFeedForwardImpl::Routing MOEFeedForwardImpl::route(const torch::Tensor& x_flat,
                                                      const torch::Tensor& token_ids, bool stats) {
  const int64_t N = x_flat.size(0);
  Routing r;
  if (opt_.router == RouterKind::random) {  // uniform k-subset per token, from torch's generator
    r.index = std::get<1>(torch::topk(torch::rand({N, num_experts_}), top_k_, -1));  // [N, k]
    r.weight = torch::full({N, top_k_}, 1.0 / static_cast<double>(top_k_), x_flat.options());
    return r;
  }
  if (opt_.router == RouterKind::hash) {  // Roller et al.: expert = token id mod E
    TORCH_CHECK(token_ids.defined(), "the hash router needs the token ids");
    r.index = token_ids.remainder(num_experts_).unsqueeze(1);  // [N, 1]
    r.weight = torch::ones({N, 1}, x_flat.options());
    return r;
  }
  // fp32 whatever the run's precision: the routing decisions (top-k of near-equal scores) and
  // the aux losses' probabilities must not move with bf16's rounding.
  r.logits = project(x_flat, gate->weight, opt_.products.in_fp32());  // [N, E]
  torch::Tensor scores;
  if (opt_.scoring != ScoringFunc::softmax) {
    // Independent affinities: DeepSeek-V3's sigmoid, or V4's sqrt(softplus(logit)).
    scores = opt_.scoring == ScoringFunc::sigmoid ? torch::sigmoid(r.logits)
                                                  : torch::softplus(r.logits).sqrt();  // [N, E]
    r.probs = scores / scores.sum(-1, /*keepdim=*/true);  // [N, E] for the aux losses
  } else {
    scores = r.probs = torch::softmax(r.logits, -1);  // [N, E]
  }
  if (!tid2eid_.defined() && stats)
    r.chosen_by = bias_.defined() ? scores.detach() + bias_ : scores.detach();
  if (tid2eid_.defined()) {
    // A hash-routed layer: the table chooses, the gate's scores weigh.
    TORCH_CHECK(token_ids.defined(), "a hash-routed layer needs the token ids");
    r.index = tid2eid_.index_select(0, token_ids);  // [N, k]
    r.weight = scores.gather(1, r.index);           // [N, k]
  } else if (bias_.defined() && opt_.balancing.quantile() && is_training()) {
    // Quantile balancing: the (k+1)-th of score + bias is each token's cutoff, and
    // cutoff - score the bias each expert would need to be chosen (the step's statistic).
    const torch::Tensor s = scores.detach();
    auto [top, top_index] = torch::topk(s + bias_, top_k_ + 1, -1, true, true);  // [N, k+1]
    r.index = top_index.narrow(1, 0, top_k_);                                    // [N, k]
    r.required = top.narrow(1, top_k_, 1) - s;                                   // [N, E]
    r.top = top;                                                                 // the margin's too
    r.weight = scores.gather(1, r.index);  // [N, k] the unbiased scores
  } else if (bias_.defined()) {
    // The bias only chooses; the mixing weight is the unbiased score.
    r.index = std::get<1>(torch::topk(scores.detach() + bias_, top_k_, -1, true, false));
    r.weight = scores.gather(1, r.index);  // [N, k]
  } else {
    std::tie(r.weight, r.index) =
        torch::topk(scores, top_k_, -1, /*largest=*/true, /*sorted=*/false);
  }
  if (opt_.norm_topk_prob) r.weight = r.weight / (r.weight.sum(-1, /*keepdim=*/true) + 1e-20);
  if (opt_.routed_scaling != 1.0) r.weight = r.weight * opt_.routed_scaling;  // [N, k]
  return r;
}

namespace {

// The positions of values [M] (int64 in [0, bins), bins = counts.size(0)) ordered by value,
// ties in position order: a stable sort's indices, found by counting (a few bins, many
// values: torch::sort took ~1 ms a layer for 64 experts top-16).
torch::Tensor stable_order(const torch::Tensor& values, const torch::Tensor& counts) {
  const torch::Tensor v = values.contiguous();
  const int64_t M = v.numel(), bins = counts.size(0);
  std::vector<int64_t> next(static_cast<size_t>(bins), 0);
  const int64_t* c = counts.data_ptr<int64_t>();
  for (int64_t b = 1; b < bins; ++b) next[b] = next[b - 1] + c[b - 1];
  torch::Tensor order = torch::empty({M}, torch::kLong);
  const int64_t* in = v.data_ptr<int64_t>();
  int64_t* out = order.data_ptr<int64_t>();
  for (int64_t i = 0; i < M; ++i) out[next[static_cast<size_t>(in[i])]++] = i;
  return order;
}

}  // namespace

torch::Tensor MOEFeedForwardImpl::run_remote(const torch::Tensor& rows,
                                             const std::vector<int64_t>& counts, int channel,
                                             LayerStats& stats) {
  const int64_t n = opt_.shard.count, E = num_experts_, held = E / n;
  // What each rank of the group sends to each: rows, and per expert how many (the receiver
  // runs each of its experts on one slice).
  std::vector<int64_t> send(static_cast<size_t>(n), 0);
  for (int64_t e = 0; e < E; ++e) send[static_cast<size_t>(e / held)] += counts[e];
  const std::vector<int64_t> even(static_cast<size_t>(n), held);
  const torch::Tensor mine = torch::tensor(counts, torch::kLong);  // [E]
  // [n * held]: rank s sends got[s * held + j] rows for this rank's j-th expert.
  const torch::Tensor got = exchange_->all_to_all(mine, even, even, channel).contiguous();
  const int64_t* g = got.data_ptr<int64_t>();
  std::vector<int64_t> recv(static_cast<size_t>(n), 0), per_expert(static_cast<size_t>(held), 0);
  for (int64_t s = 0; s < n; ++s)
    for (int64_t j = 0; j < held; ++j) {
      recv[static_cast<size_t>(s)] += g[s * held + j];
      per_expert[static_cast<size_t>(j)] += g[s * held + j];
    }
  stats.exchange.emplace(static_cast<size_t>(n * n), 0.0);
  for (int64_t d = 0; d < n; ++d)
    (*stats.exchange)[static_cast<size_t>(opt_.shard.index * n + d)] =
        static_cast<double>(send[static_cast<size_t>(d)]);
  const torch::Tensor received = exchange_rows(*exchange_, rows, send, recv, channel);  // [R, H]
  const int64_t R = received.size(0);
  // The received rows come by source, then by expert; each expert's rows, source by source,
  // are its slice. Those positions are the gather list routed_experts takes, and with unit
  // weights it puts each row's expert output back in that row's place: [R, H] by source.
  // (Source by source is the order a single process holding every rank's rows would give.)
  std::vector<int64_t> start(static_cast<size_t>(n * held), 0);  // of (source, expert) blocks
  int64_t at = 0;
  for (int64_t s = 0; s < n; ++s)
    for (int64_t j = 0; j < held; ++j) {
      start[static_cast<size_t>(s * held + j)] = at;
      at += g[s * held + j];
    }
  torch::Tensor order = torch::empty({R}, torch::kLong);  // [R]
  int64_t* o = order.data_ptr<int64_t>();
  for (int64_t j = 0; j < held; ++j)
    for (int64_t s = 0; s < n; ++s)
      for (int64_t i = 0; i < g[s * held + j]; ++i)
        *o++ = start[static_cast<size_t>(s * held + j)] + i;
  torch::Tensor out;  // [R, H]
  if (R > 0) {
    out = routed_experts(received, order, torch::ones({R}, received.options()), per_expert,
                         expert_list_, experts_node_, opt_.products);
  } else {
    out = received;
    // No rows for any expert here: they still join the graph with zero gradients (as
    // MiniMind's idle experts do), so every rank's parameters get a gradient.
    if (is_training() && c10::GradMode::is_enabled())
      for (const auto& p : experts->parameters()) out = out + 0 * p.sum();
  }
  return exchange_rows(*exchange_, out, recv, send, channel);  // [M, H] back to the senders
}

torch::Tensor MOEFeedForwardImpl::dispatch(const torch::Tensor& x_flat, const Routing& r,
                                           MoEStats& out, torch::Tensor& chosen_counts,
                                           int channel) {
  const StepScope part(StepPart::dispatch);
  const int64_t N = x_flat.size(0);
  const torch::Tensor& weight = r.weight;  // [N, k]
  const torch::Tensor& index = r.index;    // [N, k]
  // One token outside training (a generated token): its k experts run directly, without
  // the sort and scatter below; added in ascending expert order as index_add does.
  if (N == 1 && !is_training() && opt_.balancing.dropless() && !exchange_) {
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
  if (!opt_.balancing.dropless()) {
    out.keep = capacity_keep(opt_.balancing, index, weight, num_experts_);
    flat_index = flat_index.masked_fill(out.keep.reshape({-1}).logical_not(), num_experts_);
  }
  const int64_t bins = num_experts_ + (out.keep.defined() ? 1 : 0);
  torch::Tensor counts = torch::bincount(flat_index, {}, bins);  // [E] (+1: dropped)
  // The dispatch counts are the router's choices when nothing is dropped.
  chosen_counts =
      out.keep.defined() ? torch::bincount(index.reshape({-1}), {}, num_experts_) : counts;  // [E]
  torch::Tensor order = stable_order(flat_index, counts);  // [N*k]
  const int64_t kept =
      flat_index.size(0) - (out.keep.defined() ? counts[num_experts_].item<int64_t>() : 0);
  if (kept < flat_index.size(0)) order = order.narrow(0, 0, kept);
  if (kept == 0 && !exchange_) {  // every assignment dropped
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
  if (exchange_) {
    // The weighted sum as routed_experts forms it: each product rounded, then added into
    // zeros in assignment order (ascending expert for each token).
    const torch::Tensor ys =
        run_remote(x_flat.index_select(0, token), rows, channel, out.stats);  // [kept, H]
    return torch::zeros_like(x_flat).index_add(
        0, token, ys * w_sorted.to(x_flat.scalar_type()).unsqueeze(1));  // [N, H]
  }
  torch::Tensor y = routed_experts(x_flat, token, w_sorted.to(x_flat.scalar_type()), rows,
                                   expert_list_, experts_node_, opt_.products);  // [N, H]
  return y;
}

MoEOutput MOEFeedForwardImpl::forward(const torch::Tensor& x, const torch::Tensor& real,
                                      const torch::Tensor& token_ids, bool stats,
                                      const BatchShard* shard) {
  const StepScope part(StepPart::routing);  // all but the experts' work (dispatch)
  const BalancingOptions& b = opt_.balancing;
  TORCH_CHECK(!shard || (b.dropless() && opt_.router != RouterKind::random),
              "a micro-batch in shards needs a dropless MoE without the random router");
  const int64_t H = x.size(-1);
  torch::Tensor x_flat = x.reshape({-1, H});  // [N, H]
  const Routing r = route(x_flat, token_ids, stats);
  const torch::Tensor& index = r.index;  // [N, k]
  MoEOutput out;
  MoEStats& st = out.stats;
  st.index = index;

  // The router's choices per expert over all N tokens, before any dropping.
  torch::Tensor chosen_counts;                                                         // [E]
  torch::Tensor y = dispatch(x_flat, r, st, chosen_counts, shard ? shard->index : 0);  // [N, H]
  const torch::Tensor chosen = index.reshape({-1});                                    // [N*k]
  for (auto& shared : shared_list_) y = y + shared(x_flat);  // always on, no gate

  // Losses: only in training, only the learned router has scores.
  const bool train_router = is_training() && opt_.learned_router();
  // A hash-routed layer's choice is fixed: no balancing loss (it could only reshape the
  // weights); its logits still get the z-loss.
  const bool balance = train_router && !opt_.hash_layer;
  const torch::Tensor zero = torch::zeros({}, x.options());
  out.aux_loss = out.z_loss = zero;
  if (balance && b.aux_coef > 0) {
    if (b.aux_scope == AuxScope::global) {
      st.route_counts = chosen_counts.to(torch::kFloat64);
      st.probs_mean = shard ? r.probs.sum(0) / static_cast<double>(shard->tokens)
                            : r.probs.mean(0);  // [E] (a shard: its part of the mean)
    } else {
      out.aux_loss = aux_loss(b, index, r.probs, x.size(0), num_experts_, shard);
      st.stats.aux = out.aux_loss.item<double>();
    }
  }
  if (balance && b.importance_coef > 0) {  // trained with the aux loss, logged apart
    const torch::Tensor imp =
        importance_loss(b.importance_coef, r.weight, index, num_experts_, shard);
    out.aux_loss = out.aux_loss + imp;
    st.stats.importance = imp.item<double>() / b.importance_coef;
  }
  if (r.logits.defined() && (stats || train_router)) {
    const bool z_trains = train_router && b.z_coef > 0;
    // Logged only: keep it out of the graph.
    const c10::AutoGradMode grad_mode(z_trains && c10::GradMode::is_enabled());
    torch::Tensor lse2 = torch::logsumexp(r.logits, -1).pow(2);  // [N]
    torch::Tensor z = shard ? lse2.sum() / static_cast<double>(shard->tokens) : lse2.mean();
    if (z_trains) out.z_loss = z * b.z_coef;
    st.stats.z = z.item<double>();
  }

  // Load statistics over real tokens only, before dropping.
  torch::Tensor real_slots;  // [N*k] bool
  if (real.defined()) real_slots = real.unsqueeze(1).expand_as(index).reshape({-1});
  st.counts = real_slots.defined()
                  ? torch::bincount(chosen.masked_select(real_slots), {}, num_experts_)
                  : chosen_counts;
  if (r.probs.defined() && stats) {
    torch::NoGradGuard no_grad;
    st.probs = r.probs.detach();
    torch::Tensor p = st.probs.to(torch::kFloat64);              // [N, E]
    torch::Tensor entropy = -torch::xlogy(p, p).sum(1);          // [N] nats
    torch::Tensor confidence = p.gather(1, index).sum(1);        // [N] mass on the chosen
    torch::Tensor w = real.defined() ? real.to(torch::kFloat64)  // [N] 1 for real tokens
                                     : torch::ones({p.size(0)}, p.options());
    st.router_sums = torch::cat({torch::matmul(w, p), (entropy * w).sum().view(1),
                                 (confidence * w).sum().view(1), w.sum().view(1)});  // [E + 3]
  }
  if (r.chosen_by.defined() && stats && top_k_ < num_experts_) {
    // The routing margin: k-th minus (k+1)-th of what top-k chose by, over real tokens (a
    // shard: its share of the micro-batch's mean, as the shards' add up to it).
    torch::NoGradGuard no_grad;
    // r.index holds the top k of r.chosen_by (the same values top-k ran on); quantile
    // balancing sorted the top k + 1 already.
    torch::Tensor margin = (r.top.defined() ? r.top.select(1, top_k_ - 1) - r.top.select(1, top_k_)
                                            : routing_margins(r.chosen_by, index))
                               .to(torch::kFloat64);          // [N]
    if (real.defined()) margin = margin.masked_select(real);  // [n]
    const double sum = margin.sum().item<double>();
    const double small = (margin < kSmallMargin).sum().item<double>();
    // The micro-batch's real tokens: counted before the shards split it, so that this
    // statistic needs no meeting of the shards in every layer.
    const auto total = static_cast<double>(shard ? shard->real_tokens : margin.numel());
    st.stats.margin = total > 0 ? sum / total : 0.0;
    st.stats.margin_small = total > 0 ? small / total : 0.0;
  }
  if (r.required.defined()) {  // quantile balancing's statistic of the real tokens
    const torch::Tensor required =
        real.defined() ? r.required.index_select(0, real.nonzero().view({-1})) : r.required;
    st.qb = b.qb_estimator == QbEstimator::exact
                ? required.contiguous()
                : quantile_histogram(required, bias_, b.qb_bins);  // [E, B]
  }
  if (st.keep.defined()) {
    torch::Tensor dropped = st.keep.reshape({-1}).logical_not();
    if (real_slots.defined()) dropped = dropped.logical_and(real_slots);
    st.stats.dropped = dropped.sum().item<int64_t>();
  }
  if (is_training())  // a training statistic: two syncs per layer, not paid in eval
    st.stats.seq_max_vio = sequence_max_vio(index, real, x.size(0), num_experts_);
  out.y = y.view(x.sizes());
  return out;
}

void MOEFeedForwardImpl::update_bias(const std::vector<int64_t>& step_counts,
                                     const torch::Tensor& qb) {
  if (!bias_.defined()) return;
  if (opt_.balancing.quantile()) {
    if (qb.defined()) update_quantile_bias(bias_, qb, opt_.balancing, top_k_);
  } else {
    update_selection_bias(bias_, step_counts, opt_.balancing.bias_rate);
  }
}

}  // namespace minimind
