// Trainer: lr schedule, routing metrics, each observer of the loop on its own (interval
// means, console, run logs, collapse watcher, evaluator, checkpointer), gradient
// accumulation, checkpoints (atomicity, refusals), exact resume, stop requests, the
// non-finite guard, golden per-step losses of configs/moe.yaml, and the multi-process set-up.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "minimind/config.h"
#include "minimind/data/batcher.h"
#include "minimind/data/prepare.h"
#include "minimind/dist/distributed.h"
#include "minimind/eval/evaluate.h"
#include "minimind/model/minimind_model.h"
#include "minimind/model/weights_io.h"
#include "minimind/run/checkpoint.h"
#include "minimind/run/routing_metrics.h"
#include "minimind/run/run_log.h"
#include "minimind/train/checkpointer.h"
#include "minimind/train/collapse_watcher.h"
#include "minimind/train/console.h"
#include "minimind/train/evaluator.h"
#include "minimind/train/interval_window.h"
#include "minimind/train/lr_schedule.h"
#include "minimind/train/optim.h"
#include "minimind/train/run_log_observer.h"
#include "minimind/train/train_step.h"
#include "minimind/train/trainer.h"
#include "minimind/util/blas_check.h"
#include "minimind/util/side_by_side.h"
#include "support/test_support.h"

using namespace minimind;
using namespace minimind::test;
namespace fs = std::filesystem;

TEST(LrSchedule, MiniMindCosineWithWarmup) {
  // lr * (0.1 + 0.45 * (1 + cos(pi t / T))): lr at 0, 0.55 lr half-way, -> 0.1 lr.
  EXPECT_DOUBLE_EQ(learning_rate_at(0, 100, 1.0, 0), 1.0);
  EXPECT_NEAR(learning_rate_at(50, 100, 1.0, 0), 0.55, 1e-12);
  EXPECT_NEAR(learning_rate_at(100, 100, 1.0, 0), 0.1, 1e-12);
  EXPECT_NEAR(learning_rate_at(99, 100, 2.0, 0), 2.0 * (0.1 + 0.45 * (1 + std::cos(M_PI * 0.99))),
              1e-12);
  // Warm-up: linear to lr over W steps, then the cosine over the remaining T - W.
  EXPECT_DOUBLE_EQ(learning_rate_at(0, 100, 1.0, 10), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate_at(9, 100, 1.0, 10), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate_at(10, 100, 1.0, 10), 1.0);
  EXPECT_NEAR(learning_rate_at(55, 100, 1.0, 10), 0.55, 1e-12);
}

TEST(RoutingMetrics, FormulasOnHandMadeCounts) {
  RoutingMetrics b = routing_metrics({25, 25, 25, 25});
  EXPECT_DOUBLE_EQ(b.max_vio, 0.0);
  EXPECT_DOUBLE_EQ(b.cv, 0.0);
  EXPECT_NEAR(b.entropy, 1.0, 1e-12);
  EXPECT_NEAR(b.effective_experts, 4.0, 1e-12);
  EXPECT_DOUBLE_EQ(b.max_share, 0.25);
  EXPECT_TRUE(b.dead.empty());

  RoutingMetrics c = routing_metrics({100, 0, 0, 0});
  EXPECT_DOUBLE_EQ(c.max_vio, 3.0);          // E - 1
  EXPECT_NEAR(c.cv, std::sqrt(3.0), 1e-12);  // sqrt(E - 1)
  EXPECT_DOUBLE_EQ(c.entropy, 0.0);
  EXPECT_DOUBLE_EQ(c.effective_experts, 1.0);
  EXPECT_DOUBLE_EQ(c.max_share, 1.0);
  EXPECT_EQ(c.dead, (std::vector<int64_t>{1, 2, 3}));

  // One dead expert: counts 40/30/30/0, mean 25, population std 15.
  RoutingMetrics d = routing_metrics({40, 30, 30, 0});
  EXPECT_NEAR(d.max_vio, 0.6, 1e-12);
  EXPECT_NEAR(d.cv, 0.6, 1e-12);
  const double H = -(0.4 * std::log(0.4) + 2 * 0.3 * std::log(0.3));
  EXPECT_NEAR(d.entropy, H / std::log(4.0), 1e-12);
  EXPECT_NEAR(d.effective_experts, std::exp(H), 1e-12);
  EXPECT_DOUBLE_EQ(d.max_share, 0.4);
  EXPECT_EQ(d.max_expert, 0);
  EXPECT_EQ(d.dead, (std::vector<int64_t>{3}));
  EXPECT_EQ(d.share, (std::vector<double>{0.4, 0.3, 0.3, 0.0}));
}

TEST(RoutingMetrics, TerminalRowShowsTheShape) {
  EXPECT_NE(load_row(0, routing_metrics({25, 25, 25, 25})).find("▄▄▄▄"), std::string::npos);
  const std::string collapsed = load_row(3, routing_metrics({100, 0, 0, 0}));
  EXPECT_NE(collapsed.find("█···"), std::string::npos) << collapsed;
  EXPECT_NE(collapsed.find("dead 3"), std::string::npos);
}

TEST(Collapse, FiresOnCollapsedRouterAfterPatienceAndStaysQuietWhenBalanced) {
  CollapseDetector det({0.9, 1, 3});
  // A synthetic collapsed router in layer 1: expert 2 takes 95%, expert 0 gets nothing.
  std::vector<std::optional<CollapseRecord>> fired;
  for (int w = 1; w <= 5; ++w) {
    EXPECT_FALSE(det.observe(0, w * 10, routing_metrics({260, 240, 255, 245})).has_value());
    fired.push_back(det.observe(1, w * 10, routing_metrics({0, 25, 950, 25})));
  }
  EXPECT_FALSE(fired[0] || fired[1]);
  ASSERT_TRUE(fired[2].has_value());   // third consecutive window
  EXPECT_FALSE(fired[3] || fired[4]);  // once per episode
  const CollapseRecord& ev = *fired[2];
  EXPECT_EQ(ev.layer, 1);
  EXPECT_EQ(ev.expert, 2);
  EXPECT_EQ(ev.since_step, 10);
  EXPECT_EQ(ev.step, 30);
  EXPECT_DOUBLE_EQ(ev.max_share, 0.95);
  EXPECT_EQ(ev.dead_experts, (std::vector<int64_t>{0}));
  EXPECT_NE(ev.message.find("layer 1"), std::string::npos) << ev.message;
  EXPECT_NE(ev.message.find("expert 2 takes 95.0%"), std::string::npos) << ev.message;
  EXPECT_NE(ev.message.find("1 dead expert: 0"), std::string::npos) << ev.message;
  // Recovery re-arms it; an interrupted streak does not fire.
  EXPECT_FALSE(det.observe(1, 60, routing_metrics({250, 250, 250, 250})).has_value());
  EXPECT_FALSE(det.observe(1, 70, routing_metrics({0, 500, 250, 250})).has_value());
  EXPECT_FALSE(det.observe(1, 80, routing_metrics({10, 500, 250, 240})).has_value());
}

// Router information from hand-made sums: a uniform router (every token p = 1/E) has MI 0,
// a router sure of each token and balanced over them has MI 1.
TEST(RoutingMetrics, RouterInformationOnHandMadeProbabilities) {
  // 4 tokens, E = 4, uniform: sum p = 1 per expert, H = ln 4 per token, top-2 mass 0.5.
  const RouterInfo u = router_info({1, 1, 1, 1, 4 * std::log(4.0), 4 * 0.5, 4});
  EXPECT_NEAR(u.mi, 0.0, 1e-12);
  EXPECT_NEAR(u.token_entropy, 1.0, 1e-12);
  EXPECT_NEAR(u.marginal_entropy, 1.0, 1e-12);
  EXPECT_NEAR(u.confidence, 0.5, 1e-12);
  // One-hot, one token per expert: H = 0 per token, marginal uniform.
  const RouterInfo s = router_info({1, 1, 1, 1, 0, 4, 4});
  EXPECT_NEAR(s.mi, 1.0, 1e-12);
  EXPECT_NEAR(s.token_entropy, 0.0, 1e-12);
  // All tokens sure of expert 0 (collapsed): no information either.
  const RouterInfo c = router_info({4, 0, 0, 0, 0, 4, 4});
  EXPECT_NEAR(c.mi, 0.0, 1e-12);
  EXPECT_EQ(router_info({0, 0, 0}).tokens, 0);  // nothing seen
}

TEST(Uninformative, FiresAfterPatienceOncePerEpisodeAndNotDuringWarmUp) {
  UninformativeDetector det({0.01, 3, 30});
  const RoutingMetrics balanced = routing_metrics({250, 250, 250, 250});
  RouterInfo low;
  low.mi = 0.002, low.token_entropy = 0.99, low.tokens = 1000;
  RouterInfo high = low;
  high.mi = 0.2;
  std::vector<int64_t> fired_at;
  for (int64_t step = 10; step <= 90; step += 10)
    if (auto ev = det.observe(0, step, low, balanced, 3e-10, 2e-3)) {
      fired_at.push_back(step);
      EXPECT_EQ(ev->since_step, 40);  // steps 10-30 are the warm-up: not counted
      EXPECT_EQ(ev->layer, 0);
      EXPECT_NE(ev->message.find("balanced but uninformative router in layer 0"), std::string::npos)
          << ev->message;
      EXPECT_NE(ev->message.find("MiniMind #858"), std::string::npos) << ev->message;
      EXPECT_EQ(ev->grad_lm, 3e-10);
    }
  EXPECT_EQ(fired_at, (std::vector<int64_t>{60}));  // the third window after the warm-up, once
  // An informative window ends the episode; a new one needs `patience` windows again.
  EXPECT_FALSE(det.observe(0, 100, high, balanced));
  EXPECT_FALSE(det.observe(0, 110, low, balanced));
  EXPECT_FALSE(det.observe(0, 120, low, balanced));
  EXPECT_TRUE(det.observe(0, 130, low, balanced));
  // Off with threshold 0.
  UninformativeDetector off({0.0, 1, 0});
  EXPECT_FALSE(off.observe(0, 10, low, balanced));
  // A starved router fires even when its MI is above the threshold; a fed one does not.
  UninformativeDetector grads({0.01, 2, 0});
  EXPECT_FALSE(grads.observe(1, 10, high, balanced, 3e-10, 2e-3));
  const auto ev = grads.observe(1, 20, high, balanced, 3e-10, 2e-3);
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->message.find("routing information MI"), std::string::npos) << ev->message;
  EXPECT_NE(ev->message.find("only they train it"), std::string::npos) << ev->message;
  EXPECT_FALSE(grads.observe(2, 10, high, balanced, 1e-3, 2e-3));
  EXPECT_FALSE(grads.observe(2, 20, high, balanced, 1e-3, 2e-3));
}

