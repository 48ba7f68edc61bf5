#include "minimind/train/run_log_observer.h"

#include <algorithm>

namespace minimind {

void RunLogObserver::on_step(const StepInfo& s) {
  const StepStats& st = *s.stats;
  for (size_t l = 0; l < st.counts.layers.size(); ++l) {
    const RoutingMetrics m = routing_metrics(st.counts.layers[l]);
    LoadRecord r = LoadRecord::make(s.step, static_cast<int64_t>(l), "train", m);
    if (l < st.layers.size()) r.stats = st.layers[l];
    if (aux_coef_ > 0) r.aux_unscaled = r.stats.aux / aux_coef_;
    if (r.stats.dropped)
      r.dropped = static_cast<double>(*r.stats.dropped) /
                  static_cast<double>(std::max<int64_t>(1, m.total));
    if (r.stats.exchange) r.overload = overload_factor(*r.stats.exchange);
    r.set_router(st.counts.router_info(l));
    writer_.write(r);
  }
}

void RunLogObserver::on_eval(const EvalInfo& e) {
  writer_.write(e.record);
  for (size_t l = 0; l < e.counts.layers.size(); ++l) {
    LoadRecord r = LoadRecord::make(e.record.step, static_cast<int64_t>(l), "eval",
                                    routing_metrics(e.counts.layers[l]));
    r.set_router(e.counts.router_info(l));
    writer_.write(r);
  }
}

}  // namespace minimind
