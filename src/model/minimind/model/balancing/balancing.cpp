#include "minimind/model/balancing/balancing.h"

#include <cmath>

#include "minimind/model/balancing/global_aux_scope.h"

namespace minimind {

torch::Tensor aux_loss(const BalancingOptions& b, const torch::Tensor& index,
                       const torch::Tensor& probs, int64_t rows, int64_t num_experts,
                       const BatchShard* shard) {
  const int64_t k = index.size(1);
  const auto E = static_cast<double>(num_experts);
  if (b.aux_scope == AuxScope::sequence) {
    // MiniMind2 seq_aux / DeepSeek-V3: ce[b,e] = count of b's (t, slot) on e / (S*k/E).
    const int64_t S = index.size(0) / rows;
    torch::Tensor ce = torch::zeros({rows, num_experts}, probs.options());  // [B, E]
    ce.scatter_add_(1, index.reshape({rows, S * k}), torch::ones({rows, S * k}, probs.options()));
    ce.div_(static_cast<double>(S * k) / E);
    torch::Tensor p = probs.view({rows, S, num_experts}).mean(1);  // [B, E]
    torch::Tensor per_row = (ce * p).sum(1);                       // [B]
    // A shard's rows are whole sequences: its part of the mean over all rows.
    return (shard ? per_row.sum() / static_cast<double>(shard->rows) : per_row.mean()) * b.aux_coef;
  }
  TORCH_CHECK(b.aux_scope == AuxScope::batch, "the global aux scope is GlobalAuxScope's");
  // load[j][e] = share of tokens whose slot j chose e: counted with bincount over j*E + e
  // (the same integers and division as one_hot(...).mean(0), without the [N, k, E] tensor).
  // A shard: the shares over the whole micro-batch (counts summed over the shards), times
  // this shard's part of the mean score.
  const int64_t N = shard ? shard->tokens : index.size(0);
  torch::Tensor slot_expert = index + torch::arange(k, index.options()) * num_experts;
  torch::Tensor counts = torch::bincount(slot_expert.reshape({-1}), {}, k * num_experts);  // [k*E]
  if (shard) shard->sum(counts);
  torch::Tensor load =
      counts.view({k, num_experts}).to(torch::kFloat32) / static_cast<double>(N);  // [k, E]
  torch::Tensor mean_probs = shard ? probs.sum(0) / static_cast<double>(N) : probs.mean(0);  // [E]
  return (load * mean_probs).sum() * E * b.aux_coef;
}

namespace {

// tensor2tensor's CVSquared: population variance / (mean² + 1e-10), with 1e-10 on the count.
torch::Tensor cv_squared(const torch::Tensor& x) {
  const double n = static_cast<double>(x.numel()) + 1e-10;
  const torch::Tensor mean = x.sum() / n;
  return ((x - mean).pow(2).sum() / n) / (mean.pow(2) + 1e-10);
}

}  // namespace

torch::Tensor importance_loss(double coef, const torch::Tensor& weight, const torch::Tensor& index,
                              int64_t num_experts, const BatchShard* shard) {
  torch::Tensor importance = torch::zeros({num_experts}, weight.options())  // [E]
                                 .index_add(0, index.reshape({-1}), weight.reshape({-1}));
  if (!shard) return cv_squared(importance) * coef;
  // The whole micro-batch's loss f(I), I the shards' sum: each shard returns
  // g . I_s + (f(I) - g . I) / shards with g = df/dI, so the shards' losses add up to f(I)
  // and their gradients to f's.
  torch::Tensor total = importance.detach().clone();
  shard->sum(total);
  torch::Tensor leaf = total.clone().requires_grad_(true);
  torch::Tensor f;
  torch::Tensor g;
  {
    const c10::AutoGradMode on(true);
    f = cv_squared(leaf);
    g = torch::autograd::grad({f}, {leaf})[0];
  }
  const auto shards = static_cast<double>(shard->group->size());
  const torch::Tensor rest = (f.detach() - (g * total).sum()) / shards;
  return ((g * importance).sum() + rest) * coef;
}

torch::Tensor capacity_keep(const BalancingOptions& b, const torch::Tensor& index,
                            const torch::Tensor& weight, int64_t num_experts) {
  const int64_t N = index.size(0), k = index.size(1), E = num_experts;
  const auto capacity = static_cast<int64_t>(
      std::ceil(b.capacity_factor * static_cast<double>(k * N) / static_cast<double>(E)));
  torch::Tensor flat = index.reshape({-1});  // [N*k] in token order, slots inside a token
  // Rank the assignments inside each expert: "position" keeps token order, "probs" orders
  // by routing weight first (a stable sort, so equal weights keep token order).
  torch::Tensor order;
  if (b.drop_policy == DropPolicy::probs) {
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

void update_selection_bias(torch::Tensor& bias, const std::vector<int64_t>& step_counts,
                           double rate) {
  TORCH_CHECK(static_cast<int64_t>(step_counts.size()) == bias.size(0), "expected ", bias.size(0),
              " counts, got ", step_counts.size());
  torch::NoGradGuard no_grad;
  torch::Tensor c = torch::tensor(step_counts, torch::kInt64).to(torch::kFloat32);  // [E]
  bias.add_(torch::sign(c.mean() - c) * rate);
}

namespace {
// 0-dim float32 lower edge and bin width of the histogram for `bias` (torchtitan: the
// "Appendix D" range [min b - 1, max b + 1] in `bins` equal bins).
std::pair<torch::Tensor, torch::Tensor> quantile_range(const torch::Tensor& bias, int64_t bins) {
  const torch::Tensor lo = bias.min(), hi = bias.max();
  return {lo - 1, (hi - lo + 2) / static_cast<double>(bins)};
}
}  // namespace

torch::Tensor quantile_histogram(const torch::Tensor& required, const torch::Tensor& bias,
                                 int64_t bins) {
  torch::NoGradGuard no_grad;
  const int64_t E = required.size(1);
  const auto [lower, width] = quantile_range(bias, bins);
  torch::Tensor bin =
      torch::floor((required - lower) / width).clamp(0, static_cast<double>(bins - 1));  // [n, E]
  torch::Tensor flat = (bin.to(torch::kLong) + torch::arange(E).mul(bins)).reshape({-1});
  return torch::bincount(flat, {}, E * bins).view({E, bins});  // [E, bins]
}

double quantile_bin_width(const torch::Tensor& bias, int64_t bins) {
  return quantile_range(bias, bins).second.item<double>();
}

torch::Tensor quantile_bias_from_histogram(const torch::Tensor& histogram, double width,
                                           int64_t k) {
  const int64_t E = histogram.size(0);
  const torch::Tensor h = histogram.to(torch::kLong);                       // [E, B]
  const torch::Tensor n = h.sum(1);                                         // [E] tokens seen
  const torch::Tensor target = n.to(torch::kFloat64) * k / E;               // [E] balanced share
  const torch::Tensor rank = (n * k + E - 1).div(E, "floor").clamp_min(1);  // [E] ceil(target)
  const torch::Tensor cum = h.cumsum(1);                                    // [E, B]
  const torch::Tensor bin = (cum < rank.unsqueeze(1)).sum(1, true);         // [E, 1] crossing bin
  const torch::Tensor in_bin = h.gather(1, bin).squeeze(1);                 // [E]
  const torch::Tensor before = cum.gather(1, bin).squeeze(1) - in_bin;      // [E]
  const torch::Tensor fraction =
      ((target - before.to(torch::kFloat64)) / in_bin.to(torch::kFloat64)).clamp(0, 1);
  const torch::Tensor position = bin.squeeze(1).to(torch::kFloat64) + fraction;  // [E] in bins
  return (position - position.mean()) * width;  // the lower edge cancels in the centring
}

torch::Tensor quantile_bias_exact(const torch::Tensor& required, int64_t k) {
  const int64_t N = required.size(0), E = required.size(1);
  const int64_t rank = std::max<int64_t>((N * k + E - 1) / E, 1);  // ceil(N*k/E)
  // A selection per expert, not a sort: each column's rank-th smallest, columns contiguous.
  const torch::Tensor columns = required.t().contiguous();                    // [E, N]
  return std::get<0>(torch::kthvalue(columns, rank, 1)).to(torch::kFloat64);  // [E]
}

void update_quantile_bias(torch::Tensor& bias, const torch::Tensor& stat, const BalancingOptions& b,
                          int64_t k) {
  torch::NoGradGuard no_grad;
  torch::Tensor solved;  // [E] float64
  if (b.qb_estimator == QbEstimator::exact) {
    if (stat.size(0) == 0) return;
    solved = quantile_bias_exact(stat, k);
  } else {
    if (stat.sum().item<int64_t>() == 0) return;
    solved = quantile_bias_from_histogram(stat, quantile_bin_width(bias, b.qb_bins), k);
  }
  torch::Tensor next =
      b.qb_ema > 0 ? bias.to(torch::kFloat64) * b.qb_ema + solved * (1 - b.qb_ema) : solved;
  bias.copy_(next - next.mean());
}

torch::Tensor hash_routing_table(HashTable kind, int64_t vocab, int64_t num_experts, int64_t k) {
  torch::NoGradGuard no_grad;
  if (kind == HashTable::random)
    return std::get<1>(torch::topk(torch::rand({vocab, num_experts}), k, -1));           // [V, k]
  return (torch::arange(vocab).unsqueeze(1) + torch::arange(k)).remainder(num_experts);  // [V, k]
}

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

GlobalAuxScope::GlobalAuxScope(const ModelConfig& cfg,
                               std::function<void(torch::Tensor&)> sum_over_ranks)
    : num_experts_(cfg.num_experts),
      coef_(cfg.router_aux_loss_coef),
      sum_over_ranks_(std::move(sum_over_ranks)) {}

void GlobalAuxScope::add_to(ForwardOutput& out, int64_t tokens, const BatchShard* shard) {
  // [E] float64 per MoE layer with a learned choice (hash-routed layers have no aux loss)
  std::vector<torch::Tensor> route_counts;
  std::vector<size_t> layer;  // the MoE layer of each
  for (size_t l = 0; l < out.moe.size(); ++l)
    if (out.moe[l].route_counts.defined()) {
      route_counts.push_back(out.moe[l].route_counts);
      layer.push_back(l);
    }
  if (route_counts.empty()) return;  // not the global scope, not training, or coef 0
  torch::Tensor local =
      torch::cat({torch::stack(route_counts).reshape({-1}),
                  torch::full({1}, static_cast<double>(tokens), torch::kFloat64)});  // [L*E + 1]
  if (shard) {
    shard->sum(local, sum_over_ranks_);
  } else if (sum_over_ranks_) {
    sum_over_ranks_(local);
  }
  const auto L = static_cast<int64_t>(route_counts.size());
  torch::Tensor counts = local.narrow(0, 0, L * num_experts_).view({L, num_experts_});  // [L, E]
  counts_ = counts_.defined() ? counts_ + counts : counts;
  tokens_ += local[L * num_experts_].item<double>();
  torch::Tensor f = (counts_ / tokens_).to(torch::kFloat32);  // [L, E]
  for (int64_t l = 0; l < L; ++l) {
    MoEStats& m = out.moe[layer[static_cast<size_t>(l)]];
    torch::Tensor aux =
        (f[l] * m.probs_mean).sum() * static_cast<double>(num_experts_) * coef_;  // []
    out.aux_loss = out.aux_loss + aux;
    m.stats.aux = aux.item<double>();
  }
}

}  // namespace minimind