// ---- The observers of the loop, each on its own, fed by hand-made notifications.

namespace {

// Remembers what reaches it.
struct Recorder : Observer {
  std::vector<IntervalInfo> intervals;
  std::vector<EvalInfo> evals;
  std::vector<CollapseRecord> collapses;
  std::vector<CheckpointInfo> checkpoints;
  void on_interval(const IntervalInfo& i) override { intervals.push_back(i); }
  void on_eval(const EvalInfo& e) override { evals.push_back(e); }
  void on_collapse(const CollapseRecord& c) override { collapses.push_back(c); }
  void on_checkpoint(const CheckpointInfo& c) override { checkpoints.push_back(c); }
};

StepStats step_stats(double lm, double aux, double grad, std::vector<std::vector<int64_t>> counts,
                     int64_t tokens = 100) {
  StepStats s;
  s.lm_loss = lm, s.aux_loss = aux, s.loss = lm + aux, s.grad_norm = grad, s.tokens = tokens;
  s.counts.layers = std::move(counts);
  s.layers.resize(s.counts.layers.size());
  for (LayerStats& l : s.layers) l.aux = aux / 2;
  return s;
}

StepInfo step_info(int64_t step, int64_t max_steps, const StepStats& st) {
  return {step, max_steps, 0, 100 * step, 1e-3 * step, 2.0 * step, 10.0 + 2.0 * step, &st};
}

}  // namespace

TEST(IntervalWindow, MeansOverEachIntervalAndTheLastStep) {
  Recorder rec;
  IntervalWindow window(2, rec, /*multi_rank=*/false);
  const StepStats a = step_stats(4.0, 0.5, 1.0, {{3, 1}}), b = step_stats(2.0, 0.25, 3.0, {{0, 4}}),
                  c = step_stats(1.0, 0.125, 2.0, {{2, 2}}, 60);
  window.on_step(step_info(1, 3, a));
  EXPECT_TRUE(rec.intervals.empty());
  window.on_step(step_info(2, 3, b));
  ASSERT_EQ(rec.intervals.size(), 1u);
  const TrainRecord& r = rec.intervals[0].record;
  EXPECT_EQ(r.step, 2);
  EXPECT_EQ(r.tokens, 200);
  EXPECT_DOUBLE_EQ(r.lm_loss, 3.0);     // (4 + 2) / 2
  EXPECT_DOUBLE_EQ(r.aux_loss, 0.375);  // (0.5 + 0.25) / 2
  EXPECT_DOUBLE_EQ(r.loss, 3.375);
  EXPECT_DOUBLE_EQ(r.grad_norm, 2.0);
  EXPECT_DOUBLE_EQ(r.lr, 2e-3);       // the last step's
  EXPECT_DOUBLE_EQ(r.elapsed, 14.0);  // the run's seconds at the last step
  EXPECT_GT(r.tok_per_s, 0.0);
  EXPECT_FALSE(r.allreduce_ms.has_value());  // one process
  EXPECT_EQ(rec.intervals[0].counts.layers, (std::vector<std::vector<int64_t>>{{3, 5}}));
  // Step 3 is the last of the run: a short interval of one step.
  window.on_step(step_info(3, 3, c));
  ASSERT_EQ(rec.intervals.size(), 2u);
  EXPECT_DOUBLE_EQ(rec.intervals[1].record.lm_loss, 1.0);
  EXPECT_EQ(rec.intervals[1].counts.layers, (std::vector<std::vector<int64_t>>{{2, 2}}));

  Recorder multi;
  IntervalWindow ranks(1, multi, /*multi_rank=*/true);
  StepStats d = step_stats(1.0, 0.0, 1.0, {});
  d.comm_seconds = 0.004;
  ranks.on_step(step_info(1, 5, d));
  ASSERT_TRUE(multi.intervals.at(0).record.allreduce_ms.has_value());
  EXPECT_DOUBLE_EQ(*multi.intervals[0].record.allreduce_ms, 4.0);
}

TEST(Console, LogLinesShowIntervalsEvaluationsCollapsesAndTheEnd) {
  std::ostringstream text;
  spdlog::logger log("test", std::make_shared<spdlog::sinks::ostream_sink_mt>(text));
  log.set_pattern("%l %v");
  ConsoleObserver console(log, /*live=*/false);
  const StepStats st = step_stats(3.0, 0.5, 1.0, {{1, 3}});
  console.on_step(step_info(1, 4, st));  // 2 s for 1 step: 6 s left
  IntervalInfo interval;
  interval.record.step = 1, interval.record.loss = 3.5, interval.record.lm_loss = 3.0;
  interval.record.aux_loss = 0.5, interval.record.lr = 1e-3, interval.record.grad_norm = 1.0;
  interval.record.tok_per_s = 250;
  interval.counts.layers = {{1, 3}};
  console.on_interval(interval);
  EvalInfo ev;
  ev.record = {4, 400, 2.5, std::exp(2.5), 90};
  ev.documents = 3, ev.seconds = 0.5;
  console.on_eval(ev);
  CollapseRecord c;
  c.message = "routing collapse in layer 0";
  console.on_collapse(c);
  console.on_checkpoint({4, "run/checkpoints/step_00000004"});
  TrainResult done;
  done.step = 4, done.tokens = 400, done.seconds = 2.0, done.first_val_loss = 2.5,
  done.last_val_loss = 2.5;
  console.on_end(done);
  const std::string out = text.str();
  for (const char* line :
       {"info step 1/4  loss 3.5000 (lm 3.0000 aux 0.50000)  lr 1.00e-03  grad 1.000  250 tok/s  "
        "ETA 6s\n",
        "info   L0  ▂▆  max 0.75 e1  maxvio 0.50  H 0.81  dead 0\n",
        "info eval step 4: val_loss 2.5000 | ppl 12.18 | 90 tokens of 3 documents in 0.5 s\n",
        "warning routing collapse in layer 0\n", "info checkpoint run/checkpoints/step_00000004\n",
        "info done: 4 steps, 400 tokens in 2s (200 tok/s); val_loss 2.5000 -> 2.5000\n"})
    EXPECT_NE(out.find(line), std::string::npos) << "missing: " << line << "in:\n" << out;
  // log.console: full: every metric, in the form of earlier versions.
  std::ostringstream full_text;
  spdlog::logger full_log("test", std::make_shared<spdlog::sinks::ostream_sink_mt>(full_text));
  full_log.set_pattern("%l %v");
  ConsoleObserver full(full_log, /*live=*/false, /*full=*/true);
  full.on_step(step_info(1, 4, st));
  full.on_interval(interval);
  for (const char* line :
       {"info step 1/4 | loss 3.5000 | lm 3.0000 | aux 0.50000 | lr 1.00e-03 | grad 1.000 | 250 "
        "tok/s | ETA 6s\n",
        "info   L0  ▂▆  max 0.75 e1  maxvio 0.50  cv 0.50  H 0.81  dead 0\n"})
    EXPECT_NE(full_text.str().find(line), std::string::npos) << "missing: " << line << "in:\n"
                                                             << full_text.str();
  std::ostringstream stopped_text;
  spdlog::logger stopped_log("test",
                             std::make_shared<spdlog::sinks::ostream_sink_mt>(stopped_text));
  ConsoleObserver stopped(stopped_log, false);
  TrainResult r;
  r.step = 7, r.interrupted = true, r.signal = SIGTERM;
  stopped.on_end(r);
  EXPECT_NE(stopped_text.str().find("stopped at step 7 by signal 15; continue with --resume"),
            std::string::npos)
      << stopped_text.str();
}

TEST(RunLogObserver, WritesTheRecordsOfStepsIntervalsEvaluationsAndEvents) {
  const std::string dir = temp_dir("runlogobs");
  {
    RunLogObserver logs(dir, -1, /*aux_coef=*/0.5);
    const StepStats st = step_stats(3.0, 0.5, 1.0, {{1, 3}, {4, 0}});
    logs.on_step(step_info(1, 2, st));
    IntervalInfo interval;
    interval.record.step = 1, interval.record.loss = 3.5;
    logs.on_interval(interval);
    EvalInfo ev;
    ev.record = {1, 100, 2.5, std::exp(2.5), 90};
    ev.counts.layers = {{2, 2}, {3, 1}};
    logs.on_eval(ev);
    CollapseRecord c;
    c.step = 1, c.layer = 1, c.dead_experts = {1}, c.message = "m";
    logs.on_collapse(c);
  }
  const RunLogs r = read_run_logs(dir);
  ASSERT_EQ(r.train.size(), 1u);
  EXPECT_DOUBLE_EQ(r.train[0].loss, 3.5);
  ASSERT_EQ(r.eval.size(), 1u);
  EXPECT_DOUBLE_EQ(r.eval[0].val_loss, 2.5);
  ASSERT_EQ(r.train_load.size(), 2u);
  const LoadRecord& l0 = r.train_load.at(0).at(0);
  EXPECT_EQ(l0.counts, (std::vector<int64_t>{1, 3}));
  EXPECT_DOUBLE_EQ(l0.max_share, 0.75);
  ASSERT_TRUE(l0.aux_unscaled.has_value());
  EXPECT_DOUBLE_EQ(*l0.aux_unscaled, 0.5);  // layer aux 0.25 / coef 0.5
  EXPECT_EQ(r.train_load.at(1).at(0).dead_experts, (std::vector<int64_t>{1}));
  EXPECT_EQ(r.eval_load.at(1).at(0).counts, (std::vector<int64_t>{3, 1}));
  EXPECT_FALSE(r.eval_load.at(1).at(0).aux_unscaled.has_value());
  ASSERT_EQ(r.collapses.size(), 1u);
  EXPECT_EQ(r.collapses[0].dead_experts, (std::vector<int64_t>{1}));
}

