#include "minimind/train/train_step.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>

#include "minimind/model/balancing/global_aux_scope.h"
#include "minimind/train/optim.h"
#include "minimind/util/blas_tasks.h"
#include "minimind/util/side_by_side.h"
#include "minimind/util/step_part.h"
#include "minimind/util/stopwatch.h"

namespace minimind {
namespace {

// Means of the losses, sums of counts, dropped assignments and tokens, and the maxima over
// the ranks, as each LayerStats field combines (small all-reduces, one per kind).
void reduce_stats(StepStats& s, Distributed& dist) {
  std::vector<double> means{s.lm_loss, s.aux_loss, s.z_loss}, sums, maxima;
  std::vector<int64_t> totals{s.tokens, s.real_tokens};
  // Gathers (put = false) or puts back each layer's fields in one order, each into the
  // vector of its kind; `last` fields are alike on every rank.
  auto walk = [&](bool put) {
    size_t at_mean = 3, at_sum = 0, at_max = 0, at_total = 2;
    auto move = [put](auto& x, auto& values, size_t& at) {
      if (put) {
        x = values[at++];
      } else {
        values.push_back(x);
      }
    };
    for (LayerStats& l : s.layers)
      LayerStats::fields(
          [&](const char* name, Combine how, Logged, auto& v) {
            using T = std::decay_t<decltype(v)>;
            auto one = [&](auto& x) {
              using V = std::decay_t<decltype(x)>;
              if (how == Combine::last) return;
              if constexpr (std::is_integral_v<V>) {
                TORCH_CHECK(how == Combine::sum, "LayerStats::", name, ": counts only add up");
                move(x, totals, at_total);
              } else if constexpr (std::is_floating_point_v<V>) {
                if (how == Combine::mean) move(x, means, at_mean);
                if (how == Combine::sum || how == Combine::per_step) move(x, sums, at_sum);
                if (how == Combine::max) move(x, maxima, at_max);
              } else {  // a vector of doubles: each element adds up over the ranks
                TORCH_CHECK(how == Combine::sum || how == Combine::per_step, "LayerStats::", name,
                            ": vectors only add up over ranks");
                for (auto& e : x) move(e, sums, at_sum);
              }
            };
            if constexpr (layer_stats::is_optional<T>::value) {
              if (v) one(*v);
            } else {
              one(v);
            }
          },
          l);
  };
  walk(false);
  dist.all_reduce_sum(means);
  const double world = dist.world_size();
  for (double& m : means) m /= world;
  if (!sums.empty()) dist.all_reduce_sum(sums);
  sum_over_ranks(s.counts, totals, dist);
  if (!maxima.empty()) {
    torch::Tensor spread = torch::tensor(maxima, torch::kFloat64);  // [fields]
    dist.all_reduce_max(spread);
    maxima.assign(spread.data_ptr<double>(), spread.data_ptr<double>() + spread.numel());
  }
  s.lm_loss = means[0], s.aux_loss = means[1], s.z_loss = means[2];
  s.tokens = totals[0], s.real_tokens = totals[1];
  walk(true);
}

std::vector<double> to_doubles(const torch::Tensor& t) {
  torch::Tensor d = t.detach().to(torch::kFloat64).contiguous();
  return {d.data_ptr<double>(), d.data_ptr<double>() + d.numel()};
}

// The router weights' gradient from the balancing losses alone, summed over the step's
// micro-batches: the total derivative, which also runs through the residual stream (a
// deeper layer's aux loss depends on an earlier router), hence a sixth of a step at log
// steps. The LM part is what the full backward adds on top (split).
class RouterGradProbe {
 public:
  explicit RouterGradProbe(const MiniMindForCausalLM& model) : gates_(model->router_weights()) {}
  // Before backward of this micro-batch (or shard); `balance` is its (aux + z) / A. Safe
  // to call from the shards' threads at once (it only reads).
  std::vector<torch::Tensor> grads_of(const torch::Tensor& balance) const {
    if (gates_.empty() || !balance.requires_grad()) return {};
    return torch::autograd::grad({balance}, gates_, {}, /*retain_graph=*/true,
                                 /*create_graph=*/false, /*allow_unused=*/true);
  }
  // Adds those gradients (the shards' in shard order) and what they cost.
  void add(const std::vector<torch::Tensor>& g, double seconds) {
    if (sums_.empty()) sums_.resize(gates_.size());
    for (size_t l = 0; l < g.size(); ++l)
      if (g[l].defined()) sums_[l] = sums_[l].defined() ? sums_[l] + g[l] : g[l];
    seconds_ += seconds;
  }
  void add(const torch::Tensor& balance) {
    const Stopwatch clock;
    const auto g = grads_of(balance);
    add(g, clock.seconds());
  }
  // After the gradients are final (averaged over ranks): the norms per layer.
  void split(StepStats& s, Distributed* dist) {
    const Stopwatch clock;
    for (size_t l = 0; l < gates_.size(); ++l) {
      torch::Tensor total =
          gates_[l].grad().defined() ? gates_[l].grad() : torch::zeros_like(gates_[l]);  // [E, H]
      torch::Tensor balance =
          l < sums_.size() && sums_[l].defined() ? sums_[l] : torch::zeros_like(total);
      if (dist && dist->world_size() > 1) {  // the step's gradient is the mean over ranks
        dist->all_reduce_sum(balance);
        balance = balance / static_cast<double>(dist->world_size());
      }
      LayerStats& layer = s.layers.at(l);
      layer.grad_balance = balance.norm().item<double>();
      layer.grad_lm = (total - balance).norm().item<double>();
    }
    s.router_grad_seconds = seconds_ + clock.seconds();
  }

