#include "minimind/run/expert_parallel.h"

#include <fmt/format.h>

#include "minimind/error.h"

namespace minimind {

ExpertParallel::ExpertParallel(Distributed& job, int n, int channels) : job_(job), n_(n) {
  const int world = job.world_size();
  if (n < 1 || world % n != 0)
    throw DistError(
        fmt::format("run.expert_parallel = {} does not divide the job's {} ranks", n, world),
        "use a divisor of WORLD_SIZE (the ranks then form expert groups of that size)");
  index_ = job.rank() % n;
  group_id_ = job.rank() / n;
  // Every rank forms the groups in one order (those it belongs to): the expert groups, one
  // per channel, then the replica groups.
  for (int g = 0; g < world / n; ++g) {
    std::vector<int> ranks;
    for (int i = 0; i < n; ++i) ranks.push_back(g * n + i);
    if (g != group_id_) continue;
    for (int c = 0; c < channels; ++c)
      channels_.push_back(job.subgroup(fmt::format("experts/{}/{}", g, c), ranks));
  }
  for (int i = 0; i < n; ++i) {
    std::vector<int> ranks;
    for (int g = 0; g < world / n; ++g) ranks.push_back(g * n + i);
    if (i == index_) replicas_ = job.subgroup(fmt::format("replicas/{}", i), ranks);
  }
  traffic_.sent.assign(static_cast<size_t>(n), 0);
  traffic_.received.assign(static_cast<size_t>(n), 0);
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

void ExpertParallel::count_tokens(const std::vector<int64_t>& sent,
                                  const std::vector<int64_t>& received) {
  const std::lock_guard<std::mutex> lock(traffic_mutex_);
  for (size_t q = 0; q < sent.size(); ++q) {
    traffic_.sent[q] += sent[q];
    traffic_.received[q] += received[q];
  }
}

ExpertParallel::Traffic ExpertParallel::take_traffic() {
  const std::lock_guard<std::mutex> lock(traffic_mutex_);
  Traffic t = traffic_;
  double seconds = 0;
  for (const auto& c : channels_) seconds += c->comm_seconds();
  seconds /= static_cast<double>(channels_.size());
  t.seconds = seconds - seconds_taken_;
  seconds_taken_ = seconds;
  std::fill(traffic_.sent.begin(), traffic_.sent.end(), 0);
  std::fill(traffic_.received.begin(), traffic_.received.end(), 0);
  traffic_.bytes = 0;
  return t;
}

SplitParameters split_parameters(const MiniMindForCausalLM& model) {
  SplitParameters s;
  for (const ParamSlot& p : full_parameters(model)) {
    if (!p.local.defined()) continue;
    (p.routed_expert ? s.experts : s.replicated).push_back(p.local);
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
  const std::vector<ParamSlot> whole = full_parameters(model);
  const std::vector<ParamState> states = optimizer_states(optimizer);
  const std::vector<int64_t> place = whole_parameter_index(model, nullptr);
  std::vector<const ParamState*> state_of(whole.size(), nullptr);  // held parameters' states
  for (size_t j = 0; j < place.size(); ++j) state_of[static_cast<size_t>(place[j])] = &states[j];
  // Every rank of the group holds the same number of expert parameters of the same shapes,
  // in the same order (layer by layer, expert by expert): each sends them, with AdamW's two
  // moments, in one flat buffer, and its steps in another.
  std::vector<torch::Tensor> flat;
  std::vector<int64_t> steps;
  for (size_t i = 0; i < whole.size(); ++i) {
    if (!whole[i].routed_expert || !whole[i].local.defined()) continue;
    const ParamState* s = state_of[i];
    const bool has = s && s->step >= 0;
    flat.push_back(whole[i].local.detach().reshape({-1}).to(torch::kFloat32));
    flat.push_back(has ? s->exp_avg.reshape({-1}) : torch::zeros({whole[i].local.numel()}));
    flat.push_back(has ? s->exp_avg_sq.reshape({-1}) : torch::zeros({whole[i].local.numel()}));
    steps.push_back(has ? s->step : -1);
  }
  Distributed& group = ep.group();
  const torch::Tensor values = group.gather_to_main(torch::cat(flat));  // [N, 3 * expert numel]
  const torch::Tensor step_counts = group.gather_to_main(torch::tensor(steps, torch::kLong));
  if (!group.is_main()) return std::nullopt;

  const int64_t E = model->config().num_experts, held = E / ep.size();
  WholeModel out;
  out.optimizer.resize(whole.size());
  std::vector<int64_t> offset(static_cast<size_t>(ep.size()), 0),
      next(static_cast<size_t>(ep.size()), 0);
  for (size_t i = 0; i < whole.size(); ++i) {
    const ParamSlot& p = whole[i];
    if (p.local.defined()) {
      out.weights.emplace_back(p.name, p.local);
      if (state_of[i]) out.optimizer[i] = *state_of[i];
      continue;
    }
    // Another rank's expert: which (from the id in its name) and where in that rank's buffer.
    const size_t at = p.name.find(".experts.") + 9;
    const int64_t e = std::stoll(p.name.substr(at, p.name.find('.', at) - at));
    const auto q = static_cast<size_t>(e / held);
    const int64_t numel = c10::multiply_integers(p.shape);
    const torch::Tensor from = values[static_cast<int64_t>(q)];
    auto part = [&](int k) { return from.narrow(0, offset[q] + k * numel, numel).view(p.shape); };
    out.weights.emplace_back(p.name, part(0));
    const int64_t step = step_counts[static_cast<int64_t>(q)][next[q]++].item<int64_t>();
    if (step >= 0) out.optimizer[i] = {step, part(1), part(2)};
    offset[q] += 3 * numel;
  }
  // The rest of state_dict: buffers (routers' selection bias) and a tied head's second name.
  const NamedTensors all = state_dict(model);
  for (size_t i = model->parameters().size(); i < all.size(); ++i) out.weights.push_back(all[i]);
  return out;
}

}  // namespace minimind
