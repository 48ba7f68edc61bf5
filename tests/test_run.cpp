// The run layer: routing metrics on hand-made counts, and checkpoints (atomic writes,
// refusals with hints, optimizer state in both formats, data position, pruning, state fields).
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

namespace {

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
  j.erase("crc32");  // edited by hand, as a checkpoint of another version would be
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
  j.erase("crc32");  // format 1 had none
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

// What a resume must bring back beyond the parameters: a random hash table (drawn from the
// seed, so a model built with another seed has another one) and quantile balancing's
// selection bias. A fresh model of another seed takes both from the checkpoint.
TEST(Checkpoint, HashTableAndSelectionBiasSurviveSaveAndLoad) {
  const std::string dir = temp_dir("ckhash");
  const Config cfg = tiny_config(
      dir, {"model.hash_layers=1", "model.hash_table=random", "model.router_aux_loss_coef=0",
            "model.scoring_func=sigmoid", "model.router_bias_rule=quantile"});
  torch::manual_seed(1);
  MiniMindForCausalLM model(cfg.model);
  init_weights(model);
  {
    torch::NoGradGuard no_grad;
    for (auto& b : model->router_biases())
      if (b.defined()) b.copy_(torch::randn_like(b));
  }
  auto opt = make_optimizer(model->parameters(), cfg.train);
  TrainState s;
  s.config_yaml = config_to_yaml(cfg);
  s.step = 1;
  const std::string path = save_checkpoint(dir, model, *opt, s, 3);
  const auto buffers = model->named_buffers();
  const torch::Tensor table = buffers["model.layers.0.mlp.gate.tid2eid"].clone();
  const torch::Tensor bias = buffers["model.layers.1.mlp.gate.e_score_correction_bias"].clone();
  EXPECT_FALSE(buffers.contains("model.layers.0.mlp.gate.e_score_correction_bias"));

  torch::manual_seed(2);
  MiniMindForCausalLM fresh(cfg.model);
  init_weights(fresh);
  auto fresh_buffers = fresh->named_buffers();
  ASSERT_FALSE(torch::equal(fresh_buffers["model.layers.0.mlp.gate.tid2eid"], table))
      << "another seed must draw another table, or the check below proves nothing";
  ASSERT_FALSE(
      torch::equal(fresh_buffers["model.layers.1.mlp.gate.e_score_correction_bias"], bias));
  auto opt2 = make_optimizer(fresh->parameters(), cfg.train);
  load_checkpoint(path, fresh, *opt2);
  EXPECT_TRUE(torch::equal(fresh_buffers["model.layers.0.mlp.gate.tid2eid"], table));
  EXPECT_TRUE(torch::equal(fresh_buffers["model.layers.1.mlp.gate.e_score_correction_bias"], bias));
}

// A damaged optimizer.pt (bytes changed inside a tensor, the zip intact) is named by its
// CRC, and the optimizer it was to be loaded into keeps its state (the resume stops there).
TEST(Checkpoint, ADamagedOptimizerStateIsNamedAndLoadsNothing) {
  CheckpointSetup c("ckoptrot");
  auto& [dir, cfg, model, opt, s] = c;
  for (auto& p : model->parameters()) p.mutable_grad() = torch::randn_like(p);
  opt->step();
  s.step = 1;
  const std::string path = save_checkpoint(dir, model, *opt, s, 3);
  {
    std::fstream f(path + "/optimizer.pt", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(path + "/optimizer.pt") / 2));
    const std::string junk(256, '\xff');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  MiniMindForCausalLM fresh(cfg.model);
  auto opt2 = make_optimizer(fresh->parameters(), cfg.train);
  const std::string msg = error_of<Error>([&] { load_checkpoint(path, fresh, *opt2); });
  EXPECT_NE(msg.find("optimizer.pt' is damaged: entry"), std::string::npos) << msg;
  EXPECT_NE(msg.find("CRC-32 mismatch"), std::string::npos) << msg;
  EXPECT_TRUE(adamw_state(*opt2).empty());
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
  j.erase("crc32");  // nor did checkpoints of that time
  j.erase("loader_rows");
  j["loader_position"] = 12;
  std::ofstream(path + "/state.json") << j.dump();
  TrainState old = read_checkpoint_state(path);
  EXPECT_EQ(old.loader_rows, -1);
  EXPECT_EQ(old.loader_batches, 12);
}

// The fp32 library is stored once, in the plan; checkpoints of 2026-12-02/03 named only the
// library ("matmul"), and a resumed run still reads it there.
TEST(Checkpoint, StoresTheLibraryOnceInThePlanAndReadsTheOlderField) {
  CheckpointSetup c("cklibrary");
  auto& [dir, cfg, model, opt, s] = c;
  s.step = 3;
  s.plan = test::test_plan(Precision::fp32, MatmulBackend::onednn);
  const std::string path = save_checkpoint(dir, model, *opt, s, 3);
  nlohmann::json j = nlohmann::json::parse(std::ifstream(path + "/state.json"));
  EXPECT_FALSE(j.contains("matmul"));
  EXPECT_EQ(j["plan"]["matmul"], "onednn");
  EXPECT_EQ(read_checkpoint_state(path).fp32_library(), MatmulBackend::onednn);
  j.erase("crc32");  // nor did checkpoints of that time
  j.erase("plan");
  j["matmul"] = "openblas";
  std::ofstream(path + "/state.json") << j.dump();
  const TrainState old = read_checkpoint_state(path);
  EXPECT_FALSE(old.plan);
  EXPECT_EQ(old.fp32_library(), MatmulBackend::openblas);
  j.erase("matmul");  // older still: no library named, auto decides afresh
  std::ofstream(path + "/state.json") << j.dump();
  EXPECT_FALSE(read_checkpoint_state(path).fp32_library());
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

TEST(Checkpoint, StateFieldsAreNamedWhenMissingOrMistyped) {
  CheckpointSetup c("ckstate");
  auto& [dir, cfg, model, opt, s] = c;
  const std::string path = save_checkpoint(dir, model, *opt, s, 3);
  const std::string state = path + "/state.json";
  nlohmann::json j = nlohmann::json::parse(read_text(state));
  ASSERT_TRUE(j.contains("crc32"));
  j.erase("crc32");  // edited by hand: its fields are checked one by one
  j.erase("tokens");
  write_text(state, j.dump());
  std::string msg = error_of<CheckpointError>([&] { read_checkpoint_state(path); });
  EXPECT_NE(msg.find(state + "': field 'tokens' is missing"), std::string::npos) << msg;
  j["tokens"] = "many";
  write_text(state, j.dump());
  msg = error_of<CheckpointError>([&] { read_checkpoint_state(path); });
  EXPECT_NE(msg.find("field 'tokens' is not an integer"), std::string::npos) << msg;
}

// state.json carries the CRC-32 of its own text: a changed digit (bit rot in the step count,
// say), which still parses as a valid state, is named as damage; the original reads.
TEST(Checkpoint, AChangedStateJsonIsCaughtByItsCrc) {
  CheckpointSetup c("ckcrc");
  auto& [dir, cfg, model, opt, s] = c;
  s.step = 123;
  const std::string path = save_checkpoint(dir, model, *opt, s, 3);
  const std::string state = path + "/state.json";
  const std::string text = read_text(state);
  EXPECT_EQ(read_checkpoint_state(path).step, 123);
  const size_t at = text.find("\"step\": 123");
  ASSERT_NE(at, std::string::npos) << text;
  write_text(state, text.substr(0, at) + "\"step\": 723" + text.substr(at + 11));
  const std::string msg = error_of<CheckpointError>([&] { read_checkpoint_state(path); });
  EXPECT_NE(msg.find(state + "' is damaged: its CRC-32 does not match"), std::string::npos) << msg;
  write_text(state, text);
  EXPECT_EQ(read_checkpoint_state(path).step, 123);
}

}  // namespace
