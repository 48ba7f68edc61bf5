// log.tensorboard: the run's figures as TensorBoard event files in RUN/tensorboard/, on
// rank 0: at each log step the losses, learning rate, gradient norm, tokens/s and, per MoE
// layer, MaxVio, normalised entropy, max share, dead experts, routing information and the
// router gradient by source, and a histogram of the expert load (one bucket per expert);
// at each evaluation the validation loss, perplexity and each layer's MaxVio_global.
#pragma once

#include <memory>

#include "minimind/run/tensorboard.h"
#include "minimind/train/observer.h"
#include "minimind/util/stopwatch.h"

namespace minimind {

class TensorBoardObserver : public Observer {
 public:
  void on_start(const RunStart& s) override;
  void on_interval(const IntervalInfo& i) override;
  void on_eval(const EvalInfo& e) override;
  void on_end(const TrainResult& r) override;

 private:
  // Runs a write; a failure (a full disk) is a warning, and the event file stops.
  template <class F>
  void guarded(F&& write);
  std::unique_ptr<EventFileWriter> writer_;
  double seconds_ = 0;  // spent writing events
  spdlog::logger* log_ = nullptr;
};

}  // namespace minimind