 private:
  std::vector<torch::Tensor> gates_;  // [E, H] per MoE layer
  std::vector<torch::Tensor> sums_;
  double seconds_ = 0;
};

// Adds one micro-batch's figures to the step's, or one shard's (whose losses are its part
// of the micro-batch's, so the shards' add up to it); `ids` its input ids.
void add_micro_batch(StepStats& s, const ForwardOutput& out, const torch::Tensor& ids, double A) {
  s.lm_loss += out.loss.item<double>() / A;
  s.aux_loss += out.aux_loss.item<double>() / A;
  s.z_loss += out.z_loss.item<double>() / A;
  std::vector<LayerStats> layers;
  for (const MoEStats& m : out.moe) layers.push_back(m.stats);
  layer_stats::add(s.layers, layers, A);
  s.counts.add(out.per_layer(&MoEStats::counts));
  s.counts.add_router(out.per_layer(&MoEStats::router_sums));
  s.tokens += ids.numel();
  s.real_tokens += (ids != 0).sum().item<int64_t>();  // padding is id 0, as the model counts
  if (s.qb.size() < out.moe.size()) s.qb.resize(out.moe.size());
  for (size_t l = 0; l < out.moe.size(); ++l) {
    const torch::Tensor& q = out.moe[l].qb;  // histogram [E, B] or r [n, E]
    if (!q.defined()) continue;
    torch::Tensor& acc = s.qb[l];
    if (!acc.defined())
      acc = q;
    else
      acc = q.scalar_type() == torch::kLong ? acc + q : torch::cat({acc, q});
  }
}

// Quantile balancing's statistics of every rank: histograms summed; the exact estimator's r
// [n, E] of all ranks stacked in rank order (each rank's rows padded to the largest count
// with +inf, which sorts after every real value, and removed again).
void qb_over_ranks(std::vector<torch::Tensor>& qb, Distributed& dist) {
  for (torch::Tensor& q : qb) {
    if (!q.defined()) continue;
    if (q.scalar_type() == torch::kLong) {
      dist.all_reduce_sum(q);
      continue;
    }
    torch::Tensor n = torch::tensor({q.size(0)}, torch::kLong);
    dist.all_reduce_max(n);
    const int64_t rows = n.item<int64_t>(), E = q.size(1), W = dist.world_size();
    torch::Tensor all = torch::zeros({W, rows, E}, torch::kFloat32);  // [W, rows, E]
    torch::Tensor mine = all[dist.rank()];
    mine.fill_(std::numeric_limits<float>::infinity());
    mine.narrow(0, 0, q.size(0)).copy_(q);
    dist.all_reduce_sum(all);
    torch::Tensor flat = all.view({W * rows, E});
    q = flat.index_select(0, torch::isfinite(flat.select(1, 0)).nonzero().view({-1}));
  }
}

// Each micro-batch in `shards` row ranges trained side by side, one core each
// (side_by_side.h). A shard's forward gives its part of the micro-batch's losses
// (BatchShard); its gradient comes back from autograd::grad rather than landing in .grad,
// and the shards' gradients are added in shard order and then onto .grad: the same bits
// run after run, and within float rounding of the unsplit micro-batch (tested).
class ShardedMicroBatches {
 public:
  ShardedMicroBatches(int shards, std::vector<torch::Tensor> params, const GlobalAuxScope& scope)
      : group_(shards), params_(std::move(params)), scopes_(static_cast<size_t>(shards), scope) {
    for (size_t i = 0; i < params_.size(); ++i) order_.push_back(static_cast<int64_t>(i));
    std::stable_sort(order_.begin(), order_.end(), [&](int64_t a, int64_t b) {
      return params_[static_cast<size_t>(a)].numel() > params_[static_cast<size_t>(b)].numel();
    });
  }

