#include "minimind/train/train_step.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "minimind/train/optim.h"
#include "minimind/util/stopwatch.h"

namespace minimind {
namespace {

// Adds `from` to `into` elementwise, growing `into` to its size.
template <class T>
void accumulate(std::vector<T>& into, const std::vector<T>& from) {
  into.resize(from.size(), T{});
  for (size_t i = 0; i < from.size(); ++i) into[i] += from[i];
}

// Means of the losses, sums of counts, dropped assignments and tokens, and the maximum
// of the sequence spread over the ranks (three small all-reduces).
void reduce_stats(StepStats& s, Distributed& dist) {
  std::vector<double> means{s.lm_loss, s.aux_loss, s.z_loss};  // [3 + 2 x MoE layers]
  means.insert(means.end(), s.layer_aux.begin(), s.layer_aux.end());
  means.insert(means.end(), s.layer_z.begin(), s.layer_z.end());
  dist.all_reduce_sum(means);
  const double world = dist.world_size();
  for (double& m : means) m /= world;
  s.lm_loss = means[0], s.aux_loss = means[1], s.z_loss = means[2];
  std::copy_n(means.begin() + 3, s.layer_aux.size(), s.layer_aux.begin());
  std::copy_n(means.begin() + 3 + static_cast<long>(s.layer_aux.size()), s.layer_z.size(),
              s.layer_z.begin());
  std::vector<int64_t> totals{s.tokens};
  totals.insert(totals.end(), s.layer_dropped.begin(), s.layer_dropped.end());
  sum_over_ranks(s.counts, totals, dist);
  s.tokens = totals[0];
  std::copy(totals.begin() + 1, totals.end(), s.layer_dropped.begin());
  if (!s.layer_seq_max_vio.empty()) {
    torch::Tensor spread = torch::tensor(s.layer_seq_max_vio, torch::kFloat64);  // [L]
    dist.all_reduce_max(spread);
    s.layer_seq_max_vio.assign(spread.data_ptr<double>(),
                               spread.data_ptr<double>() + spread.numel());
  }
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
  // Before backward of this micro-batch; `balance` is its (aux + z) / A.
  void add(const torch::Tensor& balance) {
    if (gates_.empty() || !balance.requires_grad()) return;
    const Stopwatch clock;
    auto g = torch::autograd::grad({balance}, gates_, {}, /*retain_graph=*/true,
                                   /*create_graph=*/false, /*allow_unused=*/true);
    if (sums_.empty()) sums_.resize(gates_.size());
    for (size_t l = 0; l < g.size(); ++l)
      if (g[l].defined()) sums_[l] = sums_[l].defined() ? sums_[l] + g[l] : g[l];
    seconds_ += clock.seconds();
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
      s.layer_grad_balance.push_back(balance.norm().item<double>());
      s.layer_grad_lm.push_back((total - balance).norm().item<double>());
    }
    s.router_grad_seconds = seconds_ + clock.seconds();
  }

 private:
  std::vector<torch::Tensor> gates_;  // [E, H] per MoE layer
  std::vector<torch::Tensor> sums_;
  double seconds_ = 0;
};

}  // namespace

StepStats optimizer_step(MiniMindForCausalLM& model, torch::optim::Optimizer& optimizer,
                         const std::function<Batch()>& next_batch, int64_t accumulation_steps,
                         double grad_clip, double lr, Distributed* dist, bool router_grads) {
  for (auto& group : optimizer.param_groups())
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  StepStats s;
  const double A = static_cast<double>(accumulation_steps);
  // The global aux scope counts over every micro-batch of this step on every rank.
  StepRouting routing;
  if (dist && dist->world_size() > 1)
    routing.sum_over_ranks = [dist](torch::Tensor& t) { dist->all_reduce_sum(t); };
  std::optional<RouterGradProbe> probe;
  if (router_grads) probe.emplace(model);
  for (int64_t micro = 0; micro < accumulation_steps; ++micro) {
    Batch batch = next_batch();
    ForwardOutput out = model(batch.input_ids, batch.labels, nullptr, &routing);
    if (probe) probe->add((out.aux_loss + out.z_loss) / A);
    ((out.loss + out.aux_loss + out.z_loss) / A).backward();
    s.lm_loss += out.loss.item<double>() / A;
    s.aux_loss += out.aux_loss.item<double>() / A;
    s.z_loss += out.z_loss.item<double>() / A;
    std::vector<double> aux, z, spread;
    std::vector<int64_t> dropped;
    for (const auto& t : out.layer_aux) aux.push_back(t.item<double>() / A);
    for (const auto& t : out.layer_z) z.push_back(t.item<double>() / A);
    for (const auto& t : out.layer_dropped) dropped.push_back(t.item<int64_t>());
    accumulate(s.layer_aux, aux);
    accumulate(s.layer_z, z);
    add_counts(s.layer_dropped, dropped);
    s.layer_seq_max_vio.resize(out.layer_seq_max_vio.size(), 0.0);
    for (size_t l = 0; l < out.layer_seq_max_vio.size(); ++l)
      s.layer_seq_max_vio[l] = std::max(s.layer_seq_max_vio[l], out.layer_seq_max_vio[l]);
    s.counts.add(out.expert_counts);
    s.counts.add_router(out.layer_router);
    s.tokens += batch.input_ids.numel();
  }
  std::vector<torch::Tensor> params;
  for (auto& group : optimizer.param_groups())
    for (auto& p : group.params()) params.push_back(p);
  fill_missing_gradients(params);
  if (dist && dist->world_size() > 1) {
    const double before = dist->comm_seconds();
    dist->average_gradients(params);
    reduce_stats(s, *dist);
    s.comm_seconds = dist->comm_seconds() - before;
  }
  if (probe) probe->split(s, dist);
  s.loss = s.lm_loss + s.aux_loss + s.z_loss;
  s.grad_norm = clip_gradients(params, grad_clip);
  s.finite = std::isfinite(s.loss) && std::isfinite(s.grad_norm);
  if (s.finite) {
    optimizer.step();
    // Aux-loss-free balancing: the bias follows this step's counts (every rank has the
    // same sums, so the same bias).
    model->update_router_bias(s.counts.layers);
  }
  clear_gradients(params);
  for (const auto& b : model->router_biases()) s.layer_bias.push_back(to_doubles(b));
  return s;
}

}  // namespace minimind
