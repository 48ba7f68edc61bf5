#include "minimind/train/collapse_watcher.h"

#include <fmt/format.h>

namespace minimind {

bool Streaks::update(int64_t layer, int64_t step, bool holds, int64_t patience) {
  if (static_cast<size_t>(layer) >= layers_.size()) layers_.resize(layer + 1);
  LayerState& s = layers_[layer];
  if (!holds) {
    s = LayerState{};
    return false;
  }
  if (s.streak++ == 0) s.since = step;
  if (s.streak < patience || s.fired) return false;
  s.fired = true;
  return true;
}

nlohmann::json Streaks::state() const {
  nlohmann::json layers = nlohmann::json::array();
  for (const LayerState& s : layers_)
    layers.push_back({{"streak", s.streak}, {"since", s.since}, {"fired", s.fired}});
  return layers;
}

void Streaks::set_state(const nlohmann::json& layers) {
  layers_.clear();
  for (const auto& l : layers)
    layers_.push_back(
        {l.at("streak").get<int64_t>(), l.at("since").get<int64_t>(), l.at("fired").get<bool>()});
}

std::optional<CollapseRecord> CollapseDetector::observe(int64_t layer, int64_t step,
                                                        const RoutingMetrics& m) {
  const bool over = m.total > 0 && (m.max_share > t_.max_share ||
                                    static_cast<int64_t>(m.dead.size()) >= t_.dead_experts);
  if (!streaks_.update(layer, step, over, t_.patience)) return std::nullopt;
  const int64_t since = streaks_.since(layer);
  CollapseRecord ev;
  ev.step = step;
  ev.since_step = since;
  ev.layer = layer;
  ev.expert = m.max_expert;
  ev.max_share = m.max_share;
  ev.dead_experts = m.dead;
  // The message names what fired it: the share over its threshold, the dead experts at
  // or over theirs, or both, each with its figure (the other figure only as context).
  const bool share = m.max_share > t_.max_share;
  const bool dead = static_cast<int64_t>(m.dead.size()) >= t_.dead_experts;
  const std::string share_text =
      fmt::format("expert {} takes {:.1f}% of the tokens ({} the {:.0f}% threshold)", m.max_expert,
                  100 * m.max_share, share ? "over" : "under", 100 * t_.max_share);
  const std::string dead_text =
      fmt::format("{} dead expert{}{}{} ({} the threshold of {})", m.dead.size(),
                  m.dead.size() == 1 ? "" : "s", m.dead.empty() ? "" : ": ",
                  fmt::join(m.dead, ", "), dead ? "at or over" : "under", t_.dead_experts);
  const std::string cause = share && dead ? share_text + " and " + dead_text
                            : share       ? share_text + "; " + dead_text
                                          : dead_text + "; " + share_text;
  ev.message = fmt::format("routing collapse in layer {} since step {}, for {} log intervals: {}",
                           layer, since, streaks_.length(layer), cause);
  return ev;
}

std::optional<UninformativeRecord> UninformativeDetector::observe(
    int64_t layer, int64_t step, const RouterInfo& r, const RoutingMetrics& m,
    std::optional<double> grad_lm, std::optional<double> grad_balance) {
  // Two signs that the router learns nothing about the tokens: its probabilities carry no
  // information (MI), or the LM loss sends it no gradient, so only the balancing losses,
  // which only push towards uniform, train it (MiniMind #858: ~1e-9 against ~1e-3).
  const bool starved = grad_lm && grad_balance && *grad_balance > 0 &&
                       *grad_lm < kStarvedGradientRatio * *grad_balance;
  const bool low_mi = r.tokens > 0 && r.mi < t_.min_mi;
  const bool holds = t_.min_mi > 0 && step > t_.start_after && (low_mi || starved);
  if (!streaks_.update(layer, step, holds, t_.patience)) return std::nullopt;
  UninformativeRecord ev;
  ev.step = step, ev.since_step = streaks_.since(layer), ev.layer = layer;
  ev.mi = r.mi, ev.token_entropy = r.token_entropy, ev.threshold = t_.min_mi;
  ev.max_share = m.max_share;
  ev.grad_lm = grad_lm, ev.grad_balance = grad_balance;
  // "Balanced": no expert takes more than 1.5 times its fair share.
  const bool balanced = m.max_share < 1.5 / std::max<double>(1.0, m.counts.size());
  std::vector<std::string> why;
  if (low_mi)
    why.push_back(
        fmt::format("routing information MI {:.4f} < {} (token entropy {:.3f}: nearly the same "
                    "probabilities for every token)",
                    r.mi, t_.min_mi, r.token_entropy));
  if (grad_lm && grad_balance)
    why.push_back(fmt::format(
        "the LM loss's gradient on it is {:.1e} against {:.1e} from the "
        "balancing losses{}",
        *grad_lm, *grad_balance, starved ? ": only they train it (MiniMind #858)" : ""));
  ev.message =
      fmt::format("{}uninformative router in layer {} since step {}, for {} log intervals: {}{}",
                  balanced ? "balanced but " : "", layer, ev.since_step, streaks_.length(layer),
                  fmt::join(why, "; "),
                  balanced ? fmt::format("; its balanced counts (largest share {:.2f}) "
                                         "do not mean it learned",
                                         m.max_share)
                           : "");
  return ev;
}

void CollapseWatcher::on_interval(const IntervalInfo& i) {
  for (size_t l = 0; l < i.counts.layers.size(); ++l) {
    const auto layer = static_cast<int64_t>(l);
    const RoutingMetrics m = routing_metrics(i.counts.layers[l]);
    if (auto ev = detector_.observe(layer, i.record.step, m)) out_.on_collapse(*ev);
    std::optional<double> grad_lm, grad_balance;
    if (l < i.layers.size()) grad_lm = i.layers[l].grad_lm, grad_balance = i.layers[l].grad_balance;
    if (auto ev = uninformative_.observe(layer, i.record.step, i.counts.router_info(l), m, grad_lm,
                                         grad_balance))
      out_.on_uninformative(*ev);
  }
}

}  // namespace minimind
