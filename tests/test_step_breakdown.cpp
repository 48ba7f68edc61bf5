// minimind-bench --breakdown: how a profiled step's time is split into parts.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>

#include "minimind/model/minimind_model.h"
#include "minimind/train/bench.h"
#include "minimind/train/optim.h"
#include "minimind/train/step_breakdown.h"
#include "minimind/train/train_step.h"
#include "minimind/util/blas_check.h"
#include "minimind/util/step_part.h"
#include "minimind/util/stopwatch.h"

namespace minimind {
namespace {

ProfiledSpan span(const std::string& name, uint64_t thread, double start, double end) {
  ProfiledSpan s;
  s.name = name, s.thread = thread, s.start_us = start, s.end_us = end;
  return s;
}
ProfiledSpan scope(const std::string& part, uint64_t thread, double start, double end) {
  ProfiledSpan s = span("minimind::" + part, thread, start, end);
  s.user_scope = true;
  return s;
}
ProfiledSpan node(const std::string& name, double start, double end, int64_t seq) {
  ProfiledSpan s = span(name, 1, start, end);
  s.backward_node = true, s.seq = seq, s.fwd_thread = 1;
  return s;
}

std::map<std::string, double> rows_of(const StepBreakdown& b) {
  std::map<std::string, double> m;
  for (const auto& [name, ms] : b.rows) m[name] = ms;
  return m;
}

// A step worked out by hand (times in µs, two cores): every rule of the attribution once.
TEST(StepBreakdown, ExclusiveTimesGoToTheirParts) {
  std::vector<ProfiledSpan> s;
  s.push_back(scope("step", 1, 0, 100));
  s.push_back(scope("norm", 1, 5, 25));
  ProfiledSpan mul = span("aten::mul", 1, 6, 16);
  mul.seq = 7;  // makes MulBackward0 below
  s.push_back(mul);
  s.push_back(span("aten::empty", 1, 7, 9));
  s.push_back(scope("product_forward", 1, 25, 31));
  ProfiledSpan mm = span("aten::mm", 1, 26, 30);
  mm.seq = 9;  // makes MmBackward0 below
  s.push_back(mm);
  s.push_back(node("MulBackward0", 40, 60, 7));
  s.push_back(span("aten::mul", 1, 42, 52));
  s.push_back(node("MmBackward0", 60, 80, 9));
  s.push_back(span("aten::mm", 1, 61, 66));   // by the input
  s.push_back(span("aten::mm", 1, 67, 75));   // by the weight
  s.push_back(scope("dispatch", 2, 30, 50));  // a helper thread, in its inherited part
  s.push_back(span("aten::index", 2, 32, 40));
  const StepBreakdown b = break_down_step(s, 2);
  EXPECT_DOUBLE_EQ(b.step_ms, 0.1);
  auto r = rows_of(b);
  // Core µs / 2 cores / 1000.
  auto ms = [](double core_us) { return core_us / 2 / 1e3; };
  EXPECT_DOUBLE_EQ(r["norms"], ms(10 + 8 + 10));  // scope, mul, mul's backward
  EXPECT_DOUBLE_EQ(r["allocation"], ms(2));
  EXPECT_DOUBLE_EQ(r["autograd bookkeeping"], ms(10 + 7));
  EXPECT_DOUBLE_EQ(r["products forward"], ms(2 + 4));
  EXPECT_DOUBLE_EQ(r["products backward, by input"], ms(5));
  EXPECT_DOUBLE_EQ(r["products backward, by weight"], ms(8));
  EXPECT_DOUBLE_EQ(r["dispatch"], ms(12 + 8));
  EXPECT_DOUBLE_EQ(r["between ops"], ms(100 - 20 - 6 - 20 - 20));
  EXPECT_DOUBLE_EQ(r["idle cores"], ms(200 - 100 - 20));
  double sum = 0;
  for (const auto& [name, v] : b.rows) sum += v;
  EXPECT_DOUBLE_EQ(sum, b.step_ms);
  EXPECT_THROW(break_down_step({span("aten::mm", 1, 0, 1)}, 1), std::runtime_error);
}

// A real MoE step, recorded: the rows add up to the step, and the parts the model marks show.
TEST(StepBreakdown, RecordsATrainingStep) {
  const Config cfg = bench_config("moe-top1", {"model.num_hidden_layers=2"});
  torch::manual_seed(0);
  MiniMindForCausalLM model(cfg.model);
  init_weights(model);
  model->train();
  auto opt = make_optimizer(model->parameters(), cfg.train);
  const torch::Tensor ids = torch::randint(3, cfg.model.vocab_size, {2, 64}, torch::kLong);
  StepOptions so;
  so.lr = cfg.train.learning_rate, so.grad_clip = cfg.train.grad_clip;
  auto step = [&] {
    optimizer_step(
        model, *opt,
        [&] {
          return Batch{ids, ids};
        },
        so);
  };
  step();  // warm-up
  StepRecorder recorder;
  const Stopwatch clock;
  {
    const StepScope whole(StepPart::step);
    step();
  }
  const double wall_ms = 1e3 * clock.seconds();
  // The cores: OpenBLAS's threads, on which the expert tasks and the loss's blocks run.
  const StepBreakdown b = break_down_step(recorder.finish(), blas_threads());
  EXPECT_GT(b.step_ms, 0);
  EXPECT_LE(b.step_ms, wall_ms + 1e-3);
  double sum = 0;
  for (const auto& [name, ms] : b.rows) sum += ms;
  EXPECT_NEAR(sum, b.step_ms, 1e-9 * b.step_ms);
  auto r = rows_of(b);
  for (const char* part :
       {"products forward", "products backward, by input", "products backward, by weight",
        "attention", "norms", "activations", "RoPE", "routing", "dispatch", "loss", "optimizer",
        "autograd bookkeeping"})
    EXPECT_GT(r[part], 0) << part;
  // The parts cover the step: ops in none and time between ops are a small remainder.
  EXPECT_LT(r["other ops"] + r["between ops"], 0.3 * b.step_ms);
}

}  // namespace
}  // namespace minimind
