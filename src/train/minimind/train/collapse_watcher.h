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

// Per layer: for how many consecutive windows a warning's condition has held, since which
// step, and whether the warning fired in this episode (it fires once per episode).
class Streaks {
 public:
  // Records this window; true when the warning fires now (held for `patience` windows and
  // not yet fired in this episode). A window where the condition does not hold ends it.
  bool update(int64_t layer, int64_t step, bool holds, int64_t patience);
  int64_t length(int64_t layer) const { return layers_.at(layer).streak; }
  int64_t since(int64_t layer) const { return layers_.at(layer).since; }
  nlohmann::json state() const;  // per layer: streak, since, fired
  void set_state(const nlohmann::json& layers);

 private:
  struct LayerState {
    int64_t streak = 0, since = 0;
    bool fired = false;
  };
  std::vector<LayerState> layers_;
};

// Fires once per episode: when a layer has been over a threshold for `patience`
// consecutive windows; re-armed after the layer is back under the thresholds.
class CollapseDetector {
 public:
  explicit CollapseDetector(CollapseThresholds t) : t_(t) {}
  std::optional<CollapseRecord> observe(int64_t layer, int64_t step, const RoutingMetrics& m);
  nlohmann::json state() const { return streaks_.state(); }
  void set_state(const nlohmann::json& layers) { streaks_.set_state(layers); }

 private:
  CollapseThresholds t_;
  Streaks streaks_;
};

// The LM part of a router's gradient below this fraction of the balancing losses' part is
// "starved". Measured at the log steps of 300-step runs of configs/moe.yaml: MiniMind #858
// 7e-8 to 1.9e-4, the shipped preset 0.21 to 320.
constexpr double kStarvedGradientRatio = 1e-3;

// "Balanced but uninformative": a layer whose routing information MI stays below `min_mi`
// (the router's probabilities barely depend on the token), or whose router the LM loss
// starves of gradient, for `patience` consecutive windows. Every router starts that way (random
// init gives near-uniform probabilities), so windows up to step `start_after` (the warm-up and one
// log interval) do not count. Fires once per episode, like CollapseDetector; min_mi 0 turns it off.
struct UninformativeThresholds {
  double min_mi = 0.01;
  int64_t patience = 3;
  int64_t start_after = 0;
};

class UninformativeDetector {
 public:
  explicit UninformativeDetector(UninformativeThresholds t) : t_(t) {}
  // grad_lm / grad_balance: the layer's router gradient by source at the window's last
  // step, when measured (said in the warning).
  std::optional<UninformativeRecord> observe(int64_t layer, int64_t step, const RouterInfo& r,
                                             const RoutingMetrics& m,
                                             std::optional<double> grad_lm = {},
                                             std::optional<double> grad_balance = {});
  nlohmann::json state() const { return streaks_.state(); }
  void set_state(const nlohmann::json& layers) { streaks_.set_state(layers); }

 private:
  UninformativeThresholds t_;
  Streaks streaks_;
};

// Runs both detectors on each interval's counts and router sums and tells the observers
// of each collapse and each uninformative router.
class CollapseWatcher : public Observer {
 public:
  CollapseWatcher(CollapseThresholds t, UninformativeThresholds u, Observer& out)
      : detector_(t), uninformative_(u), out_(out) {}
  void on_interval(const IntervalInfo& i) override;
  // Streaks a checkpoint cut in two ("collapse", "uninformative" in state.json).
  void save_state(nlohmann::json& into) const override {
    into["collapse"] = detector_.state();
    into["uninformative"] = uninformative_.state();
  }
  void restore_state(const nlohmann::json& from) override {
    if (const auto it = from.find("collapse"); it != from.end()) detector_.set_state(*it);
    if (const auto it = from.find("uninformative"); it != from.end()) uninformative_.set_state(*it);
  }

 private:
  CollapseDetector detector_;
  UninformativeDetector uninformative_;
  Observer& out_;
};

}  // namespace minimind