TEST(CollapseWatcher, TellsTheObserversAfterPatienceIntervals) {
  Recorder rec;
  CollapseWatcher watcher({0.9, 1, 2}, UninformativeThresholds{0.0, 2, 0}, rec);
  IntervalInfo collapsed;
  collapsed.counts.layers = {{50, 50}, {100, 0}};  // layer 1: expert 0 takes all, expert 1 dead
  for (int64_t step : {10, 20, 30}) {
    collapsed.record.step = step;
    watcher.on_interval(collapsed);
  }
  ASSERT_EQ(rec.collapses.size(), 1u);  // once per episode, at the second interval
  EXPECT_EQ(rec.collapses[0].step, 20);
  EXPECT_EQ(rec.collapses[0].since_step, 10);
  EXPECT_EQ(rec.collapses[0].layer, 1);
  EXPECT_EQ(rec.collapses[0].dead_experts, (std::vector<int64_t>{1}));
}

TEST(Evaluator, EvaluatesAtStartIntervalsAndEndWithTheValidationLoss) {
  const std::string dir = temp_dir("evaluator");
  const Config cfg = tiny_config(dir, {"train.eval_interval=3", "train.max_steps=5"});
  const PreparedData data = prepare_data(cfg.data, cfg.model.vocab_size, 1);
  const TokenFile val = TokenFile::open(data.val_path);
  torch::manual_seed(2);
  MiniMindForCausalLM model(cfg.model);
  init_weights(model);
  Distributed one;
  Recorder rec;
  Evaluator evaluator(model, val, cfg, one, rec);
  evaluator.on_start({dir, true, 1, 7, /*resumed=*/true, nullptr});
  EXPECT_TRUE(rec.evals.empty());  // a resumed run was evaluated before it stopped
  evaluator.on_start({dir, true, 1, 0, /*resumed=*/false, nullptr});
  ASSERT_EQ(rec.evals.size(), 1u);
  const StepStats st;
  for (int64_t step = 1; step <= 5; ++step) evaluator.on_step(step_info(step, 5, st));
  ASSERT_EQ(rec.evals.size(), 3u);  // steps 0, 3 and 5 (the last)
  EXPECT_EQ(rec.evals[1].record.step, 3);
  EXPECT_EQ(rec.evals[1].record.tokens, 300);
  EXPECT_EQ(rec.evals[2].record.step, 5);
  const EvalResult direct = evaluate(model, val, cfg.data.max_seq_len, cfg.train.batch_size);
  EXPECT_EQ(rec.evals[2].record.val_loss, direct.loss);
  EXPECT_EQ(rec.evals[2].record.val_tokens, direct.tokens);
  EXPECT_EQ(rec.evals[2].counts, direct.expert_counts);
  EXPECT_EQ(evaluator.last_loss(), direct.loss);
}

// FusedAdamW's one-pass update against torch's AdamW on the same float32 tensors and
// gradients, 20 steps with weight decay and a changing learning rate: the weights and both
// moments agree to a few float ulps (torch's add with alpha may use a fused multiply-add
// where the fused loop rounds twice). A float64 tensor takes torch's own ops: bitwise.
TEST(FusedAdamW, FollowsTorchsAdamW) {
  torch::manual_seed(4);
  TrainConfig tc;
  tc.weight_decay = 0.1;
  for (const auto type : {torch::kFloat32, torch::kFloat64}) {
    const torch::Tensor init = torch::randn({1000, 37}, type);  // numel not a multiple of 16
    torch::Tensor a = init.clone().requires_grad_(), b = init.clone().requires_grad_();
    auto fused = make_optimizer({a}, tc);
    auto options = torch::optim::AdamWOptions(tc.learning_rate)
                       .betas({tc.beta1, tc.beta2})
                       .eps(tc.eps)
                       .weight_decay(tc.weight_decay);
    torch::optim::AdamW reference({b}, options);
    for (int step = 1; step <= 20; ++step) {
      const torch::Tensor g = torch::randn_like(init) * (step % 3 == 0 ? 1e-9 : 1.0);
      a.mutable_grad() = g.clone(), b.mutable_grad() = g.clone();
      for (auto* opt : {static_cast<torch::optim::AdamW*>(fused.get()), &reference})
        static_cast<torch::optim::AdamWOptions&>(opt->param_groups()[0].options()).lr(1e-3 * step);
      fused->step();
      reference.step();
    }
    const auto moments = [](torch::optim::AdamW& opt, const torch::Tensor& p) {
      auto& st = static_cast<torch::optim::AdamWParamState&>(
          *opt.state().at(c10::guts::to_string(p.unsafeGetTensorImpl())));
      EXPECT_EQ(st.step(), 20);
      return std::make_pair(st.exp_avg(), st.exp_avg_sq());
    };
    const auto [ma, va] = moments(*fused, a);
    const auto [mb, vb] = moments(reference, b);
    if (type == torch::kFloat64) {
      EXPECT_TRUE(torch::equal(a, b));
      EXPECT_TRUE(torch::equal(ma, mb) && torch::equal(va, vb));
    } else {
      EXPECT_TRUE(torch::allclose(a, b, 1e-6, 1e-7))
          << "max |difference| " << (a - b).abs().max().item<float>();
      // Moments of gradients ~1: a float ulp near 1 is 6e-8, and m cancels towards 0.
      EXPECT_TRUE(torch::allclose(ma, mb, 1e-6, 1e-7))
          << "max |difference| " << (ma - mb).abs().max().item<float>();
      EXPECT_TRUE(torch::allclose(va, vb, 1e-6, 1e-7))
          << "max |difference| " << (va - vb).abs().max().item<float>();
      EXPECT_FALSE(torch::equal(a, init));  // it did move
    }
  }
}

// The optimizer step and the clipping spread over the cores (OpenBLAS on 2 threads, so
// run_blas_tasks runs side by side) give the numbers of one core, bitwise: FusedAdamW over
// tensors larger than its chunk and smaller, against the same on one thread; clip_gradients
// against torch::nn::utils::clip_grad_norm_ (the norm and every clipped gradient), once
// clipping and once with the norm under the limit.
TEST(FusedAdamW, SpreadOverTheCoresGivesTheNumbersOfOne) {
  const int before = blas_threads();
  ASSERT_TRUE(set_blas_threads(2)) << "OpenBLAS is the BLAS (Blas.OptimisedBlasIsLoaded)";
  torch::manual_seed(5);
  TrainConfig tc;
  tc.weight_decay = 0.1;
  const std::vector<std::vector<int64_t>> shapes = {{700, 1000}, {300, 7}, {5}, {1 << 18}};
  std::vector<torch::Tensor> spread, serial;
  for (const auto& shape : shapes) {
    const torch::Tensor init = torch::randn(shape);
    spread.push_back(init.clone().requires_grad_());
    serial.push_back(init.clone().requires_grad_());
  }
  auto opt_spread = make_optimizer(spread, tc), opt_serial = make_optimizer(serial, tc);
  for (int step = 1; step <= 3; ++step) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      const torch::Tensor g = torch::randn(shapes[i]);
      spread[i].mutable_grad() = g.clone(), serial[i].mutable_grad() = g.clone();
    }
    set_blas_threads(2);
    opt_spread->step();
    set_blas_threads(1);
    opt_serial->step();
  }
  for (size_t i = 0; i < shapes.size(); ++i) EXPECT_TRUE(torch::equal(spread[i], serial[i])) << i;

  for (const double max_norm : {1.0, 1e9}) {
    std::vector<torch::Tensor> ours, torchs;
    for (const auto& shape : shapes) {
      const torch::Tensor g = torch::randn(shape);
      ours.push_back(torch::zeros(shape).requires_grad_());
      torchs.push_back(torch::zeros(shape).requires_grad_());
      ours.back().mutable_grad() = g.clone(), torchs.back().mutable_grad() = g.clone();
    }
    ours.push_back(torch::zeros({3}).requires_grad_());  // no gradient: skipped by both
    torchs.push_back(torch::zeros({3}).requires_grad_());
    set_blas_threads(2);
    const double norm = clip_gradients(ours, max_norm);
    const double reference = torch::nn::utils::clip_grad_norm_(torchs, max_norm);
    EXPECT_EQ(norm, reference);
    EXPECT_GT(norm, 1.0);
    for (size_t i = 0; i < shapes.size(); ++i)
      EXPECT_TRUE(torch::equal(ours[i].grad(), torchs[i].grad())) << max_norm << " " << i;
  }
  set_blas_threads(before);
}

// A model with the same initial weights every call, in `dtype`, and its AdamW.
std::pair<MiniMindForCausalLM, std::unique_ptr<torch::optim::AdamW>> seeded_model(
    const Config& cfg, torch::Dtype dtype) {
  torch::manual_seed(11);
  MiniMindForCausalLM model(cfg.model);
  init_weights(model);
  model->to(dtype);
  auto opt = make_optimizer(model->parameters(), cfg.train);
  return {model, std::move(opt)};
}

TEST(ShardGroup, SumsInShardOrderAndAbortFreesTheWaiting) {
  ShardGroup group(3);
  std::vector<torch::Tensor> got(3);
  run_side_by_side(3, group, [&](int s) {
    // Two rounds; float values whose sum depends on the order of addition.
    torch::Tensor t = torch::tensor({1e8f, 1.0f, -1e8f}).select(0, s).reshape({1});
    group.sum(s, t);
    torch::Tensor u = torch::full({2}, static_cast<double>(s + 1));
    group.sum(s, u, [](torch::Tensor& total) { total.mul_(10); });  // once, on the total
    got[static_cast<size_t>(s)] = torch::cat({t, u});
  });
  const float in_order = (1e8f + 1.0f) + -1e8f;  // 0 in float32; 1 in another order
  for (const auto& g : got) {
    EXPECT_EQ(g[0].item<float>(), in_order);
    EXPECT_EQ(g[1].item<float>(), 60.0f);
    EXPECT_EQ(g[2].item<float>(), 60.0f);
  }
  // A shard that fails before the sum: the others throw instead of waiting for it, and the
  // first error comes back to the caller.
  ShardGroup broken(2);
  std::atomic<int> freed{0};
  EXPECT_THROW(
      {
        try {
          run_side_by_side(2, broken, [&](int s) {
            if (s == 1) throw std::invalid_argument("shard 1 failed");
            torch::Tensor t = torch::ones({1});
            try {
              broken.sum(s, t);
            } catch (const std::runtime_error&) {
              ++freed;
              throw;
            }
          });
        } catch (const std::invalid_argument& e) {
          EXPECT_STREQ(e.what(), "shard 1 failed");
          throw;
        }
      },
      std::invalid_argument);
  EXPECT_EQ(freed.load(), 1);
}

