#include "minimind/run/expert_parallel.h"

#include <fmt/format.h>

namespace minimind {

ExpertParallel::ExpertParallel(Distributed& job, int n, int channels) : job_(job), n_(n) {
  const int world = job.world_size();
  // The session refuses an N that does not divide the ranks, naming the key.
  TORCH_CHECK(n >= 1 && world % n == 0, "expert groups of ", n, " in ", world, " ranks");
  index_ = job.rank() % n;
  group_id_ = job.rank() / n;
  // Every rank forms its groups in one order: its expert group, once per channel, then its
  // replica group (a rank waits in each for the group's others).
  std::vector<int> group, replicas;
  for (int i = 0; i < n; ++i) group.push_back(group_id_ * n + i);
  for (int g = 0; g < world / n; ++g) replicas.push_back(g * n + index_);
  for (int c = 0; c < channels; ++c)
    channels_.push_back(job.subgroup(fmt::format("experts/{}/{}", group_id_, c), group));
  replicas_ = job.subgroup(fmt::format("replicas/{}", index_), replicas);
}

torch::Tensor ExpertParallel::all_to_all(const torch::Tensor& rows,
                                         const std::vector<int64_t>& send,
                                         const std::vector<int64_t>& recv, int channel) {
  torch::Tensor out = channels_.at(static_cast<size_t>(channel))->all_to_all(rows, send, recv);
  const int64_t row_bytes = rows.size(0) > 0  ? rows.nbytes() / rows.size(0)
                            : out.size(0) > 0 ? out.nbytes() / out.size(0)
                                              : 0;
  int64_t moved = 0;  // rows that crossed to or from another rank
  for (int q = 0; q < n_; ++q)
    if (q != index_) moved += send[static_cast<size_t>(q)] + recv[static_cast<size_t>(q)];
  const std::lock_guard<std::mutex> lock(traffic_mutex_);
  traffic_.bytes += moved * row_bytes;
  return out;
}

ExpertParallel::Traffic ExpertParallel::take_traffic() {
  const std::lock_guard<std::mutex> lock(traffic_mutex_);
  Traffic t = traffic_;
  double seconds = 0;
  for (const auto& c : channels_) seconds += c->comm_seconds();
  seconds /= static_cast<double>(channels_.size());
  t.seconds = seconds - seconds_taken_;
  seconds_taken_ = seconds;
  traffic_.bytes = 0;
  return t;
}

SplitParameters split_parameters(const MiniMindForCausalLM& model) {
  SplitParameters s;
  for (const ParamSlot& p : full_parameters(model)) {
    if (!p.local.defined()) continue;
    (p.expert >= 0 ? s.experts : s.replicated).push_back(p.local);
  }
  return s;
}

std::vector<int64_t> whole_parameter_index(const MiniMindForCausalLM& model, int64_t* count) {
  // The optimizer holds model->parameters(), the whole model's order without other ranks'.
  std::vector<int64_t> index;
  const std::vector<ParamSlot> whole = full_parameters(model);
  for (size_t i = 0; i < whole.size(); ++i)
    if (whole[i].local.defined()) index.push_back(static_cast<int64_t>(i));
  if (count) *count = static_cast<int64_t>(whole.size());
  return index;
}

std::optional<WholeModel> gather_whole_model(const MiniMindForCausalLM& model,
                                             torch::optim::AdamW& optimizer, ExpertParallel& ep) {
  if (!ep.in_first_group()) return std::nullopt;
  torch::NoGradGuard no_grad;
  Distributed& group = ep.group();
  const bool main = group.is_main();
  const std::vector<ParamSlot> whole = full_parameters(model);
  const std::vector<ParamState> states = optimizer_states(optimizer);
  const std::vector<int64_t> place = whole_parameter_index(model, nullptr);
  std::vector<const ParamState*> state_of(whole.size(), nullptr);  // held parameters' states
  for (size_t j = 0; j < place.size(); ++j) state_of[static_cast<size_t>(place[j])] = &states[j];
  // Every rank of the group holds as many expert parameters, of the same shapes, in the same
  // order (layer by layer, expert by expert): the j-th of rank q is the j-th of the experts
  // of shard q in the whole model's order.
  const int64_t E = model->config().num_experts, held = E / ep.size();
  std::vector<std::vector<size_t>> slots_of(static_cast<size_t>(ep.size()));  // whole indices
  for (size_t i = 0; i < whole.size(); ++i) {
    if (whole[i].expert >= 0) slots_of[static_cast<size_t>(whole[i].expert / held)].push_back(i);
  }
  WholeModel out;
  if (main) out.optimizer.resize(whole.size());
  // One tensor at a time (the parameter, then AdamW's two moments), so that no rank holds
  // more than one tensor of the others' beyond what rank 0 keeps to write.
  std::vector<int64_t> steps;
  std::vector<torch::Tensor> kept(3 * whole.size());  // rank 0: others' [param, m, v]
  const std::vector<size_t>& mine = slots_of[static_cast<size_t>(ep.index())];
  for (size_t j = 0; j < mine.size(); ++j) {
    const torch::Tensor& p = whole[mine[j]].local;
    const ParamState* s = state_of[mine[j]];
    const bool has = s && s->step >= 0;
    steps.push_back(has ? s->step : -1);
    const torch::Tensor parts[3] = {p.detach(), has ? s->exp_avg : torch::zeros_like(p),
                                    has ? s->exp_avg_sq : torch::zeros_like(p)};
    for (int k = 0; k < 3; ++k) {
      const torch::Tensor all = group.gather_to_main(parts[k]);  // [N, shape] on rank 0
      if (!main) continue;
      for (int q = 1; q < ep.size(); ++q)
        kept[3 * slots_of[static_cast<size_t>(q)][j] + static_cast<size_t>(k)] = all[q].clone();
    }
  }
  const torch::Tensor step_counts = group.gather_to_main(torch::tensor(steps, torch::kLong));
  if (!main) return std::nullopt;

  for (int q = 1; q < ep.size(); ++q)
    for (size_t j = 0; j < mine.size(); ++j) {
      const size_t i = slots_of[static_cast<size_t>(q)][j];
      const int64_t step = step_counts[q][static_cast<int64_t>(j)].item<int64_t>();
      if (step >= 0) out.optimizer[i] = {step, kept[3 * i + 1], kept[3 * i + 2]};
    }
  for (size_t i = 0; i < whole.size(); ++i) {
    const ParamSlot& p = whole[i];
    if (p.local.defined() && state_of[i]) out.optimizer[i] = *state_of[i];
    out.weights.emplace_back(p.name, p.local.defined() ? p.local : kept[3 * i]);
  }
  // The rest of state_dict: buffers (routers' selection bias) and a tied head's second name.
  const NamedTensors all = state_dict(model);
  for (size_t i = model->parameters().size(); i < all.size(); ++i) out.weights.push_back(all[i]);
  return out;
}

}  // namespace minimind
