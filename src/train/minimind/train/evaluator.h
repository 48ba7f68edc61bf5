// Evaluation of the validation split during training: at the start of a fresh run, every
// train.eval_interval steps and at the last step. Every rank takes part (each evaluates its
// share and the sums are taken over ranks); the result goes to all observers.
#pragma once

#include <memory>

#include "minimind/config.h"
#include "minimind/data/sft.h"
#include "minimind/data/token_file.h"
#include "minimind/model/minimind_model.h"
#include "minimind/run/parallel_context.h"
#include "minimind/train/observer.h"

namespace minimind {

class Evaluator : public Observer {
 public:
  // chat: the validation file's chat index (data.mode: sft), null for text.
  Evaluator(MiniMindForCausalLM model, const TokenFile& val, const Config& cfg,
            const ParallelContext& parallel, Observer& out,
            std::shared_ptr<const SftIndex> chat = nullptr)
      : model_(std::move(model)),
        val_(val),
        chat_(std::move(chat)),
        cfg_(cfg),
        parallel_(parallel),
        out_(out) {}
  void on_start(const RunStart& s) override {
    if (!s.resumed) evaluate_at(s.step, 0);
  }
  void on_step(const StepInfo& s) override {
    if (s.step % cfg_.train.eval_interval == 0 || s.step == s.max_steps)
      evaluate_at(s.step, s.tokens);
  }
  // Validation losses of the first and the latest evaluation of this call (0: none yet).
  double first_loss() const { return first_loss_; }
  double last_loss() const { return last_loss_; }

 private:
  void evaluate_at(int64_t step, int64_t tokens);
  MiniMindForCausalLM model_;
  const TokenFile& val_;
  std::shared_ptr<const SftIndex> chat_;
  const Config& cfg_;
  ParallelContext parallel_;
  Observer& out_;
  double first_loss_ = 0, last_loss_ = 0;
};

}  // namespace minimind
