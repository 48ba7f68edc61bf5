#include "minimind/train/interval_window.h"

#include <algorithm>
#include <type_traits>

namespace minimind {
namespace {

// The interval's figures from its sums: mean and per_step fields divided by the steps, the
// others as summed (sum), the largest (max) or the newest (last).
std::vector<LayerStats> interval_means(std::vector<LayerStats> sums, double steps) {
  for (LayerStats& l : sums)
    LayerStats::fields(
        [steps](const char*, Combine how, Logged, auto& v) {
          using T = std::decay_t<decltype(v)>;
          if (how != Combine::mean && how != Combine::per_step) return;
          if constexpr (layer_stats::is_optional<T>::value) {
            if constexpr (std::is_arithmetic_v<typename T::value_type>) {
              if (v) *v /= steps;
            } else {
              if (v)
                for (auto& x : *v) x /= steps;
            }
          } else if constexpr (std::is_arithmetic_v<T>) {
            v /= steps;
          }
        },
        l);
  return sums;
}

nlohmann::json layers_json(const std::vector<LayerStats>& layers) {
  nlohmann::json out = nlohmann::json::array();
  for (const LayerStats& l : layers) {
    nlohmann::json j = nlohmann::json::object();
    LayerStats::fields(
        [&](const char* name, Combine, Logged, const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (layer_stats::is_optional<T>::value) {
            j[name] = v ? nlohmann::json(*v) : nlohmann::json();
          } else {
            j[name] = v;
          }
        },
        l);
    out.push_back(std::move(j));
  }
  return out;
}

std::vector<LayerStats> layers_from(const nlohmann::json& j) {
  std::vector<LayerStats> out(j.size());
  for (size_t i = 0; i < j.size(); ++i)
    LayerStats::fields(
        [&](const char* name, Combine, Logged, auto& v) {
          using T = std::decay_t<decltype(v)>;
          if (!j[i].contains(name) || j[i][name].is_null()) return;
          if constexpr (layer_stats::is_optional<T>::value) {
            v = j[i][name].get<typename T::value_type>();
          } else {
            j[i][name].get_to(v);
          }
        },
        out[i]);
  return out;
}

}  // namespace

void IntervalWindow::on_step(const StepInfo& s) {
  const StepStats& st = *s.stats;
  loss_ += st.loss, lm_ += st.lm_loss, aux_ += st.aux_loss, grad_norm_ += st.grad_norm;
  z_ += st.z_loss, comm_ += st.comm_seconds;
  z_loss_on_ = z_loss_on_ || st.z_loss_on;
  const bool drops = std::any_of(st.layers.begin(), st.layers.end(),
                                 [](const LayerStats& l) { return l.dropped.has_value(); });
  if (drops) {
    for (const LayerStats& l : st.layers) dropped_ += l.dropped.value_or(0);
    for (const auto& layer : st.counts.layers)
      for (int64_t c : layer) assigned_ += c;
  }
  ++steps_;
  tokens_ += st.tokens, real_tokens_ += st.real_tokens;
  counts_.add(st.counts);
  layer_stats::add(layers_, st.layers, 1.0);
  if (s.step % interval_ != 0 && s.step != s.max_steps) return;

  const double n = static_cast<double>(steps_);
  IntervalInfo info;
  TrainRecord& r = info.record;
  r.step = s.step, r.tokens = s.tokens;
  r.flops = static_cast<double>(s.tokens) * flops_per_token_;
  r.loss = loss_ / n, r.lm_loss = lm_ / n, r.aux_loss = aux_ / n;
  r.lr = s.lr, r.grad_norm = grad_norm_ / n;
  r.tok_per_s = tokens_ / std::max(1e-9, clock_.seconds());
  if (real_tokens_ < tokens_) r.real_tok_per_s = real_tokens_ / std::max(1e-9, clock_.seconds());
  r.elapsed = s.run_seconds;
  if (multi_rank_) r.allreduce_ms = 1e3 * comm_ / n;
  if (z_loss_on_) r.z_loss = z_ / n;
  if (assigned_ > 0) r.dropped = static_cast<double>(dropped_) / static_cast<double>(assigned_);
  info.counts = std::move(counts_);
  info.layers = interval_means(std::move(layers_), n);
  // The next interval starts empty.
  loss_ = lm_ = aux_ = z_ = grad_norm_ = comm_ = 0;
  steps_ = tokens_ = real_tokens_ = dropped_ = assigned_ = 0;
  counts_ = ExpertCounts{};
  layers_.clear();
  clock_.restart();
  out_.on_interval(info);
}

void IntervalWindow::save_state(nlohmann::json& into) const {
  into["interval"] = {{"loss", loss_},
                      {"lm_loss", lm_},
                      {"aux_loss", aux_},
                      {"z_loss", z_},
                      {"grad_norm", grad_norm_},
                      {"comm_seconds", comm_},
                      {"steps", steps_},
                      {"tokens", tokens_},
                      {"real_tokens", real_tokens_},
                      {"counts", counts_.layers},
                      {"dropped", dropped_},
                      {"assigned", assigned_},
                      {"router", counts_.router},
                      {"layers", layers_json(layers_)}};
}

void IntervalWindow::restore_state(const nlohmann::json& from) {
  const auto it = from.find("interval");
  if (it == from.end()) return;
  const nlohmann::json& w = *it;
  loss_ = w.at("loss"), lm_ = w.at("lm_loss"), aux_ = w.at("aux_loss");
  grad_norm_ = w.at("grad_norm"), comm_ = w.at("comm_seconds");
  steps_ = w.at("steps"), tokens_ = w.at("tokens");
  real_tokens_ = w.value("real_tokens", tokens_);  // checkpoints from before: all real
  counts_.layers = w.at("counts").get<std::vector<std::vector<int64_t>>>();
  // Checkpoints from before the balancing lab have no z-loss or drop sums.
  z_ = w.value("z_loss", 0.0);
  dropped_ = w.value("dropped", int64_t{0}), assigned_ = w.value("assigned", int64_t{0});
  // ... nor router sums.
  counts_.router = w.value("router", std::vector<RouterSums>{});
  if (w.contains("layers")) {
    layers_ = layers_from(w.at("layers"));
  } else {  // checkpoints from before LayerStats kept only the z sums
    const auto z = w.value("layer_z", std::vector<double>{});
    layers_.assign(z.size(), LayerStats{});
    for (size_t l = 0; l < z.size(); ++l) layers_[l].z = z[l];
  }
}

}  // namespace minimind
