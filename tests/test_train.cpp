// Trainer: lr schedule, routing metrics and collapse warnings, gradient accumulation,
// checkpoints (atomicity, refusals), exact resume, signals, the non-finite guard, and a
// short end-to-end run that must reduce the loss.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>
#include <unistd.h>

#include <csignal>
#include <cmath>
#include <filesystem>
#include <map>
#include <fstream>

#include "minimind/config.h"
#include "minimind/data/batcher.h"
#include "minimind/model/minimind_model.h"
#include "minimind/model/weights_io.h"
#include "minimind/train/optim.h"
#include "minimind/run/checkpoint.h"
#include "minimind/train/lr_schedule.h"
#include "minimind/run/routing_metrics.h"
#include "minimind/train/train_step.h"
#include "minimind/train/trainer.h"
#include "minimind/dist/distributed.h"

using namespace minimind;
namespace fs = std::filesystem;

namespace {

std::string temp_dir(const std::string& name) {
  fs::path p = fs::path(testing::TempDir()) / ("minimind_train_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

// A tiny MoE run on the first 300 records of the shipped corpus: seconds per run.
Config tiny_config(const std::string& dir, const std::vector<std::string>& extra = {}) {
  const std::string corpus = dir + "/corpus.jsonl";
  if (!fs::exists(corpus)) {
    std::ifstream in(std::string(MINIMIND_SOURCE_DIR) + "/data/austen.jsonl");
    std::ofstream out(corpus);
    std::string line;
    for (int i = 0; i < 300 && std::getline(in, line); ++i) out << line << "\n";
  }
  Config cfg = load_config_string(
      "run: {name: tiny, seed: 5, threads: 1}\n"
      "model: {hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 2,\n"
      "        num_key_value_heads: 1, vocab_size: 512, max_position_embeddings: 128,\n"
      "        use_moe: true, num_experts: 4, num_experts_per_tok: 2}\n"
      "data: {max_seq_len: 32, val_fraction: 0.05}\n"
      "train: {batch_size: 4, accumulation_steps: 2, max_steps: 8, learning_rate: 3.0e-3,\n"
      "        eval_interval: 4, checkpoint_interval: 3, keep_checkpoints: 2}\n"
      "log: {interval: 2}\n",
      "tiny.yaml");
  apply_override(cfg, "data.train=" + corpus);
  apply_override(cfg, "data.cache_dir=" + dir + "/cache");
  for (const auto& o : extra) apply_override(cfg, o);
  validate_and_resolve(cfg);
  return cfg;
}

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace

TEST(LrSchedule, MiniMindCosineWithWarmup) {
  // lr * (0.1 + 0.45 * (1 + cos(pi t / T))): lr at 0, 0.55 lr half-way, -> 0.1 lr.
  EXPECT_DOUBLE_EQ(learning_rate_at(0, 100, 1.0, 0), 1.0);
  EXPECT_NEAR(learning_rate_at(50, 100, 1.0, 0), 0.55, 1e-12);
  EXPECT_NEAR(learning_rate_at(100, 100, 1.0, 0), 0.1, 1e-12);
  EXPECT_NEAR(learning_rate_at(99, 100, 2.0, 0), 2.0 * (0.1 + 0.45 * (1 + std::cos(M_PI * 0.99))), 1e-12);
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
  EXPECT_DOUBLE_EQ(c.max_vio, 3.0);               // E - 1
  EXPECT_NEAR(c.cv, std::sqrt(3.0), 1e-12);       // sqrt(E - 1)
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
  std::vector<std::optional<CollapseEvent>> fired;
  for (int w = 1; w <= 5; ++w) {
    EXPECT_FALSE(det.observe(0, w * 10, routing_metrics({260, 240, 255, 245})).has_value());
    fired.push_back(det.observe(1, w * 10, routing_metrics({0, 25, 950, 25})));
  }
  EXPECT_FALSE(fired[0] || fired[1]);
  ASSERT_TRUE(fired[2].has_value());  // third consecutive window
  EXPECT_FALSE(fired[3] || fired[4]);  // once per episode
  const CollapseEvent& ev = *fired[2];
  EXPECT_EQ(ev.layer, 1);
  EXPECT_EQ(ev.expert, 2);
  EXPECT_EQ(ev.since_step, 10);
  EXPECT_EQ(ev.step, 30);
  EXPECT_NE(ev.message.find("layer 1"), std::string::npos) << ev.message;
  EXPECT_NE(ev.message.find("expert 2 takes 95.0%"), std::string::npos) << ev.message;
  EXPECT_NE(ev.message.find("1 dead expert: 0"), std::string::npos) << ev.message;
  // Recovery re-arms it; an interrupted streak does not fire.
  EXPECT_FALSE(det.observe(1, 60, routing_metrics({250, 250, 250, 250})).has_value());
  EXPECT_FALSE(det.observe(1, 70, routing_metrics({0, 500, 250, 250})).has_value());
  EXPECT_FALSE(det.observe(1, 80, routing_metrics({10, 500, 250, 240})).has_value());
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
      "data: {max_seq_len: 16}\n", "acc");
  validate_and_resolve(cfg);
  torch::manual_seed(3);
  torch::Tensor rows = torch::randint(3, 256, {8, 17}, torch::kLong);  // pack rows, no padding
  auto run = [&](int64_t batch, int64_t accumulation, torch::Dtype dtype, bool step) {
    torch::manual_seed(11);
    MiniMindForCausalLM model(cfg.model);
    init_weights(model);
    model->to(dtype);
    auto opt = make_optimizer(model->parameters(), cfg.train);
    int64_t next = 0;
    auto batches = [&] {
      torch::Tensor b = rows.narrow(0, next, batch);
      next += batch;
      return Batch{b, b};
    };
    if (step) {
      optimizer_step(model, *opt, batches, accumulation, cfg.train.grad_clip, 5e-4);
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
      torch::Tensor x = grads ? p.value().grad() : p.value(), y = grads ? pb[p.key()].grad() : pb[p.key()];
      worst = std::max(worst, (x - y).abs().max().item<double>());
    }
    return worst;
  };
  MiniMindForCausalLM a = run(8, 1, torch::kFloat64, true), b = run(4, 2, torch::kFloat64, true);
  const double params64 = max_diff(a, b, false);
  EXPECT_LE(params64, 1e-6);
  MiniMindForCausalLM ga = run(8, 1, torch::kFloat32, false), gb = run(4, 2, torch::kFloat32, false);
  const double grads32 = max_diff(ga, gb, true);
  EXPECT_LE(grads32, 1e-6);
  std::printf("batch 8 x 1 vs 4 x 2: max |param diff| after one AdamW step (fp64) %.3g, "
              "max |grad diff| (fp32) %.3g\n", params64, grads32);
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
  EXPECT_THROW(save_checkpoint(dir, model, *opt, s, 3, [](const std::string& file) {
                 if (file == "optimizer.pt") throw std::runtime_error("simulated crash");
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
    EXPECT_NE(std::string(e.what()).find("incomplete (no optimizer.pt)"), std::string::npos) << e.what();
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
  for (const auto& e : fs::directory_iterator(dir + "/checkpoints")) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"step_00000003", "step_00000004"}));
}

TEST(Trainer, ShortRunReducesLossAndWritesLogs) {
  const std::string dir = temp_dir("e2e");
  Config cfg = tiny_config(dir, {"train.max_steps=30", "train.eval_interval=10", "train.checkpoint_interval=10"});
  TrainResult r = train(cfg, {dir + "/run", false, false, {}});
  ASSERT_EQ(r.step_losses.size(), 30u);
  double first = r.step_losses[0], last = 0;
  for (size_t i = 25; i < 30; ++i) last += r.step_losses[i] / 5;
  std::printf("train loss %.3f -> %.3f, val loss %.3f -> %.3f\n", first, last, r.first_val_loss, r.last_val_loss);
  EXPECT_LT(last, first - 0.5);
  EXPECT_LT(r.last_val_loss, r.first_val_loss - 0.5);

  const std::string run = dir + "/run";
  for (const char* f : {"config.yaml", "tokenizer.model", "train.log", "metrics.jsonl", "expert_load.jsonl"})
    EXPECT_TRUE(fs::exists(run + "/" + f)) << f;
  EXPECT_NO_THROW(load_config_file(run + "/config.yaml"));
  int train_lines = 0, eval_lines = 0;
  for (const auto& j : read_jsonl(run + "/metrics.jsonl")) {
    if (j["split"] == "train") {
      ++train_lines;
      for (const char* k : {"step", "tokens", "loss", "lm_loss", "aux_loss", "lr", "grad_norm", "tok_per_s"})
        EXPECT_TRUE(j.contains(k)) << k;
    } else {
      ++eval_lines;
      EXPECT_TRUE(j.contains("val_loss"));
    }
  }
  EXPECT_EQ(train_lines, 15);  // every 2 steps
  EXPECT_EQ(eval_lines, 4);    // steps 0, 10, 20, 30
  int64_t train_load = 0;
  for (const auto& j : read_jsonl(run + "/expert_load.jsonl")) {
    if (j["split"] != "train") continue;
    ++train_load;
    // Counts of one step: 2 micro-batches x 4 rows x 33 tokens x top-2.
    int64_t sum = 0;
    for (int64_t c : j["counts"]) sum += c;
    EXPECT_EQ(sum, 2 * 4 * 33 * 2);
    for (const char* k : {"share", "max_vio", "cv", "entropy", "max_share", "dead", "aux_unscaled"})
      EXPECT_TRUE(j.contains(k)) << k;
  }
  EXPECT_EQ(train_load, 30 * 2);  // one per (step, MoE layer)
  // The checkpoint's weights are MiniMind-format and load strictly into a fresh model.
  MiniMindForCausalLM check(cfg.model);
  EXPECT_NO_THROW(load_weights(check, run + "/checkpoints/step_00000030/model.pth"));
}

TEST(Trainer, ResumeContinuesWithTheSameLosses) {
  const std::string dir = temp_dir("resume");
  Config cfg = tiny_config(dir);
  TrainResult full = train(cfg, {dir + "/full", false, false, {}});
  ASSERT_EQ(full.step_losses.size(), 8u);

  TrainOptions stop_at_5{dir + "/split", false, false, [](int64_t step, MiniMindForCausalLM&) { return step == 5; }};
  TrainResult first = train(cfg, stop_at_5);
  EXPECT_TRUE(first.interrupted);
  EXPECT_EQ(first.step, 5);
  TrainResult second = train(cfg, {dir + "/split", true, false, {}});
  EXPECT_FALSE(second.interrupted);
  std::vector<double> joined = first.step_losses;
  joined.insert(joined.end(), second.step_losses.begin(), second.step_losses.end());
  // One thread: bitwise the same sequence of losses.
  EXPECT_EQ(joined, full.step_losses);
  // metrics.jsonl holds each step once.
  std::vector<int64_t> steps;
  for (const auto& j : read_jsonl(dir + "/split/metrics.jsonl"))
    if (j["split"] == "train") steps.push_back(j["step"]);
  EXPECT_EQ(steps, (std::vector<int64_t>{2, 4, 6, 8}));

  // A different architecture is refused, naming the key.
  Config other = tiny_config(dir, {"model.hidden_size=64"});
  try {
    train(other, {dir + "/split", true, false, {}});
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("model.hidden_size: 32 -> 64"), std::string::npos) << e.what();
  }
  // Starting again over an existing run needs --overwrite.
  EXPECT_THROW(train(cfg, {dir + "/split", false, false, {}}), TrainError);
}

TEST(Trainer, SigintSavesACheckpointAndStops) {
  const std::string dir = temp_dir("sigint");
  Config cfg = tiny_config(dir, {"train.checkpoint_interval=100"});
  TrainResult r = train(cfg, {dir + "/run", false, false, [](int64_t step, MiniMindForCausalLM&) {
                                if (step == 2) std::raise(SIGINT);
                                return false;
                              }});
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
  try {
    train(cfg, {dir + "/run", false, false, [](int64_t step, MiniMindForCausalLM& m) {
                  if (step == 3) {
                    torch::NoGradGuard ng;
                    m->named_parameters()["model.norm.weight"].fill_(NAN);
                  }
                  return false;
                }});
    FAIL() << "no error";
  } catch (const TrainError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("non-finite loss at step 4"), std::string::npos) << msg;
    EXPECT_NE(msg.find("step_00000002"), std::string::npos) << msg;
  }
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
  Config cfg = tiny_config(dir, {"log.interval=1", "log.collapse_max_share=0.0", "log.collapse_patience=2",
                                 "train.max_steps=3"});
  train(cfg, {dir + "/low", false, false, {}});
  auto events = read_jsonl(dir + "/low/events.jsonl");
  ASSERT_EQ(events.size(), 2u);  // one per MoE layer, at step 2
  EXPECT_EQ(events[0]["event"], "collapse");
  EXPECT_EQ(events[0]["step"], 2);
  // With the defaults (0.9, one dead expert, 3 intervals) a short healthy run stays quiet.
  Config quiet = tiny_config(dir, {"log.interval=1", "train.max_steps=3"});
  train(quiet, {dir + "/default", false, false, {}});
  EXPECT_TRUE(read_jsonl(dir + "/default/events.jsonl").empty());
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
  static constexpr const char* kNames[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                           "MASTER_ADDR", "MASTER_PORT"};
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
  TorchrunEnv env({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
                   {"MASTER_ADDR", "10.0.0.7"}, {"MASTER_PORT", "29511"}});
  minimind::DistEnv d = minimind::dist_env_from_environment();
  EXPECT_EQ(d.rank, 3);
  EXPECT_EQ(d.world_size, 4);
  EXPECT_EQ(d.local_rank, 1);
  EXPECT_EQ(d.local_world_size, 2);
  EXPECT_EQ(d.master_addr, "10.0.0.7");
  EXPECT_EQ(d.master_port, 29511);
}

TEST(DistEnv, LocalVariablesDefaultToAllRanksOnThisMachine) {
  TorchrunEnv env({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}});
  minimind::DistEnv d = minimind::dist_env_from_environment();
  EXPECT_EQ(d.local_world_size, 2);
  EXPECT_EQ(d.local_rank, 1);
}

TEST(DistEnv, MissingOrBadVariablesAreNamed) {
  EXPECT_NE(dist_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}}).find("MASTER_ADDR"),
            std::string::npos);
  EXPECT_NE(dist_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}).find("MASTER_PORT"),
            std::string::npos);
  EXPECT_NE(dist_error({{"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}).find("RANK is not set"),
            std::string::npos);
  EXPECT_NE(dist_error({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}})
                .find("RANK='2'"),
            std::string::npos);
  EXPECT_NE(dist_error({{"RANK", "0"}, {"WORLD_SIZE", "two"}}).find("WORLD_SIZE='two'"), std::string::npos);
  EXPECT_NE(dist_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}})
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
