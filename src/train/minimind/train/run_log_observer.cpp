#include "minimind/train/run_log_observer.h"

namespace minimind {

void RunLogObserver::on_step(const StepInfo& s) {
  const StepStats& st = *s.stats;
  for (size_t l = 0; l < st.counts.layers.size(); ++l) {
    std::optional<double> aux;
    if (aux_coef_ > 0) aux = st.layer_aux[l] / aux_coef_;
    writer_.write(LoadRecord::make(s.step, static_cast<int64_t>(l), "train",
                                   routing_metrics(st.counts.layers[l]), aux));
  }
}

void RunLogObserver::on_eval(const EvalInfo& e) {
  writer_.write(e.record);
  for (size_t l = 0; l < e.counts.layers.size(); ++l)
    writer_.write(LoadRecord::make(e.record.step, static_cast<int64_t>(l), "eval",
                                   routing_metrics(e.counts.layers[l])));
}

}  // namespace minimind