// A micro-batch in shards side by side: the same bits run after run, and the unsplit
// micro-batch's numbers within float rounding. (tests/test_parity.cpp checks the shards
// against the PyTorch reference for every balancing method that allows them.)
TEST(ShardedMicroBatch, RepeatableAndCloseToTheWholeMicroBatch) {
  Config cfg = load_config_string(
      "model: {hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4,\n"
      "        num_key_value_heads: 2, vocab_size: 256, max_position_embeddings: 64,\n"
      "        use_moe: true, num_experts: 4, num_experts_per_tok: 2,\n"
      "        router_z_loss_coef: 0.001}\n"
      "data: {max_seq_len: 16}\n",
      "shards");
  validate_and_resolve(cfg);
  ASSERT_EQ(batch_shards(cfg.model, 5, 2), 2);
  EXPECT_EQ(batch_shards(cfg.model, 5, 1), 1);
  EXPECT_EQ(batch_shards(cfg.model, 1, 2), 1);
  torch::manual_seed(3);
  torch::Tensor rows = torch::randint(3, 256, {10, 17}, torch::kLong);  // [10, 17]
  torch::Tensor labels = rows.clone();
  labels.narrow(1, 12, 5).fill_(-100);  // padding at the end of every row
  auto run = [&](int shards, torch::Dtype dtype) {
    auto [model, opt] = seeded_model(cfg, dtype);
    int64_t next = 0;
    auto batches = [&] {  // two micro-batches of 5 rows per step
      const int64_t r = next++ % 2 * 5;
      return Batch{rows.narrow(0, r, 5), labels.narrow(0, r, 5)};
    };
    std::vector<StepStats> stats;
    for (int step = 0; step < 3; ++step) {
      StepOptions so;
      so.accumulation_steps = 2, so.grad_clip = cfg.train.grad_clip, so.lr = 1e-3;
      so.router_grads = step == 0, so.shards = shards;
      stats.push_back(optimizer_step(model, *opt, batches, so));
    }
    return std::make_pair(model, stats);
  };
  // In float64 the shards' sums equal the whole's but for rounding far below 1e-9 (AdamW
  // would turn a float32 rounding of a near-zero gradient into a step of up to lr).
  auto [whole, whole_stats] = run(1, torch::kFloat64);
  auto [a, a_stats] = run(2, torch::kFloat64);
  auto [b, b_stats] = run(2, torch::kFloat32);
  auto [c, c_stats] = run(2, torch::kFloat32);
  auto pc = c->named_parameters(), pw = whole->named_parameters();
  for (const auto& p : b->named_parameters())
    EXPECT_TRUE(torch::equal(p.value(), pc[p.key()])) << p.key() << ": not repeatable";
  double worst = 0;
  for (const auto& p : a->named_parameters())
    worst = std::max(worst, (p.value() - pw[p.key()]).abs().max().item<double>());
  EXPECT_LE(worst, 1e-9);
  for (size_t i = 0; i < 3; ++i) {
    const StepStats &s = a_stats[i], &w = whole_stats[i];
    EXPECT_EQ(b_stats[i].loss, c_stats[i].loss);
    EXPECT_EQ(b_stats[i].grad_norm, c_stats[i].grad_norm);
    EXPECT_NEAR(b_stats[i].loss, w.loss, 1e-5);  // float32 against float64
    EXPECT_NEAR(s.lm_loss, w.lm_loss, 1e-12);
    EXPECT_NEAR(s.aux_loss, w.aux_loss, 1e-12);
    EXPECT_GT(s.aux_loss, 0.0);
    EXPECT_NEAR(s.z_loss, w.z_loss, 1e-12);
    EXPECT_GT(s.z_loss, 0.0);
    EXPECT_NEAR(s.grad_norm, w.grad_norm, 1e-12);
    EXPECT_EQ(s.counts.layers, w.counts.layers) << "step " << i;
    EXPECT_EQ(s.tokens, w.tokens);
    ASSERT_EQ(s.layers.size(), 2u);
    for (size_t l = 0; l < 2; ++l) {
      const LayerStats &sl = s.layers[l], &wl = w.layers[l];
      EXPECT_NEAR(sl.aux, wl.aux, 1e-12);
      ASSERT_TRUE(sl.z && wl.z && sl.seq_max_vio && wl.seq_max_vio);
      EXPECT_NEAR(*sl.z, *wl.z, 1e-12);
      EXPECT_EQ(*sl.seq_max_vio, *wl.seq_max_vio);
    }
  }
  ASSERT_EQ(a_stats[0].layers.size(), 2u);
  for (size_t l = 0; l < 2; ++l) {
    const LayerStats &al = a_stats[0].layers[l], &wl = whole_stats[0].layers[l];
    ASSERT_TRUE(al.grad_lm && wl.grad_lm && al.grad_balance && wl.grad_balance);
    EXPECT_NEAR(*al.grad_lm, *wl.grad_lm, 1e-12);
    EXPECT_NEAR(*al.grad_balance, *wl.grad_balance, 1e-12);
    EXPECT_GT(*al.grad_balance, 0.0);
  }
  std::printf("5 rows in 2 shards vs whole, 3 steps (fp64): max |weight diff| %.3g\n", worst);

  // A shard that fails (an id outside the vocabulary in its rows only) fails the step
  // instead of leaving the other shard waiting.
  torch::Tensor bad = rows.narrow(0, 0, 5).clone();
  bad[4][3] = 999;
  torch::manual_seed(11);
  MiniMindForCausalLM model(cfg.model);
  auto opt = make_optimizer(model->parameters(), cfg.train);
  StepOptions two_shards;
  two_shards.lr = 1e-3, two_shards.shards = 2;
  EXPECT_ANY_THROW(optimizer_step(
      model, *opt,
      [&] {
        return Batch{bad, bad};
      },
      two_shards));
}

TEST(Checkpointer, SavesAtTheIntervalAtTheLastStepAndWhenStopping) {
  const std::string dir = temp_dir("checkpointer");
  const Config cfg = tiny_config(dir, {"train.checkpoint_interval=4", "train.keep_checkpoints=5"});
  torch::manual_seed(1);
  MiniMindForCausalLM model(cfg.model);
  init_weights(model);
  auto opt = make_optimizer(model->parameters(), cfg.train);
  TrainState state;
  state.config_yaml = config_to_yaml(cfg);
  Recorder rec;
  Checkpointer checkpointer(model, *opt, state, dir, cfg.train, rec);
  const StepStats st;
  for (int64_t step = 1; step <= 9; ++step) {
    state.step = step;
    checkpointer.on_step_end(step_info(step, 10, st), /*last=*/step == 6);  // 6: a stop request
  }
  std::vector<int64_t> saved;
  for (const auto& c : rec.checkpoints) saved.push_back(c.step);
  EXPECT_EQ(saved, (std::vector<int64_t>{4, 6, 8}));
  EXPECT_EQ(read_checkpoint_state(rec.checkpoints[1].dir).step, 6);
  EXPECT_DOUBLE_EQ(read_checkpoint_state(rec.checkpoints[1].dir).elapsed_seconds,
                   22.0);  // run_seconds
  EXPECT_EQ(*latest_checkpoint(dir), rec.checkpoints[2].dir);
}

// Accumulation is exact in exact arithmetic; the test runs in float64 so that float32
// rounding (which AdamW's first step amplifies for gradients near its eps = 1e-8: a
// gradient of 1e-9 +- 1e-10 moves its weight by lr * 1e-2) does not hide a real error.
// In float32 the gradients themselves agree to ~1e-9 (printed).
TEST(GradientAccumulation, EightByOneEqualsFourByTwo) {
  torch::set_num_threads(1);
  Config cfg = load_config_string(
      "model: {hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4,\n"
      "        num_key_value_heads: 2, vocab_size: 256, max_position_embeddings: 64}\n"
      "data: {max_seq_len: 16}\n",
      "acc");
  validate_and_resolve(cfg);
  torch::manual_seed(3);
  torch::Tensor rows = torch::randint(3, 256, {8, 17}, torch::kLong);  // pack rows, no padding
  auto run = [&](int64_t batch, int64_t accumulation, torch::Dtype dtype, bool step) {
    auto [model, opt] = seeded_model(cfg, dtype);
    int64_t next = 0;
    auto batches = [&] {
      torch::Tensor b = rows.narrow(0, next, batch);
      next += batch;
      return Batch{b, b};
    };
    if (step) {
      StepOptions so;
      so.accumulation_steps = accumulation, so.grad_clip = cfg.train.grad_clip, so.lr = 5e-4;
      optimizer_step(model, *opt, batches, so);
    } else {  // the micro-steps only, to compare the accumulated gradients
      for (int64_t i = 0; i < accumulation; ++i) {
        Batch b = batches();
        ForwardOutput out = model(b.input_ids, b.labels);
        ((out.loss + out.aux_loss) / static_cast<double>(accumulation)).backward();
      }
    }
    return model;
  };
  auto max_diff = [](MiniMindForCausalLM& a, MiniMindForCausalLM& b, bool grads) {
    auto pb = b->named_parameters();
    double worst = 0;
    for (const auto& p : a->named_parameters()) {
      torch::Tensor x = grads ? p.value().grad() : p.value(),
                    y = grads ? pb[p.key()].grad() : pb[p.key()];
      worst = std::max(worst, (x - y).abs().max().item<double>());
    }
    return worst;
  };
  MiniMindForCausalLM a = run(8, 1, torch::kFloat64, true), b = run(4, 2, torch::kFloat64, true);
  const double params64 = max_diff(a, b, false);
  EXPECT_LE(params64, 1e-6);
  MiniMindForCausalLM ga = run(8, 1, torch::kFloat32, false),
                      gb = run(4, 2, torch::kFloat32, false);
  const double grads32 = max_diff(ga, gb, true);
  EXPECT_LE(grads32, 1e-6);
  std::printf(
      "batch 8 x 1 vs 4 x 2: max |param diff| after one AdamW step (fp64) %.3g, "
      "max |grad diff| (fp32) %.3g\n",
      params64, grads32);
}

