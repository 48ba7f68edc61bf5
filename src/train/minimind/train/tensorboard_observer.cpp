#include "minimind/train/tensorboard_observer.h"

#include <fmt/format.h>

#include <algorithm>

#include "minimind/error.h"
#include "minimind/run/routing_metrics.h"

namespace minimind {

template <class F>
void TensorBoardObserver::guarded(F&& write) {
  if (!writer_) return;
  const Stopwatch clock;
  try {
    write(*writer_);
    writer_->flush();
    seconds_ += clock.seconds();
  } catch (const Error& e) {
    log_->warn("{}; TensorBoard events stop here, training goes on", e.what());
    writer_.reset();
  }
}

void TensorBoardObserver::on_start(const RunStart& s) {
  log_ = s.log;
  if (!s.main_rank) return;
  try {
    writer_ = std::make_unique<EventFileWriter>(s.run_dir + "/tensorboard");
    if (s.resumed) writer_->session_start(s.step);
    log_->info("TensorBoard events {}", writer_->path());
  } catch (const Error& e) {
    log_->warn("{}; training goes on without TensorBoard events", e.what());
  }
}

void TensorBoardObserver::on_interval(const IntervalInfo& i) {
  guarded([&](EventFileWriter& w) {
    const TrainRecord& r = i.record;
    w.scalar("train/loss", r.step, r.loss);
    w.scalar("train/lm_loss", r.step, r.lm_loss);
    w.scalar("train/aux_loss", r.step, r.aux_loss);
    if (r.z_loss) w.scalar("train/z_loss", r.step, *r.z_loss);
    if (r.dropped) w.scalar("train/dropped", r.step, *r.dropped);
    w.scalar("train/lr", r.step, r.lr);
    w.scalar("train/grad_norm", r.step, r.grad_norm);
    w.scalar("train/tokens_per_s", r.step, r.tok_per_s);
    for (size_t l = 0; l < i.counts.layers.size(); ++l) {
      const std::string p = fmt::format("layer{}/", l);
      const RoutingMetrics m = routing_metrics(i.counts.layers[l]);
      w.scalar(p + "max_vio", r.step, m.max_vio);
      w.scalar(p + "entropy", r.step, m.entropy);
      w.scalar(p + "max_share", r.step, m.max_share);
      w.scalar(p + "dead_experts", r.step, static_cast<double>(m.dead.size()));
      if (l < i.counts.router.size()) w.scalar(p + "mi", r.step, i.counts.router_info(l).mi);
      if (l < i.layers.size() && i.layers[l].grad_lm) {
        w.scalar(p + "grad_lm", r.step, *i.layers[l].grad_lm);
        w.scalar(p + "grad_balance", r.step, *i.layers[l].grad_balance);
      }
      if (l < i.layers.size()) {
        const LayerStats& ls = i.layers[l];
        if (ls.margin) w.scalar(p + "margin", r.step, *ls.margin);
        if (ls.margin_small) w.scalar(p + "margin_small", r.step, *ls.margin_small);
        if (ls.routing_change) w.scalar(p + "routing_change", r.step, *ls.routing_change);
        if (ls.exchange) w.scalar(p + "overload", r.step, overload_factor(*ls.exchange));
      }
      if (l < i.layers.size() && i.layers[l].expert_similarity_mean) {
        w.scalar(p + "expert_similarity_mean", r.step, *i.layers[l].expert_similarity_mean);
        w.scalar(p + "expert_similarity_max", r.step, *i.layers[l].expert_similarity_max);
      }
      w.expert_histogram(p + "expert_load", r.step, i.counts.layers[l]);
    }
  });
}

void TensorBoardObserver::on_end(const TrainResult& r) {
  if (writer_)
    log_->info("TensorBoard events written in {:.3f} s ({:.2f} % of the loop)", seconds_,
               100 * seconds_ / std::max(1e-9, r.seconds));
}

void TensorBoardObserver::on_eval(const EvalInfo& e) {
  guarded([&](EventFileWriter& w) {
    const EvalRecord& r = e.record;
    w.scalar("eval/loss", r.step, r.val_loss);
    w.scalar("eval/perplexity", r.step, r.val_ppl);
    for (size_t l = 0; l < e.counts.layers.size(); ++l)
      w.scalar(fmt::format("layer{}/eval_max_vio", l), r.step,
               routing_metrics(e.counts.layers[l]).max_vio);
  });
}

}  // namespace minimind
