#include "minimind/train/interval_window.h"

#include <algorithm>

namespace minimind {

void IntervalWindow::on_step(const StepInfo& s) {
  const StepStats& st = *s.stats;
  loss_ += st.loss, lm_ += st.lm_loss, aux_ += st.aux_loss, grad_norm_ += st.grad_norm;
  z_ += st.z_loss, comm_ += st.comm_seconds;
  if (!st.layer_dropped.empty()) {
    for (int64_t d : st.layer_dropped) dropped_ += d;
    for (const auto& layer : st.counts.layers)
      for (int64_t c : layer) assigned_ += c;
  }
  ++steps_;
  tokens_ += st.tokens;
  counts_.add(st.counts);
  add_sums(layer_z_, st.layer_z);
  if (s.step % interval_ != 0 && s.step != s.max_steps) return;

  const double n = static_cast<double>(steps_);
  IntervalInfo info;
  TrainRecord& r = info.record;
  r.step = s.step, r.tokens = s.tokens;
  r.loss = loss_ / n, r.lm_loss = lm_ / n, r.aux_loss = aux_ / n;
  r.lr = s.lr, r.grad_norm = grad_norm_ / n;
  r.tok_per_s = tokens_ / std::max(1e-9, clock_.seconds());
  r.elapsed = s.run_seconds;
  if (multi_rank_) r.allreduce_ms = 1e3 * comm_ / n;
  if (z_loss_on_) r.z_loss = z_ / n;
  if (assigned_ > 0) r.dropped = static_cast<double>(dropped_) / static_cast<double>(assigned_);
  info.counts = std::move(counts_);
  for (double z : layer_z_) info.layer_z.push_back(z / n);
  info.layer_grad_lm = st.layer_grad_lm, info.layer_grad_balance = st.layer_grad_balance;
  // The next interval starts empty.
  loss_ = lm_ = aux_ = z_ = grad_norm_ = comm_ = 0;
  steps_ = tokens_ = dropped_ = assigned_ = 0;
  counts_ = ExpertCounts{};
  layer_z_.clear();
  clock_.restart();
  out_.on_interval(info);
}

void IntervalWindow::save_state(nlohmann::json& into) const {
  into["interval"] = {{"loss", loss_},       {"lm_loss", lm_},          {"aux_loss", aux_},
                      {"z_loss", z_},        {"grad_norm", grad_norm_}, {"comm_seconds", comm_},
                      {"steps", steps_},     {"tokens", tokens_},       {"counts", counts_.layers},
                      {"dropped", dropped_}, {"assigned", assigned_},   {"router", counts_.router},
                      {"layer_z", layer_z_}};
}

void IntervalWindow::restore_state(const nlohmann::json& from) {
  const auto it = from.find("interval");
  if (it == from.end()) return;
  const nlohmann::json& w = *it;
  loss_ = w.at("loss"), lm_ = w.at("lm_loss"), aux_ = w.at("aux_loss");
  grad_norm_ = w.at("grad_norm"), comm_ = w.at("comm_seconds");
  steps_ = w.at("steps"), tokens_ = w.at("tokens");
  counts_.layers = w.at("counts").get<std::vector<std::vector<int64_t>>>();
  // Checkpoints from before the balancing lab have no z-loss or drop sums.
  z_ = w.value("z_loss", 0.0);
  dropped_ = w.value("dropped", int64_t{0}), assigned_ = w.value("assigned", int64_t{0});
  // ... nor router sums.
  counts_.router = w.value("router", std::vector<RouterSums>{});
  layer_z_ = w.value("layer_z", std::vector<double>{});
}

}  // namespace minimind