// A tiny model, its optimizer and a state to checkpoint, in a fresh directory.
struct CheckpointSetup {
  explicit CheckpointSetup(const std::string& name) : dir(temp_dir(name)), cfg(tiny_config(dir)) {
    torch::manual_seed(1);
    model = MiniMindForCausalLM(cfg.model);
    init_weights(model);
    opt = make_optimizer(model->parameters(), cfg.train);
    state.config_yaml = config_to_yaml(cfg);
  }
  std::string dir;
  Config cfg;
  MiniMindForCausalLM model{nullptr};
  std::unique_ptr<torch::optim::AdamW> opt;
  TrainState state;
};

TEST(Checkpoint, CrashWhileWritingLeavesPreviousLoadable) {
  CheckpointSetup c("ckcrash");
  auto& [dir, cfg, model, opt, s] = c;
  s.step = 3;
  save_checkpoint(dir, model, *opt, s, 3);
  torch::Tensor before = model->named_parameters()["model.norm.weight"].clone();
  {
    torch::NoGradGuard ng;
    for (auto& p : model->parameters()) p.add_(1.0);
  }
  s.step = 6;
  EXPECT_THROW(save_checkpoint(dir, model, *opt, s, 3,
                               [](const std::string& file) {
                                 if (file == "optimizer.pt")
                                   throw std::runtime_error("simulated crash");
                               }),
               std::runtime_error);
  auto latest = latest_checkpoint(dir);
  ASSERT_TRUE(latest.has_value());
  EXPECT_NE(latest->find("step_00000003"), std::string::npos);
  MiniMindForCausalLM fresh(cfg.model);
  auto opt2 = make_optimizer(fresh->parameters(), cfg.train);
  TrainState back = load_checkpoint(*latest, fresh, *opt2);
  EXPECT_EQ(back.step, 3);
  EXPECT_TRUE(torch::equal(fresh->named_parameters()["model.norm.weight"], before));
}

TEST(Checkpoint, IncompleteAndWrongVersionAreRefusedWithHint) {
  CheckpointSetup c("ckbad");
  auto& [dir, cfg, model, opt, s] = c;
  s.step = 1;
  const std::string path = save_checkpoint(dir, model, *opt, s, 3);
  fs::remove(path + "/optimizer.pt");
  try {
    load_checkpoint(path, model, *opt);
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("incomplete (no optimizer.pt)"), std::string::npos)
        << e.what();
  }
  const std::string p2 = save_checkpoint(dir, model, *opt, s, 3);
  nlohmann::json j = nlohmann::json::parse(std::ifstream(p2 + "/state.json"));
  j["format_version"] = 99;
  std::ofstream(p2 + "/state.json") << j.dump();
  try {
    load_checkpoint(p2, model, *opt);
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("format version 99"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("hint"), std::string::npos) << e.what();
  }
}

// Every parameter's AdamW state (step, both moments) as name -> tensor, for comparisons.
std::map<std::string, torch::Tensor> adamw_state(torch::optim::AdamW& opt) {
  std::map<std::string, torch::Tensor> out;
  const auto& params = opt.param_groups()[0].params();
  for (size_t i = 0; i < params.size(); ++i) {
    const auto it = opt.state().find(c10::guts::to_string(params[i].unsafeGetTensorImpl()));
    if (it == opt.state().end()) continue;
    const auto& st = static_cast<const torch::optim::AdamWParamState&>(*it->second);
    out[std::to_string(i) + ".step"] = torch::tensor(st.step());
    out[std::to_string(i) + ".exp_avg"] = st.exp_avg();
    out[std::to_string(i) + ".exp_avg_sq"] = st.exp_avg_sq();
  }
  return out;
}

void expect_same_state(const std::map<std::string, torch::Tensor>& a,
                       const std::map<std::string, torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_TRUE(torch::equal(t, b.at(name))) << name;
  }
}

// optimizer.pt is a plain {name: tensor} pickle (format 2) read by the bounds-checked reader;
// format 1 files (torch::save of the optimizer) still load; a damaged file changes nothing.
TEST(Checkpoint, OptimizerStateRoundTripsInBothFormats) {
  CheckpointSetup c("ckoptim");
  auto& [dir, cfg, model, opt, s] = c;
  for (int i = 0; i < 2; ++i) {
    for (auto& p : model->parameters()) p.mutable_grad() = torch::randn_like(p);
    opt->step();
  }
  const auto trained = adamw_state(*opt);
  ASSERT_EQ(trained.size(), 3 * model->parameters().size());
  s.step = 2;
  const std::string path = save_checkpoint(dir, model, *opt, s, 3);
  EXPECT_EQ(read_tensor_dict(path + "/optimizer.pt").size(), trained.size());

  MiniMindForCausalLM fresh(cfg.model);
  auto opt2 = make_optimizer(fresh->parameters(), cfg.train);
  EXPECT_EQ(load_checkpoint(path, fresh, *opt2).format_version, 2);
  expect_same_state(adamw_state(*opt2), trained);

  // A checkpoint written by the format-1 trainer.
  torch::save(*opt, path + "/optimizer.pt");
  nlohmann::json j = nlohmann::json::parse(std::ifstream(path + "/state.json"));
  j["format_version"] = 1;
  std::ofstream(path + "/state.json") << j.dump();
  auto opt3 = make_optimizer(fresh->parameters(), cfg.train);
  EXPECT_EQ(load_checkpoint(path, fresh, *opt3).format_version, 1);
  expect_same_state(adamw_state(*opt3), trained);

  // Format 2 with one moment of the wrong shape: an error naming the entry, state untouched.
  j["format_version"] = 2;
  std::ofstream(path + "/state.json") << j.dump();
  c10::Dict<std::string, torch::Tensor> bad;
  bad.insert("0.step", torch::tensor(int64_t{2}));
  bad.insert("0.exp_avg", torch::zeros({3}));
  bad.insert("0.exp_avg_sq", torch::zeros({3}));
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(bad));
  std::ofstream(path + "/optimizer.pt", std::ios::binary).write(bytes.data(), bytes.size());
  try {
    load_checkpoint(path, fresh, *opt3);
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("entry '0.exp_avg' has shape [3]"), std::string::npos)
        << e.what();
  }
  expect_same_state(adamw_state(*opt3), trained);
}

TEST(Checkpoint, DataPositionInRowsAndOlderBatchCounts) {
  CheckpointSetup c("ckrows");
  auto& [dir, cfg, model, opt, s] = c;
  s.step = 3;
  s.loader_rows = 96;
  const std::string path = save_checkpoint(dir, model, *opt, s, 3);
  EXPECT_EQ(read_checkpoint_state(path).loader_rows, 96);
  // A checkpoint from before rows were stored: a one-process batch count.
  nlohmann::json j = nlohmann::json::parse(std::ifstream(path + "/state.json"));
  j.erase("loader_rows");
  j["loader_position"] = 12;
  std::ofstream(path + "/state.json") << j.dump();
  TrainState old = read_checkpoint_state(path);
  EXPECT_EQ(old.loader_rows, -1);
  EXPECT_EQ(old.loader_batches, 12);
}

TEST(Checkpoint, KeepsOnlyTheNewest) {
  CheckpointSetup c("ckkeep");
  auto& [dir, cfg, model, opt, s] = c;
  for (int64_t step : {1, 2, 3, 4}) {
    s.step = step;
    save_checkpoint(dir, model, *opt, s, 2);
  }
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir + "/checkpoints"))
    names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"step_00000003", "step_00000004"}));
}

TEST(Trainer, ShortRunLogsWhatItTrained) {
  const std::string dir = temp_dir("e2e");
  Config cfg = tiny_config(
      dir, {"train.max_steps=30", "train.eval_interval=10", "train.checkpoint_interval=10"});
  TrainOptions options;
  options.out_dir = dir + "/run";
  TrainResult r = train(cfg, options);
  ASSERT_EQ(r.step_losses.size(), 30u);
  EXPECT_EQ(r.step, 30);
  EXPECT_EQ(r.tokens, 30 * 2 * 4 * 33);  // steps x micro-batches x rows x (max_seq_len + 1)

  const std::string run = dir + "/run";
  for (const char* f :
       {"config.yaml", "tokenizer.model", "train.log", "metrics.jsonl", "expert_load.jsonl"})
    EXPECT_TRUE(fs::exists(run + "/" + f)) << f;
  EXPECT_EQ(config_to_yaml(load_config_file(run + "/config.yaml")), config_to_yaml(cfg));
  const RunLogs logs = read_run_logs(run);
  // One train record every 2 steps: the mean of its two steps' losses, as the run returned them.
  ASSERT_EQ(logs.train.size(), 15u);
  for (size_t i = 0; i < logs.train.size(); ++i) {
    const TrainRecord& t = logs.train[i];
    EXPECT_EQ(t.step, 2 * static_cast<int64_t>(i) + 2);
    EXPECT_EQ(t.tokens, t.step * 2 * 4 * 33);
    EXPECT_DOUBLE_EQ(t.loss, (r.step_losses[2 * i] + r.step_losses[2 * i + 1]) / 2.0);
    EXPECT_NEAR(t.loss, t.lm_loss + t.aux_loss, 1e-12);
    EXPECT_DOUBLE_EQ(t.lr, learning_rate_at(t.step - 1, 30, 3e-3, 0));
  }
  // Evaluations at steps 0, 10, 20, 30; the first and last are the run's.
  ASSERT_EQ(logs.eval.size(), 4u);
  EXPECT_EQ(logs.eval[0].step, 0);
  EXPECT_EQ(logs.eval[3].step, 30);
  EXPECT_EQ(logs.eval[0].val_loss, r.first_val_loss);
  EXPECT_EQ(logs.eval[3].val_loss, r.last_val_loss);
  EXPECT_LT(r.last_val_loss, r.first_val_loss);
  // One load record per (step, MoE layer): 2 micro-batches x 4 rows x 33 tokens x top-2.
  ASSERT_EQ(logs.train_load.size(), 2u);
  for (const auto& [layer, records] : logs.train_load) {
    ASSERT_EQ(records.size(), 30u) << layer;
    for (const LoadRecord& l : records) {
      EXPECT_EQ(std::accumulate(l.counts.begin(), l.counts.end(), int64_t{0}), 2 * 4 * 33 * 2);
      ASSERT_TRUE(l.aux_unscaled.has_value());  // coef 5e-4: each layer's aux is logged
      EXPECT_GE(*l.aux_unscaled, 2.0 - 1e-9);   // Switch's aux is >= k = 2 (top-2 form)
    }
  }
  // Evaluation loads count every real validation token k times.
  EXPECT_EQ(logs.eval_load.at(0).size(), 4u);
  // The checkpoint's weights are MiniMind-format and load strictly into a fresh model.
  MiniMindForCausalLM check(cfg.model);
  EXPECT_NO_THROW(load_weights(check, run + "/checkpoints/step_00000030/model.pth"));
}