  void run(MiniMindForCausalLM& model, const Batch& batch, double A, RouterGradProbe* probe,
           StepStats& s) {
    const int n = group_.size();
    const int64_t B = batch.input_ids.size(0), T = batch.input_ids.size(1);
    TORCH_CHECK(B >= n, "a micro-batch of ", B, " rows cannot make ", n, " shards");
    const int64_t targets = (batch.labels.narrow(1, 1, T - 1) != -100).sum().item<int64_t>();
    const int64_t real_tokens = (batch.input_ids != 0).sum().item<int64_t>();
    struct Part {
      ForwardOutput out;
      std::vector<torch::Tensor> grads, balance;
      torch::Tensor ids;  // [rows, T]
      double forward_seconds = 0, balance_seconds = 0;
    };
    std::vector<Part> parts(static_cast<size_t>(n));
    run_side_by_side(n, group_, [&](int i) {
      const int64_t r0 = B * i / n, rows = B * (i + 1) / n - r0;
      const BatchShard shard{i, &group_, B, B * T, targets, real_tokens};
      Part& p = parts[static_cast<size_t>(i)];
      const Stopwatch clock;
      ForwardOptions fo;
      fo.shard = &shard;
      fo.logits = false;
      if (batch.starts.defined()) fo.starts = batch.starts.narrow(0, r0, rows);
      p.out = model(batch.input_ids.narrow(0, r0, rows), batch.labels.narrow(0, r0, rows), fo);
      scopes_[static_cast<size_t>(i)].add_to(p.out, rows * T, &shard);
      p.forward_seconds = clock.seconds();
      if (probe) {
        const Stopwatch probe_clock;
        p.balance = probe->grads_of((p.out.aux_loss + p.out.z_loss) / A);
        p.balance_seconds = probe_clock.seconds();
      }
      p.grads = torch::autograd::grad({(p.out.loss + p.out.aux_loss + p.out.z_loss) / A}, params_,
                                      {}, /*retain_graph=*/false,
                                      /*create_graph=*/false, /*allow_unused=*/true);
      p.ids = batch.input_ids.narrow(0, r0, rows);
    });
    for (const Part& p : parts) add_micro_batch(s, p.out, p.ids, A);
    s.forward_seconds += parts[0].forward_seconds;
    if (probe)  // the shards measured side by side: the wall time is one shard's
      for (const Part& p : parts) probe->add(p.balance, &p == &parts[0] ? p.balance_seconds : 0);
    // Each parameter's gradient: the shards' in shard order, then onto .grad.
    run_blas_tasks(order_, [&](int64_t j) {
      // The first shard's gradient takes the others' in place when only it holds its
      // buffer (the same sums as out of place, without writing a new [params] buffer).
      torch::Tensor sum;
      for (Part& p : parts) {
        torch::Tensor& g = p.grads[static_cast<size_t>(j)];
        if (!g.defined()) continue;
        if (!sum.defined())
          sum = std::move(g);
        else if (sum.use_count() == 1 && sum.is_contiguous())
          sum.add_(g);
        else
          sum = sum + g;
      }
      if (!sum.defined()) return;
      torch::Tensor& grad = params_[static_cast<size_t>(j)].mutable_grad();
      if (grad.defined()) {
        grad.add_(sum);
      } else {
        grad = sum.is_contiguous() ? sum : sum.contiguous();  // autograd's may be expanded
      }
    });
  }

