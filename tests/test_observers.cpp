// Each observer of the training loop on its own, fed by hand: the collapse and
// uninformative detectors, interval means, console, run logs, collapse watcher, evaluator and
// checkpointer.
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
#include <optional>
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

namespace {

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
  EXPECT_NE(ev.message.find("(over the 90% threshold) and 1 dead expert: 0 (at or over the "
                            "threshold of 1)"),
            std::string::npos)
      << ev.message;
  // Recovery re-arms it; an interrupted streak does not fire.
  EXPECT_FALSE(det.observe(1, 60, routing_metrics({250, 250, 250, 250})).has_value());
  EXPECT_FALSE(det.observe(1, 70, routing_metrics({0, 500, 250, 250})).has_value());
  EXPECT_FALSE(det.observe(1, 80, routing_metrics({10, 500, 250, 240})).has_value());
}

// The message says which condition fired it: dead experts with a share under its threshold
// read as such (not "takes 54.2% (threshold 90%)" as if the share had fired it), and a share
// over its threshold with no dead expert the other way round.
TEST(Collapse, TheMessageNamesTheConditionThatFiredIt) {
  auto fire = [](const std::vector<int64_t>& counts) {
    CollapseDetector det({0.9, 1, 1});
    const auto ev = det.observe(0, 10, routing_metrics(counts));
    return ev ? ev->message : std::string("(none)");
  };
  const std::string dead = fire({542, 0, 229, 229});
  EXPECT_NE(dead.find("1 dead expert: 1 (at or over the threshold of 1); expert 0 takes 54.2% of "
                      "the tokens (under the 90% threshold)"),
            std::string::npos)
      << dead;
  const std::string share = fire({950, 20, 15, 15});
  EXPECT_NE(share.find("expert 0 takes 95.0% of the tokens (over the 90% threshold); 0 dead "
                       "experts (under the threshold of 1)"),
            std::string::npos)
      << share;
  EXPECT_EQ(fire({250, 250, 250, 250}), "(none)");
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

TEST(IntervalWindow, MeansOverEachIntervalAndTheLastStep) {
  Recorder rec;
  IntervalWindow window(2, rec, /*multi_rank=*/false, /*flops_per_token=*/1.5e6);
  const StepStats a = step_stats(4.0, 0.5, 1.0, {{3, 1}}), b = step_stats(2.0, 0.25, 3.0, {{0, 4}}),
                  c = step_stats(1.0, 0.125, 2.0, {{2, 2}}, 60);
  window.on_step(step_info(1, 3, a));
  EXPECT_TRUE(rec.intervals.empty());
  window.on_step(step_info(2, 3, b));
  ASSERT_EQ(rec.intervals.size(), 1u);
  const TrainRecord& r = rec.intervals[0].record;
  EXPECT_EQ(r.step, 2);
  EXPECT_EQ(r.tokens, 200);
  EXPECT_DOUBLE_EQ(*r.flops, 200 * 1.5e6);  // tokens so far x per token
  EXPECT_DOUBLE_EQ(r.lm_loss, 3.0);         // (4 + 2) / 2
  EXPECT_DOUBLE_EQ(r.aux_loss, 0.375);      // (0.5 + 0.25) / 2
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
  IntervalWindow ranks(1, multi, /*multi_rank=*/true, 0);
  StepStats d = step_stats(1.0, 0.0, 1.0, {});
  d.comm_seconds = 0.004;
  ranks.on_step(step_info(1, 5, d));
  ASSERT_TRUE(multi.intervals.at(0).record.allreduce_ms.has_value());
  EXPECT_DOUBLE_EQ(*multi.intervals[0].record.allreduce_ms, 4.0);
}

// The per-layer statistics through the window, as LayerStats says each combines: z and aux
// averaged over the steps, drops summed (into the interval's dropped fraction), the
// sequence MaxVio the largest, the router gradient the newest; and a window cut in two by
// a checkpoint gives the same interval, also from a checkpoint of before LayerStats.
TEST(IntervalWindow, LayerStatsCombineAsListedAndSurviveACheckpoint) {
  auto with_layer = [](double z, int64_t dropped, double vio, std::optional<double> grad) {
    StepStats s = step_stats(1.0, 0.5, 1.0, {{6, 2}});
    s.z_loss_on = true;
    LayerStats& l = s.layers.at(0);
    l.z = z, l.dropped = dropped, l.seq_max_vio = vio, l.grad_lm = grad, l.grad_balance = grad;
    l.exchange = std::vector<double>{z, 2 * z, 0, 1};
    return s;
  };
  const StepStats a = with_layer(2.0, 1, 0.5, std::nullopt), b = with_layer(4.0, 3, 0.25, 0.125);
  Recorder rec;
  IntervalWindow window(2, rec, false, 0);
  window.on_step(step_info(1, 4, a));
  window.on_step(step_info(2, 4, b));
  ASSERT_EQ(rec.intervals.size(), 1u);
  const IntervalInfo& i = rec.intervals[0];
  ASSERT_EQ(i.layers.size(), 1u);
  EXPECT_DOUBLE_EQ(*i.layers[0].z, 3.0);            // mean
  EXPECT_DOUBLE_EQ(i.layers[0].aux, 0.25);          // mean of 0.5 / 2 and 0.5 / 2
  EXPECT_EQ(*i.layers[0].dropped, 4);               // sum
  EXPECT_DOUBLE_EQ(*i.layers[0].seq_max_vio, 0.5);  // max
  EXPECT_DOUBLE_EQ(*i.layers[0].grad_lm, 0.125);    // newest set
  EXPECT_EQ(*i.layers[0].exchange, (std::vector<double>{3.0, 6.0, 0.0, 1.0}));  // per step
  EXPECT_DOUBLE_EQ(*i.record.dropped, 4.0 / 16.0);  // 4 of 2 x 8 assignments
  EXPECT_TRUE(i.record.z_loss.has_value());

  // Cut after step 3, restored into a fresh window: step 4 closes the same interval.
  Recorder whole, cut;
  IntervalWindow w1(2, whole, false, 0), w2(2, cut, false, 0);
  for (auto* w : {&w1, &w2}) w->on_step(step_info(3, 4, a));
  nlohmann::json state;
  w2.save_state(state);
  IntervalWindow w3(2, cut, false, 0);
  w3.restore_state(nlohmann::json::parse(state.dump()));
  w1.on_step(step_info(4, 4, b));
  w3.on_step(step_info(4, 4, b));
  ASSERT_EQ(whole.intervals.size(), 1u);
  ASSERT_EQ(cut.intervals.size(), 1u);
  LayerStats::fields([](const char* name, Combine, Logged, const auto& x,
                        const auto& y) { EXPECT_EQ(x, y) << name; },
                     whole.intervals[0].layers.at(0), cut.intervals[0].layers.at(0));
  // A checkpoint of before LayerStats held only the z sums, as "layer_z".
  nlohmann::json old = state;
  old["interval"].erase("layers");
  old["interval"]["layer_z"] = {2.0};
  IntervalWindow w4(2, cut, false, 0);
  w4.restore_state(old);
  w4.on_step(step_info(4, 4, b));
  EXPECT_DOUBLE_EQ(*cut.intervals.back().layers.at(0).z, 3.0);
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
  ev.record = {4, 400, 2.5, std::exp(2.5), 90, 4.0e9};
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
    ev.record = {1, 100, 2.5, std::exp(2.5), 90, 1.0e9};
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
  Evaluator evaluator(model, val, cfg, {&one}, rec);
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

}  // namespace
