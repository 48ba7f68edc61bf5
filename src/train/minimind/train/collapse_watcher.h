// Routing collapse, watched over log intervals: a layer whose top expert takes more than
// log.collapse_max_share of the tokens, or with at least log.collapse_dead_experts experts
// that got none, for log.collapse_patience consecutive intervals.
#pragma once

#include <optional>
#include <vector>

#include "minimind/run/routing_metrics.h"
#include "minimind/train/observer.h"

namespace minimind {

struct CollapseThresholds {
  double max_share = 0.9;    // a layer collapses when one expert takes more than this
  int64_t dead_experts = 1;  // ... or when at least this many experts get no token
  int64_t patience = 3;      // ... for this many consecutive log intervals
};

// Fires once per episode: when a layer has been over a threshold for `patience`
// consecutive windows; re-armed after the layer is back under the thresholds.
class CollapseDetector {
 public:
  explicit CollapseDetector(CollapseThresholds t) : t_(t) {}
  std::optional<CollapseRecord> observe(int64_t layer, int64_t step, const RoutingMetrics& m);
  nlohmann::json state() const;  // per layer: streak, since, fired
  void set_state(const nlohmann::json& layers);

 private:
  struct LayerState {
    int64_t streak = 0, since = 0;
    bool fired = false;
  };
  CollapseThresholds t_;
  std::vector<LayerState> layers_;
};

// Runs the detector on each interval's counts and tells the observers of each collapse.
class CollapseWatcher : public Observer {
 public:
  CollapseWatcher(CollapseThresholds t, Observer& out) : detector_(t), out_(out) {}
  void on_interval(const IntervalInfo& i) override;
  // Streaks a checkpoint cut in two ("collapse" in state.json).
  void save_state(nlohmann::json& into) const override { into["collapse"] = detector_.state(); }
  void restore_state(const nlohmann::json& from) override {
    if (const auto it = from.find("collapse"); it != from.end()) detector_.set_state(*it);
  }

 private:
  CollapseDetector detector_;
  Observer& out_;
};

}  // namespace minimind
