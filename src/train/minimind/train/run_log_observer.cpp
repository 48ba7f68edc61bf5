#include "minimind/train/run_log_observer.h"

#include <algorithm>

namespace minimind {

void RunLogObserver::on_step(const StepInfo& s) {
  const StepStats& st = *s.stats;
  for (size_t l = 0; l < st.counts.layers.size(); ++l) {
    std::optional<double> aux;
    if (aux_coef_ > 0) aux = st.layer_aux[l] / aux_coef_;
    const RoutingMetrics m = routing_metrics(st.counts.layers[l]);
    LoadRecord r = LoadRecord::make(s.step, static_cast<int64_t>(l), "train", m, aux);
    if (l < st.layer_z.size()) r.z = st.layer_z[l];
    if (l < st.layer_dropped.size())
      r.dropped = static_cast<double>(st.layer_dropped[l]) /
                  static_cast<double>(std::max<int64_t>(1, m.total));
    if (l < st.layer_bias.size()) r.bias = st.layer_bias[l];
    if (l < st.layer_seq_max_vio.size()) r.seq_max_vio = st.layer_seq_max_vio[l];
    r.set_router(st.counts.router_info(l));
    if (l < st.layer_grad_lm.size())
      r.grad_lm = st.layer_grad_lm[l], r.grad_balance = st.layer_grad_balance[l];
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
