#include "minimind/train/collapse_watcher.h"

#include <fmt/format.h>

namespace minimind {

std::optional<CollapseRecord> CollapseDetector::observe(int64_t layer, int64_t step,
                                                        const RoutingMetrics& m) {
  if (static_cast<size_t>(layer) >= layers_.size()) layers_.resize(layer + 1);
  LayerState& s = layers_[layer];
  const bool over = m.total > 0 && (m.max_share > t_.max_share ||
                                    static_cast<int64_t>(m.dead.size()) >= t_.dead_experts);
  if (!over) {
    s = LayerState{};
    return std::nullopt;
  }
  if (s.streak++ == 0) s.since = step;
  if (s.streak < t_.patience || s.fired) return std::nullopt;
  s.fired = true;
  CollapseRecord ev;
  ev.step = step;
  ev.since_step = s.since;
  ev.layer = layer;
  ev.expert = m.max_expert;
  ev.max_share = m.max_share;
  ev.dead_experts = m.dead;
  ev.message = fmt::format(
      "routing collapse in layer {} since step {}: expert {} takes {:.1f}% of the tokens "
      "(threshold {:.0f}%), {} dead expert{}{}{} for {} log intervals",
      layer, s.since, m.max_expert, 100 * m.max_share, 100 * t_.max_share, m.dead.size(),
      m.dead.size() == 1 ? "" : "s", m.dead.empty() ? "" : ": ", fmt::join(m.dead, ", "), s.streak);
  return ev;
}

nlohmann::json CollapseDetector::state() const {
  nlohmann::json layers = nlohmann::json::array();
  for (const LayerState& s : layers_)
    layers.push_back({{"streak", s.streak}, {"since", s.since}, {"fired", s.fired}});
  return layers;
}

void CollapseDetector::set_state(const nlohmann::json& layers) {
  layers_.clear();
  for (const auto& l : layers)
    layers_.push_back(
        {l.at("streak").get<int64_t>(), l.at("since").get<int64_t>(), l.at("fired").get<bool>()});
}

void CollapseWatcher::on_interval(const IntervalInfo& i) {
  for (size_t l = 0; l < i.counts.layers.size(); ++l)
    if (auto ev = detector_.observe(static_cast<int64_t>(l), i.record.step,
                                    routing_metrics(i.counts.layers[l])))
      out_.on_collapse(*ev);
}

}  // namespace minimind