 private:
  ShardGroup group_;
  std::vector<torch::Tensor> params_;
  std::vector<int64_t> order_;          // parameters, the largest first (run_blas_tasks)
  std::vector<GlobalAuxScope> scopes_;  // one per shard, kept alike
};

// The cosine of every pair of experts from their Gram matrix [E, E], pairs in row order.
void set_expert_similarity(LayerStats& layer, const torch::Tensor& gram) {
  const int64_t E = gram.size(0);
  const torch::Tensor norms = gram.diagonal().clamp_min(0).sqrt();  // [E]
  const torch::Tensor cos = gram / (norms.unsqueeze(1) * norms.unsqueeze(0)).clamp_min(1e-300);
  const auto c = cos.accessor<double, 2>();
  std::vector<double> pairs;
  for (int64_t i = 0; i < E; ++i)
    for (int64_t j = i + 1; j < E; ++j) pairs.push_back(c[i][j]);
  if (pairs.empty()) return;  // one expert
  double sum = 0, largest = pairs[0];
  for (double v : pairs) sum += v, largest = std::max(largest, v);
  layer.expert_similarity_mean = sum / static_cast<double>(pairs.size());
  layer.expert_similarity_max = largest;
  layer.expert_similarity = std::move(pairs);
}

}  // namespace

void RoutingChange::measure(MiniMindForCausalLM& model, std::vector<LayerStats>& layers) {
  torch::NoGradGuard no_grad;
  const bool was_training = model->is_training();
  model->eval();
  ForwardOptions fo;
  fo.head = false;  // only the routers are read
  fo.starts = starts_;
  const ForwardOutput out = model->forward(ids_, torch::Tensor(), fo);
  model->train(was_training);
  const torch::Tensor real = (ids_ != 0).reshape({-1});  // [N] padding is routed, not counted
  std::vector<torch::Tensor> now;
  for (const MoEStats& m : out.moe)
    now.push_back(std::get<0>(torch::sort(m.index.index_select(0, real.nonzero().view({-1})), 1)));
  bool comparable = last_.size() == now.size();
  for (size_t l = 0; comparable && l < now.size(); ++l)
    comparable = last_[l].sizes() == now[l].sizes();
  if (comparable) {
    if (layers.size() < now.size()) layers.resize(now.size());
    for (size_t l = 0; l < now.size(); ++l) {
      const torch::Tensor changed = (now[l] != last_[l]).any(1);  // [n]
      layers[l].routing_change =
          changed.numel() > 0 ? changed.to(torch::kFloat64).mean().item<double>() : 0.0;
    }
  }
  last_ = std::move(now);
}

void RoutingChange::save_state(nlohmann::json& into) const {
  nlohmann::json layers = nlohmann::json::array();
  for (const torch::Tensor& t : last_) {
    const torch::Tensor c = t.contiguous();
    layers.push_back(
        {{"k", c.size(1)},
         {"ids", std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel())}});
  }
  into["routing_probe"] = std::move(layers);
}

void RoutingChange::restore_state(const nlohmann::json& from) {
  if (!from.contains("routing_probe")) return;  // a checkpoint from before: measured afresh
  std::vector<torch::Tensor> last;
  for (const auto& layer : from.at("routing_probe")) {
    const auto ids = layer.at("ids").get<std::vector<int64_t>>();
    const int64_t k = layer.at("k").get<int64_t>();
    if (k <= 0 || ids.size() % static_cast<size_t>(k) != 0) return;
    last.push_back(torch::tensor(ids, torch::kLong).view({-1, k}));  // [n, k]
  }
  last_ = std::move(last);
}