TEST(Trainer, ResumeContinuesWithTheSameLossesAndLogs) {
  const std::string dir = temp_dir("resume");
  Config cfg = tiny_config(dir);
  TrainOptions full_options;
  full_options.out_dir = dir + "/full";
  TrainResult full = train(cfg, full_options);
  ASSERT_EQ(full.step_losses.size(), 8u);

  TrainOptions first_options;
  first_options.out_dir = dir + "/split";
  first_options.after_step = [](int64_t step, MiniMindForCausalLM&) { return step == 5; };
  TrainResult first = train(cfg, first_options);
  EXPECT_TRUE(first.interrupted);
  EXPECT_EQ(first.step, 5);
  TrainOptions resume;
  resume.out_dir = dir + "/split";
  resume.resume = true;
  TrainResult second = train(cfg, resume);
  EXPECT_FALSE(second.interrupted);
  std::vector<double> joined = first.step_losses;
  joined.insert(joined.end(), second.step_losses.begin(), second.step_losses.end());
  // One thread: bitwise the same sequence of losses.
  EXPECT_EQ(joined, full.step_losses);
  // metrics.jsonl holds each step once, and the per-step load records match the full run's.
  const RunLogs split_logs = read_run_logs(dir + "/split"),
                full_logs = read_run_logs(dir + "/full");
  std::vector<int64_t> steps;
  for (const auto& t : split_logs.train) steps.push_back(t.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{2, 4, 6, 8}));
  for (const auto& [layer, records] : full_logs.train_load) {
    ASSERT_EQ(split_logs.train_load.at(layer).size(), records.size());
    for (size_t i = 0; i < records.size(); ++i)
      EXPECT_EQ(split_logs.train_load.at(layer)[i].counts, records[i].counts) << layer << " " << i;
  }

  // A different architecture is refused, naming the key.
  Config other = tiny_config(dir, {"model.hidden_size=64"});
  EXPECT_NE(
      error_of<CheckpointError>([&] { train(other, resume); }).find("model.hidden_size: 32 -> 64"),
      std::string::npos);
  // Starting again over an existing run needs --overwrite.
  TrainOptions again;
  again.out_dir = dir + "/split";
  EXPECT_NE(error_of<TrainError>([&] {
              train(cfg, again);
            }).find("hint: continue it with --resume (from step_00000008)"),
            std::string::npos);
}

// Two threads: each micro-batch of 4 rows in 2 shards side by side; a resumed run still
// repeats the uninterrupted one bit for bit.
TEST(Trainer, ResumeInShardsContinuesWithTheSameLosses) {
  const std::string dir = temp_dir("resume_shards");
  Config cfg = tiny_config(dir, {"run.threads=2"});
  ASSERT_EQ(batch_shards(cfg.model, cfg.train.batch_size, 2), 2);
  TrainOptions full_options;
  full_options.out_dir = dir + "/full";
  const TrainResult full = train(cfg, full_options);
  EXPECT_NE(read_text(dir + "/full/train.log").find("each micro-batch in 2 shards side by side"),
            std::string::npos);
  TrainOptions first_options;
  first_options.out_dir = dir + "/split";
  first_options.after_step = [](int64_t step, MiniMindForCausalLM&) { return step == 3; };
  const TrainResult first = train(cfg, first_options);
  ASSERT_EQ(first.step, 3);
  TrainOptions resume;
  resume.out_dir = dir + "/split";
  resume.resume = true;
  const TrainResult second = train(cfg, resume);
  std::vector<double> joined = first.step_losses;
  joined.insert(joined.end(), second.step_losses.begin(), second.step_losses.end());
  EXPECT_EQ(joined, full.step_losses);
}

TEST(Trainer, StopRequestSavesACheckpointAndStops) {
  const std::string dir = temp_dir("stop");
  Config cfg = tiny_config(dir, {"train.checkpoint_interval=100"});
  StopFlag stop;
  TrainOptions options;
  options.out_dir = dir + "/run";
  options.stop = &stop;
  // What the main's SIGINT handler does, here after step 2.
  options.after_step = [&](int64_t step, MiniMindForCausalLM&) {
    if (step == 2) stop.request(SIGINT);
    return false;
  };
  TrainResult r = train(cfg, options);
  EXPECT_TRUE(r.interrupted);
  EXPECT_EQ(r.signal, SIGINT);
  EXPECT_EQ(r.step, 2);
  auto latest = latest_checkpoint(dir + "/run");
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(read_checkpoint_state(*latest).step, 2);
}

