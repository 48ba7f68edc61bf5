#include "minimind/train/evaluator.h"

#include "minimind/eval/evaluate.h"
#include "minimind/flops.h"
#include "minimind/util/stopwatch.h"

namespace minimind {

void Evaluator::evaluate_at(int64_t step, int64_t tokens) {
  const Stopwatch clock;
  EvalResult ev = chat_ ? evaluate_chat(model_, val_, *chat_, cfg_.data.max_seq_len,
                                        cfg_.train.batch_size, -1, parallel_)
                        : evaluate(model_, val_, cfg_.data.max_seq_len, cfg_.train.batch_size, -1,
                                   LongDocuments::windows, parallel_);
  EvalInfo info;
  info.record = {
      step,
      tokens,
      ev.loss,
      ev.ppl,
      ev.tokens,
      static_cast<double>(tokens) * flops_per_token(cfg_.model, cfg_.data.max_seq_len).total()};
  info.counts = std::move(ev.expert_counts);
  info.documents = ev.documents;
  info.seconds = clock.seconds();
  if (first_loss_ == 0) first_loss_ = ev.loss;
  last_loss_ = ev.loss;
  out_.on_eval(info);
}

}  // namespace minimind