StepStats optimizer_step(MiniMindForCausalLM& model, torch::optim::Optimizer& optimizer,
                         const std::function<Batch()>& next_batch, const StepOptions& o) {
  Distributed* dist = o.parallel.job;
  ExpertParallel* ep = o.parallel.experts;
  for (auto& group : optimizer.param_groups())
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(o.lr);
  StepStats s;
  const double A = static_cast<double>(o.accumulation_steps);
  s.z_loss_on = model->config().use_moe && model->config().router_z_loss_coef > 0;
  // The global aux scope counts over every micro-batch of this step on every rank.
  std::function<void(torch::Tensor&)> sum_over_ranks;
  if (dist && dist->world_size() > 1)
    sum_over_ranks = [dist](torch::Tensor& t) { dist->all_reduce_sum(t); };
  GlobalAuxScope scope(model->config(), sum_over_ranks);
  std::optional<RouterGradProbe> probe;
  if (o.router_grads) probe.emplace(model);
  std::vector<torch::Tensor> params;
  for (auto& group : optimizer.param_groups())
    for (auto& p : group.params()) params.push_back(p);
  std::optional<ShardedMicroBatches> sharded;
  if (o.shards > 1) sharded.emplace(o.shards, params, scope);
  const Stopwatch micro_clock;
  for (int64_t micro = 0; micro < o.accumulation_steps; ++micro) {
    Batch batch = next_batch();
    if (sharded) {
      sharded->run(model, batch, A, probe ? &*probe : nullptr, s);
      continue;
    }
    const Stopwatch forward_clock;
    ForwardOptions fo;
    fo.logits = false;
    fo.starts = batch.starts;
    ForwardOutput out = model(batch.input_ids, batch.labels, fo);
    scope.add_to(out, batch.input_ids.numel());
    s.forward_seconds += forward_clock.seconds();
    if (probe) probe->add((out.aux_loss + out.z_loss) / A);
    ((out.loss + out.aux_loss + out.z_loss) / A).backward();
    add_micro_batch(s, out, batch.input_ids, A);
  }
  s.micro_seconds = micro_clock.seconds();
  fill_missing_gradients(params);
  std::optional<SplitParameters> split;
  if (ep) split = split_parameters(model);
  if (dist && dist->world_size() > 1) {
    const double before = dist->comm_seconds();
    if (split) {
      // The mean over all ranks of each rank's gradient: an expert's arrived summed over the
      // tokens of its expert group, so it is summed over its replicas and divided by all.
      dist->average_gradients(split->replicated);
      ep->replicas().sum_gradients_divided(split->experts, dist->world_size());
    } else {
      dist->average_gradients(params);
    }
    reduce_stats(s, *dist);
    qb_over_ranks(s.qb, *dist);
    s.comm_seconds = dist->comm_seconds() - before;
  }
  if (ep) {
    const ExpertParallel::Traffic t = ep->take_traffic();
    s.exchange_bytes = t.bytes;
    s.exchange_seconds = t.seconds;
  }
  if (probe) probe->split(s, dist);
  s.loss = s.lm_loss + s.aux_loss + s.z_loss;
  {
    const StepScope part(StepPart::optimizer);
    // FusedAdamW takes clipping's scale into its update (one pass over the gradients less).
    auto* fused = dynamic_cast<FusedAdamW*>(&optimizer);
    float scale = 1.0f;
    float* deferred = fused ? &scale : nullptr;
    s.grad_norm = split ? clip_gradients(split->replicated, split->experts, o.grad_clip,
                                         ep->group(), deferred)
                        : clip_gradients(params, o.grad_clip, deferred);
    s.finite = std::isfinite(s.loss) && std::isfinite(s.grad_norm);
    if (s.finite) {
      if (fused)
        fused->step_scaled(scale);
      else
        optimizer.step();
      // Aux-loss-free balancing: the bias follows this step's counts (every rank has the
      // same sums, so the same bias).
      if (o.update_router_bias) model->update_router_bias(s.counts.layers, s.qb);
    }
    clear_gradients(params);
  }
  const auto biases = model->router_biases();
  for (size_t l = 0; l < biases.size(); ++l)
    if (biases[l].defined()) s.layers.at(l).bias = to_doubles(biases[l]);
  if (o.expert_similarity) {
    std::function<void(torch::Tensor&)> over_group;
    if (ep) over_group = [ep](torch::Tensor& t) { ep->group().all_reduce_sum(t); };
    const std::vector<torch::Tensor> grams = model->expert_grams(over_group);
    if (s.layers.size() < grams.size()) s.layers.resize(grams.size());
    for (size_t l = 0; l < grams.size(); ++l) set_expert_similarity(s.layers[l], grams[l]);
  }
  return s;
}

}  // namespace minimind