TEST(Trainer, NonFiniteLossStopsAndKeepsLastGoodCheckpoint) {
  const std::string dir = temp_dir("nan");
  Config cfg = tiny_config(dir, {"train.checkpoint_interval=2"});
  TrainOptions options;
  options.out_dir = dir + "/run";
  options.after_step = [](int64_t step, MiniMindForCausalLM& m) {
    if (step == 3) {
      torch::NoGradGuard ng;
      m->named_parameters()["model.norm.weight"].fill_(NAN);
    }
    return false;
  };
  const std::string msg = error_of<TrainError>([&] { train(cfg, options); });
  EXPECT_NE(msg.find("non-finite loss at step 4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("step_00000002"), std::string::npos) << msg;
  EXPECT_NE(msg.find("hint: try a lower train.learning_rate"), std::string::npos) << msg;
  auto latest = latest_checkpoint(dir + "/run");
  ASSERT_TRUE(latest.has_value());
  MiniMindForCausalLM model(cfg.model);
  auto opt = make_optimizer(model->parameters(), cfg.train);
  EXPECT_EQ(load_checkpoint(*latest, model, *opt).step, 2);
  EXPECT_TRUE(torch::isfinite(model->named_parameters()["model.norm.weight"]).all().item<bool>());
}

TEST(Trainer, CollapseEventsAreLogged) {
  const std::string dir = temp_dir("collapse");
  // Thresholds so low that any layer counts as collapsed: the event must reach events.jsonl.
  Config cfg = tiny_config(dir, {"log.interval=1", "log.collapse_max_share=0.0",
                                 "log.collapse_patience=2", "train.max_steps=3"});
  TrainOptions low;
  low.out_dir = dir + "/low";
  train(cfg, low);
  const RunLogs logs = read_run_logs(dir + "/low");
  ASSERT_EQ(logs.collapses.size(), 2u);  // one per MoE layer, at step 2
  for (int64_t layer : {0, 1}) {
    const CollapseRecord& c = logs.collapses[layer];
    EXPECT_EQ(c.layer, layer);
    EXPECT_EQ(c.step, 2);
    EXPECT_EQ(c.since_step, 1);
    // The expert named is the layer's largest over the interval of step 2.
    const LoadRecord& load = logs.train_load.at(layer).at(1);
    EXPECT_EQ(c.expert, load.max_expert);
    EXPECT_DOUBLE_EQ(c.max_share, load.max_share);
  }
  // With the defaults (0.9, one dead expert, 3 intervals) a short healthy run stays quiet.
  Config quiet = tiny_config(dir, {"log.interval=1", "train.max_steps=3"});
  TrainOptions options;
  options.out_dir = dir + "/default";
  train(quiet, options);
  EXPECT_TRUE(read_run_logs(dir + "/default").collapses.empty());
}

TEST(RunDirectory, OneOwnerAtATime) {
  const std::string dir = temp_dir("lock");
  Config cfg = tiny_config(dir);
  TrainOptions options;
  options.out_dir = dir + "/run";
  {
    fs::create_directories(options.out_dir);
    RunLock other = RunLock::acquire(options.out_dir);  // another trainer owns the run
    for (bool resume : {false, true}) {
      options.resume = resume;
      options.overwrite = !resume;
      const std::string msg = error_of<TrainError>([&] { train(cfg, options); });
      EXPECT_NE(
          msg.find("is in use by another minimind-train (PID " + std::to_string(::getpid()) + ")"),
          std::string::npos)
          << msg;
    }
  }
  options.resume = false, options.overwrite = false;
  EXPECT_EQ(train(cfg, options).step, 8);  // free again once the owner is gone
  // The run keeps its lock file; --overwrite keeps it too and removes everything else.
  EXPECT_TRUE(fs::exists(options.out_dir + "/.lock"));
}

TEST(RunDirectory, OverwriteChecksTheDataBeforeDeletingTheOldRun) {
  const std::string dir = temp_dir("overwrite");
  TrainOptions options;
  options.out_dir = dir + "/run";
  train(tiny_config(dir), options);
  Config typo = tiny_config(dir);
  apply_override(typo, "data.train=" + dir + "/corpsu.jsonl");
  options.overwrite = true;
  const std::string msg = error_of<DataError>([&] { train(typo, options); });
  EXPECT_NE(msg.find("data.train (--set data.train=" + dir + "/corpsu.jsonl): '" + dir +
                     "/corpsu.jsonl' does not exist"),
            std::string::npos)
      << msg;
  EXPECT_TRUE(latest_checkpoint(options.out_dir).has_value());  // the old run is intact
}

// A checkpoint that does not fit on the disk: a clear error, nothing half-written left,
// earlier checkpoints intact, and --resume works once there is space again. Needs root to
// mount a small tmpfs as the run directory.
TEST(RunDirectory, DiskFullDuringACheckpoint) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to mount a tmpfs (run the suite as root)";
  const std::string dir = temp_dir("diskfull");
  const std::string run = dir + "/run";
  const test::TmpfsMount disk(run, "8m");
  ASSERT_TRUE(disk.mounted);
  Config cfg = tiny_config(dir, {"train.max_steps=8", "train.checkpoint_interval=3"});
  TrainOptions options;
  options.out_dir = run;
  // After the checkpoint of step 3, fill the disk to the last few KB.
  options.after_step = [&](int64_t step, MiniMindForCausalLM&) {
    if (step == 4) {
      const auto space = fs::space(run);
      std::ofstream fill(run + "/filler", std::ios::binary);
      const std::string block(4096, 'x');
      for (uintmax_t n = 0; n + 2 * 4096 < space.available; n += 4096) fill << block;
    }
    return false;
  };
  const std::string msg = error_of<CheckpointError>([&] { train(cfg, options); });
  EXPECT_NE(msg.find("cannot write checkpoint " + run + "/checkpoints/step_00000006"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
  EXPECT_NE(msg.find("MB free on that file system"), std::string::npos) << msg;
  EXPECT_NE(msg.find("hint: free some space"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(run + "/checkpoints/.tmp-step_00000006"));
  ASSERT_EQ(*latest_checkpoint(run), run + "/checkpoints/step_00000003");
  fs::remove(run + "/filler");
  options.resume = true;
  options.after_step = {};
  const TrainResult resumed = train(cfg, options);
  EXPECT_EQ(resumed.step, 8);
  EXPECT_EQ(resumed.step_losses.size(), 5u);  // steps 4..8 again
}

TEST(RunDirectory, ResumeRemovesAHalfWrittenCheckpoint) {
  const std::string dir = temp_dir("halfwritten");
  TrainOptions options;
  options.out_dir = dir + "/run";
  options.after_step = [](int64_t step, MiniMindForCausalLM&) { return step == 3; };
  train(tiny_config(dir), options);
  // What a kill -9 in the middle of writing step 7 leaves (a step this run does not save again).
  const std::string tmp = options.out_dir + "/checkpoints/.tmp-step_00000007";
  fs::create_directories(tmp);
  write_text(tmp + "/model.pth", "partial");
  options.resume = true;
  options.after_step = {};
  EXPECT_EQ(train(tiny_config(dir), options).step, 8);
  EXPECT_FALSE(fs::exists(tmp));
  // Resumed once more, the finished run says so and changes nothing.
  const std::string metrics = read_text(options.out_dir + "/metrics.jsonl");
  const TrainResult again = train(tiny_config(dir), options);
  EXPECT_EQ(again.start_step, 8);
  EXPECT_EQ(again.step, 8);
  EXPECT_TRUE(again.step_losses.empty());
  EXPECT_EQ(read_text(options.out_dir + "/metrics.jsonl"), metrics);
  EXPECT_NE(read_text(options.out_dir + "/train.log").find("is already complete: step 8"),
            std::string::npos);
}

TEST(Checkpoint, StateFieldsAreNamedWhenMissingOrMistyped) {
  CheckpointSetup c("ckstate");
  auto& [dir, cfg, model, opt, s] = c;
  const std::string path = save_checkpoint(dir, model, *opt, s, 3);
  const std::string state = path + "/state.json";
  nlohmann::json j = nlohmann::json::parse(read_text(state));
  j.erase("tokens");
  write_text(state, j.dump());
  std::string msg = error_of<CheckpointError>([&] { read_checkpoint_state(path); });
  EXPECT_NE(msg.find(state + "': field 'tokens' is missing"), std::string::npos) << msg;
  j["tokens"] = "many";
  write_text(state, j.dump());
  msg = error_of<CheckpointError>([&] { read_checkpoint_state(path); });
  EXPECT_NE(msg.find("field 'tokens' is not an integer"), std::string::npos) << msg;
}

TEST(Trainer, AFatalErrorIsInTrainLog) {
  const std::string dir = temp_dir("fatal");
  Config cfg = tiny_config(dir, {"train.checkpoint_interval=100"});  // fails before any
  TrainOptions options;
  options.out_dir = dir + "/run";
  options.after_step = [](int64_t step, MiniMindForCausalLM& m) {
    torch::NoGradGuard ng;
    if (step == 2) m->named_parameters()["model.norm.weight"].fill_(NAN);
    return false;
  };
  EXPECT_THROW(train(cfg, options), TrainError);
  EXPECT_NE(read_text(options.out_dir + "/train.log").find("[error] non-finite loss at step 3"),
            std::string::npos);
  // No checkpoint to continue from: the advice is --overwrite, whether or not --resume was
  // given (it used to send each to the other).
  options.after_step = {};
  std::string again = error_of<TrainError>([&] { train(cfg, options); });
  EXPECT_NE(again.find("stopped before its first checkpoint"), std::string::npos) << again;
  EXPECT_NE(again.find("--overwrite"), std::string::npos) << again;
  EXPECT_EQ(again.find("--resume"), std::string::npos) << again;
  options.resume = true;
  again = error_of<TrainError>([&] { train(cfg, options); });
  EXPECT_NE(again.find("stopped before its first one"), std::string::npos) << again;
  EXPECT_NE(again.find("with --overwrite instead of --resume"), std::string::npos) << again;
}

TEST(Trainer, ResumeKeepsTheRunsTokenizerWhenTheCorpusChanged) {
  const std::string dir = temp_dir("keeptok");
  Config cfg = tiny_config(dir);
  TrainOptions options;
  options.out_dir = dir + "/run";
  options.after_step = [](int64_t step, MiniMindForCausalLM&) { return step == 4; };
  train(cfg, options);
  const std::string tokenizer = read_text(options.out_dir + "/tokenizer.model");
  // The corpus at data.train changes (another 200 records): a fresh run would train
  // another tokenizer on it.
  std::ofstream(cfg.data.train, std::ios::app)
      << read_text(source_path("data/austen.jsonl")).substr(0, 400000);
  options.resume = true;
  options.after_step = {};
  EXPECT_EQ(train(cfg, options).step, 8);
  EXPECT_EQ(read_text(options.out_dir + "/tokenizer.model"), tokenizer);
}

// A run stopped in the middle of a log interval and resumed logs what the uninterrupted run
// logged: the interval's means and the collapse watcher's streaks are in the checkpoint.
// The balancing lab in the trainer: the bias, z and dropped figures reach the logs, an
// interrupted run resumes to the same losses, bias and logs, and resuming with another
// balancing method is refused naming the keys.
TEST(Trainer, BalancingLabLogsAndResumes) {
  const std::string dir = temp_dir("lablogs");
  const std::vector<std::string> lab = {
      "model.scoring_func=sigmoid",     "model.router_bias_update_rate=0.01",
      "model.router_z_loss_coef=0.001", "model.capacity_factor=1.0",
      "model.n_shared_experts=1",       "model.aux_loss_scope=global",
      "train.checkpoint_interval=100"};
  const Config cfg = tiny_config(dir, lab);
  TrainOptions whole;
  whole.out_dir = dir + "/whole";
  const TrainResult full = train(cfg, whole);
  TrainOptions split;
  split.out_dir = dir + "/split";
  split.after_step = [](int64_t step, MiniMindForCausalLM&) { return step == 5; };
  const TrainResult first = train(cfg, split);
  split.resume = true;
  split.after_step = {};
  const TrainResult second = train(cfg, split);
  std::vector<double> joined = first.step_losses;
  joined.insert(joined.end(), second.step_losses.begin(), second.step_losses.end());
  EXPECT_EQ(joined, full.step_losses);  // one thread: bitwise, bias restored from the checkpoint

  const RunLogs a = read_run_logs(whole.out_dir), b = read_run_logs(split.out_dir);
  for (const TrainRecord& t : a.train) {
    ASSERT_TRUE(t.z_loss && t.dropped) << "step " << t.step;
    EXPECT_GT(*t.z_loss, 0.0);
    EXPECT_GE(*t.dropped, 0.0);
    EXPECT_LT(*t.dropped, 1.0);
  }
  ASSERT_EQ(a.train_load.size(), 2u);
  for (const auto& [layer, records] : a.train_load) {
    ASSERT_EQ(records.size(), 8u);
    std::vector<double> expected_bias(4, 0.0);
    for (size_t i = 0; i < records.size(); ++i) {
      const LoadRecord& r = records[i];
      ASSERT_TRUE(r.stats.z && r.dropped && r.stats.bias && r.stats.seq_max_vio)
          << "step " << r.step;
      EXPECT_GT(*r.stats.z, 0.0);
      EXPECT_GE(*r.stats.seq_max_vio,
                r.max_vio - 1e-12);  // a row is at least as unbalanced as the step
      // The bias moves by the sign rule from the logged counts of its own step.
      const double mean = std::accumulate(r.counts.begin(), r.counts.end(), 0.0) / 4.0;
      for (size_t e = 0; e < 4; ++e) {
        const double c = static_cast<double>(r.counts[e]);
        expected_bias[e] += 0.01 * static_cast<double>((mean > c) - (mean < c));
        EXPECT_NEAR((*r.stats.bias)[e], expected_bias[e], 1e-6)
            << "layer " << layer << " step " << r.step;
      }
      const LoadRecord& resumed = b.train_load.at(layer).at(i);
      EXPECT_EQ(nlohmann::json(resumed), nlohmann::json(r)) << "step " << r.step;
    }
  }
  // Another balancing method on resume: refused, naming the keys.
  std::vector<std::string> other_lab = lab;
  other_lab[0] = "model.scoring_func=softmax";
  other_lab.push_back("model.capacity_drop_policy=position");
  const Config other = tiny_config(dir, other_lab);
  TrainOptions resume_other;
  resume_other.out_dir = dir + "/split";
  resume_other.resume = true;
  const std::string msg = error_of<CheckpointError>([&] { train(other, resume_other); });
  EXPECT_NE(msg.find("model.scoring_func: \"sigmoid\" -> \"softmax\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.capacity_drop_policy: \"probs\" -> \"position\""), std::string::npos)
      << msg;
}

// MiniMind #858 on the shipped preset: top-1 with the single weight renormalised to 1.0
// starves the router of LM gradient. Its layers stay below log.uninformative_mi and the
// warning fires; the shipped preset (norm_topk_prob false) stays quiet. 60 steps each.
TEST(Trainer, UninformativeWarningOnMiniMind858NotOnThePreset) {
  const std::string dir = test::temp_dir("uninformative");
  std::map<std::string, RunLogs> runs;
  for (const char* norm : {"false", "true"}) {
    Config cfg =
        load_config(
            source_path("configs/moe.yaml"),
            {"train.max_steps=60", "train.eval_interval=1000", "train.checkpoint_interval=1000",
             "model.norm_topk_prob=" + std::string(norm),
             "data.train=" + source_path("data/austen.jsonl"), "data.cache_dir=" + dir + "/cache"})
            .config;
    TrainOptions options;
    options.out_dir = dir + "/" + norm;
    train(cfg, options);
    runs[norm] = read_run_logs(options.out_dir);
  }
  EXPECT_TRUE(runs["false"].uninformative.empty()) << runs["false"].uninformative.front().message;
  ASSERT_FALSE(runs["true"].uninformative.empty());
  // Every layer: the LM loss sends its router no gradient (layers 2 and 3 also have MI below
  // 0.01; layers 0 and 1 reach 0.01-0.02 from the aux loss alone).
  EXPECT_EQ(runs["true"].uninformative.size(), 4u);
  for (const UninformativeRecord& u : runs["true"].uninformative) {
    EXPECT_LT(u.mi, 0.03);
    EXPECT_GT(u.step, 30);  // after warm-up (20) and one log interval
    // The LM part of the router's gradient is rounding noise next to the aux loss's.
    ASSERT_TRUE(u.grad_lm && u.grad_balance);
    EXPECT_LT(*u.grad_lm, kStarvedGradientRatio * *u.grad_balance) << u.message;
  }
  // Every MoE load record of a log step carries the router gradient by source.
  const auto& l0 = runs["false"].train_load.at(0);
  for (const LoadRecord& r : l0) EXPECT_EQ(r.stats.grad_lm.has_value(), r.step % 10 == 0) << r.step;
  EXPECT_GT(*l0.back().stats.grad_lm, 1e-4);
}

TEST(Trainer, ResumeMidIntervalLogsTheSameMonitoring) {
  const std::string dir = temp_dir("resumelogs");
  const Config cfg = tiny_config(dir, {"log.interval=2", "log.collapse_max_share=0.0",
                                       "log.collapse_patience=3", "train.checkpoint_interval=100"});
  TrainOptions whole;
  whole.out_dir = dir + "/whole";
  train(cfg, whole);
  TrainOptions split;
  split.out_dir = dir + "/split";
  split.after_step = [](int64_t step, MiniMindForCausalLM&) { return step == 5; };
  train(cfg, split);
  split.resume = true;
  split.after_step = {};
  train(cfg, split);
  const RunLogs a = read_run_logs(whole.out_dir), b = read_run_logs(split.out_dir);
  ASSERT_EQ(a.train.size(), 4u);
  ASSERT_EQ(b.train.size(), a.train.size());
  for (size_t i = 0; i < a.train.size(); ++i) {
    EXPECT_EQ(b.train[i].step, a.train[i].step);
    EXPECT_EQ(b.train[i].loss, a.train[i].loss) << "step " << a.train[i].step;
    EXPECT_EQ(b.train[i].grad_norm, a.train[i].grad_norm) << "step " << a.train[i].step;
  }
  ASSERT_EQ(a.collapses.size(), 2u);  // both layers, at step 6 (intervals 2, 4, 6)
  ASSERT_EQ(b.collapses.size(), a.collapses.size());
  for (size_t i = 0; i < a.collapses.size(); ++i) {
    EXPECT_EQ(nlohmann::json(b.collapses[i]), nlohmann::json(a.collapses[i]));
  }
}

// Golden losses: 12 steps of the shipped configs/moe.yaml, one thread, fixed seed, written
// by the binary before the structure change (tests/golden/moe_12_steps.txt). Every value is
// compared exactly, so any change to numerics fails here, naming the first step that moved.
// OpenBLAS picks its kernels by CPU: on a machine whose kernel set differs from the one the
// file was written with, summation order differs and the values are compared to 1e-4.
TEST(Golden, MoePresetLossesPerStep) {
  const std::string dir = temp_dir("golden");
  std::ifstream golden(source_path("tests/golden/moe_12_steps.txt"));
  ASSERT_TRUE(golden.good());
  std::string golden_core;
  std::vector<std::vector<double>> train_rows;
  std::vector<std::pair<int64_t, double>> eval_rows;
  for (std::string line; std::getline(golden, line);) {
    std::istringstream in(line);
    std::string kind;
    in >> kind;
    if (kind == "#" && line.rfind("# openblas core: ", 0) == 0) golden_core = line.substr(17);
    if (kind == "train") {
      std::vector<double> v(5);
      for (double& x : v) in >> x;  // step, loss, lm_loss, aux_loss, grad_norm
      train_rows.push_back(v);
    } else if (kind == "eval") {
      int64_t step;
      double loss;
      in >> step >> loss;
      eval_rows.emplace_back(step, loss);
    }
  }
  ASSERT_EQ(train_rows.size(), 12u);
  Config cfg = load_config(source_path("configs/moe.yaml"),
                           {"run.threads=1", "train.max_steps=12", "train.warmup_steps=4",
                            "log.interval=1", "data.train=" + source_path("data/austen.jsonl"),
                            "data.cache_dir=" + dir + "/cache"})
                   .config;
  TrainOptions options;
  options.out_dir = dir + "/run";
  const TrainResult r = train(cfg, options);
  const RunLogs logs = read_run_logs(dir + "/run");
  ASSERT_EQ(logs.train.size(), 12u);
  const bool same_kernels = blas_core_name() == golden_core;
  // Other kernels round every GEMM differently and 12 steps of training carry that on:
  // OpenBLAS's Cooperlake kernels (an AMD VM, 2026-12-01) ended the grad norm 1.6e-4 from
  // the Prescott golden file at step 12 (SkylakeX and Haswell stayed within 1e-4).
  const double tol = same_kernels ? 0.0 : 1e-3;
  if (!same_kernels)
    std::printf("OpenBLAS kernels '%s' differ from the golden file's '%s': comparing to %g\n",
                blas_core_name().c_str(), golden_core.c_str(), tol);
  for (size_t i = 0; i < 12; ++i) {
    const TrainRecord& t = logs.train[i];
    const std::vector<double>& g = train_rows[i];
    ASSERT_EQ(t.step, static_cast<int64_t>(g[0]));
    ASSERT_NEAR(t.loss, g[1], tol) << "loss diverged at step " << t.step;
    ASSERT_NEAR(r.step_losses[i], g[1], tol) << "loss diverged at step " << t.step;
    ASSERT_NEAR(t.lm_loss, g[2], tol) << "LM loss diverged at step " << t.step;
    ASSERT_NEAR(t.aux_loss, g[3], tol) << "aux loss diverged at step " << t.step;
    ASSERT_NEAR(t.grad_norm, g[4], tol) << "grad norm diverged at step " << t.step;
  }
  ASSERT_EQ(logs.eval.size(), eval_rows.size());
  for (size_t i = 0; i < eval_rows.size(); ++i) {
    EXPECT_EQ(logs.eval[i].step, eval_rows[i].first);
    EXPECT_NEAR(logs.eval[i].val_loss, eval_rows[i].second, tol)
        << "val loss at step " << eval_rows[i].first;
  }
}

// ---- Multi-process set-up: torchrun's variables, and a world of one doing nothing.

namespace {
// Sets the torchrun variables for one test and restores the environment afterwards.
class TorchrunEnv {
 public:
  explicit TorchrunEnv(std::map<std::string, std::string> vars) {
    for (const char* k : kNames) unsetenv(k);
    for (const auto& [k, v] : vars) setenv(k.c_str(), v.c_str(), 1);
  }
  ~TorchrunEnv() {
    for (const char* k : kNames) unsetenv(k);
  }

 private:
  static constexpr const char* kNames[] = {
      "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};
};

std::string dist_error(std::map<std::string, std::string> vars) {
  TorchrunEnv env(std::move(vars));
  try {
    minimind::dist_env_from_environment();
  } catch (const minimind::DistError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(DistEnv, NoVariablesIsOneProcess) {
  TorchrunEnv env({});
  minimind::DistEnv d = minimind::dist_env_from_environment();
  EXPECT_EQ(d.world_size, 1);
  EXPECT_EQ(d.rank, 0);
}

TEST(DistEnv, ReadsTorchrunVariables) {
  TorchrunEnv env({{"RANK", "3"},
                   {"WORLD_SIZE", "4"},
                   {"LOCAL_RANK", "1"},
                   {"LOCAL_WORLD_SIZE", "2"},
                   {"MASTER_ADDR", "10.0.0.7"},
                   {"MASTER_PORT", "29511"}});
  minimind::DistEnv d = minimind::dist_env_from_environment();
  EXPECT_EQ(d.rank, 3);
  EXPECT_EQ(d.world_size, 4);
  EXPECT_EQ(d.local_rank, 1);
  EXPECT_EQ(d.local_world_size, 2);
  EXPECT_EQ(d.master_addr, "10.0.0.7");
  EXPECT_EQ(d.master_port, 29511);
}

TEST(DistEnv, LocalVariablesDefaultToAllRanksOnThisMachine) {
  TorchrunEnv env(
      {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}});
  minimind::DistEnv d = minimind::dist_env_from_environment();
  EXPECT_EQ(d.local_world_size, 2);
  EXPECT_EQ(d.local_rank, 1);
}

TEST(DistEnv, MissingOrBadVariablesAreNamed) {
  EXPECT_NE(dist_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}})
                .find("MASTER_ADDR"),
            std::string::npos);
  EXPECT_NE(
      dist_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}).find("MASTER_PORT"),
      std::string::npos);
  EXPECT_NE(dist_error({{"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}})
                .find("RANK is not set"),
            std::string::npos);
  EXPECT_NE(
      dist_error({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}})
          .find("RANK='2'"),
      std::string::npos);
  EXPECT_NE(dist_error({{"RANK", "0"}, {"WORLD_SIZE", "two"}}).find("WORLD_SIZE='two'"),
            std::string::npos);
  EXPECT_NE(
      dist_error(
          {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}})
          .find("MASTER_PORT='70000'"),
      std::string::npos);
}

TEST(Distributed, WorldOfOneLeavesTensorsAlone) {
  minimind::Distributed one;
  torch::Tensor t = torch::arange(4, torch::kFloat32);
  one.all_reduce_sum(t);
  one.all_reduce_max(t);
  EXPECT_TRUE(torch::equal(t, torch::arange(4, torch::kFloat32)));
  torch::Tensor p = torch::ones({3}, torch::requires_grad());
  p.mutable_grad() = torch::full({3}, 2.0);
  one.average_gradients({p});
  EXPECT_TRUE(torch::equal(p.grad(), torch::full({3}, 2.0)));
  EXPECT_EQ(one.comm_seconds(), 0.0);
}
