// Model structure: parameter names and counts, init, forward contract, the router
// gradient starvation of MiniMind issue #858, weights I/O errors, and the BLAS in use.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include "minimind/config.h"
#include "minimind/flops.h"
#include "minimind/model/minimind_model.h"
#include "minimind/model/weights_io.h"
#include "minimind/util/blas_check.h"
#include "minimind/util/blas_tasks.h"
#include "minimind/util/matmul_peak.h"
#include "support/test_support.h"

using namespace minimind;

namespace {

ModelConfig small(bool moe) {
  // docs/minimind-spec.md: H 128, 2 layers, 4 heads, 2 kv heads, vocab 512.
  Config cfg = load_config_string(
      "model:\n  hidden_size: 128\n  num_hidden_layers: 2\n  num_attention_heads: 4\n"
      "  num_key_value_heads: 2\n  vocab_size: 512\n  max_position_embeddings: 256\n"
      "data:\n  max_seq_len: 128\n",
      "small");
  cfg.model.use_moe = moe;
  validate_and_resolve(cfg);
  return cfg.model;
}

ModelConfig shipped_model(const std::string& name) {
  return load_config(test::source_path("configs/" + name), {}).config.model;
}

std::string temp_path(const std::string& name) {
  return test::temp_dir("model") + "/" + name;
}

}  // namespace

TEST(ParamCount, SmallConfigsMatchSpec) {
  MiniMindForCausalLM dense(small(false));
  EXPECT_EQ(count_parameters(dense).total, 508672);
  EXPECT_EQ(count_parameters(dense).active, 508672);
  MiniMindForCausalLM moe(small(true));
  EXPECT_EQ(count_parameters(moe).total, 1541888);
  EXPECT_EQ(count_parameters(moe).active, 509696);
}

TEST(ParamCount, RealMiniMindSizes) {
  // 63.91 M dense; 198.42 M total / 63.94 M active for the MoE (docs/minimind-spec.md).
  {
    MiniMindForCausalLM m(shipped_model("minimind-3.yaml"));
    EXPECT_NEAR(count_parameters(m).total / 1e6, 63.91, 0.005);
  }
  {
    MiniMindForCausalLM m(shipped_model("minimind-3-moe.yaml"));
    ParamCount n = count_parameters(m);
    EXPECT_NEAR(n.total / 1e6, 198.42, 0.005);
    EXPECT_NEAR(n.active / 1e6, 63.94, 0.005);
  }
}

TEST(ParamCount, TinyPresetsHaveEqualActiveParameters) {
  MiniMindForCausalLM moe(shipped_model("moe.yaml"));
  MiniMindForCausalLM dense(shipped_model("dense.yaml"));
  const ModelConfig& c = moe->config();
  // Only the routers (E x H per layer) differ.
  EXPECT_EQ(count_parameters(moe).active - count_parameters(dense).active,
            c.num_hidden_layers * c.num_experts * c.hidden_size);
}

// The up-front memory check (config.h) counts the parameters from the config alone: it must
// agree with the built model: dense, MoE, an untied head, shared experts, a hash router
// (which has no gate).
TEST(ParamCount, MemoryEstimateCountsTheBuiltModel) {
  for (int variant = 0; variant < 5; ++variant) {
    ModelConfig c = small(variant == 1 || variant >= 3);
    c.tie_word_embeddings = variant != 2;
    if (variant == 3) c.n_shared_experts = 2, c.shared_expert_intermediate_size = 48;
    if (variant == 4) c.router = RouterKind::hash, c.router_aux_loss_coef = 0;
    MiniMindForCausalLM m(c);
    const double rope_bytes = 2.0 * 4 * c.max_position_embeddings * c.head_dim();
    const double params = static_cast<double>(count_parameters(m).total);
    EXPECT_EQ(model_memory_bytes(c, false), 4 * params + rope_bytes) << variant;
    EXPECT_EQ(model_memory_bytes(c, true), 16 * params + rope_bytes) << variant;
  }
}

TEST(StateDict, NamesAreMiniMinds) {
  ModelConfig cfg = small(true);
  cfg.num_hidden_layers = 2;
  MiniMindForCausalLM moe(cfg);
  NamedTensors sd = state_dict(moe);
  EXPECT_EQ(sd.size(), 45u);
  std::set<std::string> names;
  for (const auto& [n, t] : sd) names.insert(n);
  for (const char* n :
       {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
        "model.layers.1.self_attn.k_norm.weight", "model.layers.0.input_layernorm.weight",
        "model.layers.0.post_attention_layernorm.weight", "model.layers.1.mlp.gate.weight",
        "model.layers.1.mlp.experts.3.down_proj.weight", "model.norm.weight", "lm_head.weight"})
    EXPECT_TRUE(names.count(n)) << n;
  MiniMindForCausalLM dense(small(false));
  NamedTensors dsd = state_dict(dense);
  EXPECT_EQ(dsd.size(), 25u);
  std::set<std::string> dnames;
  for (const auto& [n, t] : dsd) dnames.insert(n);
  EXPECT_TRUE(dnames.count("model.layers.1.mlp.up_proj.weight"));
  // Tied: both names hold the same storage.
  EXPECT_TRUE(dsd.back().second.is_same(dense->model->embed_tokens->weight));
}

TEST(Init, NormalWeightsAndUnitNorms) {
  torch::manual_seed(0);
  MiniMindForCausalLM m(small(true));
  init_weights(m);
  for (const auto& p : m->named_parameters()) {
    if (p.key().find("norm") != std::string::npos) {
      EXPECT_TRUE(torch::all(p.value() == 1).item<bool>()) << p.key();
    } else if (p.value().numel() > 10000) {
      EXPECT_NEAR(p.value().std().item<double>(), 0.02, 0.001) << p.key();
      EXPECT_NEAR(p.value().mean().item<double>(), 0.0, 0.001) << p.key();
    }
  }
}

TEST(Forward, ShapesAuxAndCounts) {
  torch::manual_seed(0);
  ModelConfig cfg = small(true);
  cfg.num_experts_per_tok = 2;
  MiniMindForCausalLM m(cfg);
  init_weights(m);
  torch::Tensor ids = torch::randint(3, cfg.vocab_size, {2, 9}, torch::kLong);
  m->train();
  ForwardOutput out = m(ids, ids);
  EXPECT_EQ(out.logits.sizes(), (std::vector<int64_t>{2, 9, cfg.vocab_size}));
  ASSERT_EQ(out.moe.size(), 2u);
  for (const auto& m : out.moe) EXPECT_EQ(m.counts.sum().item<int64_t>(), 2 * 9 * 2);
  // Near-uniform routing at init: aux ~ k * coef per layer, summed over 2 layers.
  EXPECT_NEAR(out.aux_loss.item<double>(), 2 * 2 * cfg.router_aux_loss_coef,
              0.3 * 2 * 2 * cfg.router_aux_loss_coef);
  EXPECT_NEAR(out.loss.item<double>(), std::log(cfg.vocab_size), 0.2);
  m->eval();
  torch::NoGradGuard no_grad;
  ForwardOutput ev = m(ids);
  EXPECT_EQ(ev.aux_loss.item<double>(), 0.0);
  EXPECT_FALSE(ev.loss.defined());
  EXPECT_TRUE(torch::allclose(ev.logits, out.logits.detach(), 0, 1e-5));
}

// MiniMind issue #858: top-1 + norm_topk_prob makes the routing weight exactly 1, so the
// LM loss gives the router no gradient; without renormalisation or with k = 2 it does.
TEST(RouterGradient, StarvedAtTop1WithRenormalisation) {
  auto lm_grad_norm = [](int64_t k, bool norm) {
    ModelConfig cfg = small(true);
    cfg.num_experts_per_tok = k;
    cfg.norm_topk_prob = norm;
    torch::manual_seed(7);
    MiniMindForCausalLM m(cfg);
    init_weights(m);
    m->train();
    torch::Tensor ids = torch::randint(3, cfg.vocab_size, {4, 32}, torch::kLong);
    m(ids, ids).loss.backward();  // the LM loss alone: no aux term
    return m->named_parameters()["model.layers.0.mlp.gate.weight"].grad().norm().item<double>();
  };
  const double starved = lm_grad_norm(1, true);
  const double no_renorm = lm_grad_norm(1, false);
  const double top2 = lm_grad_norm(2, true);
  std::printf("|dLM/d gate.weight|: top-1 renorm %.3g, top-1 no renorm %.3g, top-2 renorm %.3g\n",
              starved, no_renorm, top2);
  EXPECT_LT(starved, 1e-6);  // float rounding of w / w only
  EXPECT_GT(no_renorm, 1e-3);
  EXPECT_GT(top2, 1e-3);
  EXPECT_GT(no_renorm, 1e4 * starved);
}

TEST(WeightsIO, SaveLoadRoundTripIsExact) {
  torch::manual_seed(1);
  MiniMindForCausalLM a(small(true));
  init_weights(a);
  const std::string path = temp_path("roundtrip.pth");
  save_weights(a, path);
  torch::manual_seed(2);
  MiniMindForCausalLM b(small(true));
  init_weights(b);
  load_weights(b, path);
  auto pb = b->named_parameters();
  for (const auto& p : a->named_parameters())
    EXPECT_TRUE(torch::equal(p.value(), pb[p.key()])) << p.key();
  // No temporary file is left behind.
  for (const auto& e :
       std::filesystem::directory_iterator(std::filesystem::path(path).parent_path()))
    EXPECT_EQ(
        e.path().filename().string().find(std::filesystem::path(path).filename().string() + ".tmp"),
        std::string::npos)
        << e.path();
}

TEST(WeightsIO, MismatchedConfigListsMismatches) {
  MiniMindForCausalLM moe(small(true));
  const std::string path = temp_path("moe.pth");
  save_weights(moe, path);
  ModelConfig other = small(false);
  other.hidden_size = 64;
  MiniMindForCausalLM dense(other);
  try {
    load_weights(dense, path);
    FAIL() << "no error";
  } catch (const WeightsError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("do not match the model config"), std::string::npos) << msg;
    EXPECT_NE(msg.find("shape of model.embed_tokens.weight: file [512, 128], model [512, 64]"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("missing model.layers.0.mlp.up_proj.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("hint:"), std::string::npos) << msg;
  }
}

// Upcycling copies the dense feed-forward into every expert; Drop-Upcycling then redraws
// round(ratio * I) units of each expert (rows of gate/up, columns of down), a set of its own,
// from the matrix's mean and standard deviation, and leaves the other units the dense ones.
TEST(WeightsIO, UpcyclingCopiesTheDenseFeedForwardAndDropRedrawsUnits) {
  torch::manual_seed(4);
  MiniMindForCausalLM dense(small(false));
  init_weights(dense);
  const std::string path = temp_path("dense.pth");
  save_weights(dense, path);
  auto dp = dense->named_parameters();
  const torch::Tensor gate = dp["model.layers.0.mlp.gate_proj.weight"];  // [I, H]
  const torch::Tensor down = dp["model.layers.0.mlp.down_proj.weight"];  // [H, I]
  const int64_t I = gate.size(0);

  MiniMindForCausalLM moe(small(true));
  load_weights_upcycled(moe, path);
  auto mp = moe->named_parameters();
  const std::string e0 = "model.layers.0.mlp.experts.0.", e1 = "model.layers.0.mlp.experts.1.";
  EXPECT_TRUE(torch::equal(mp[e0 + "gate_proj.weight"], gate));
  EXPECT_TRUE(torch::equal(mp[e1 + "down_proj.weight"], down));
  EXPECT_TRUE(torch::equal(mp["model.embed_tokens.weight"], dp["model.embed_tokens.weight"]));
  // From an MoE source: refused, named.
  const std::string moe_path = temp_path("moe-source.pth");
  save_weights(moe, moe_path);
  EXPECT_NE(test::error_of<WeightsError>([&] {
              load_weights_upcycled(moe, moe_path);
            }).find("upcycling starts from a dense model"),
            std::string::npos);

  drop_upcycle(moe, 0.25);
  const int64_t k = std::llround(0.25 * static_cast<double>(I));
  std::vector<std::set<int64_t>> redrawn(2);
  for (int e = 0; e < 2; ++e) {
    const std::string p = e == 0 ? e0 : e1;
    const torch::Tensor g = mp[p + "gate_proj.weight"], d = mp[p + "down_proj.weight"];
    const torch::Tensor u = mp[p + "up_proj.weight"];
    for (int64_t i = 0; i < I; ++i) {
      const bool same_g = torch::equal(g[i], gate[i]);
      EXPECT_EQ(same_g, torch::equal(u[i], dp["model.layers.0.mlp.up_proj.weight"][i])) << i;
      EXPECT_EQ(same_g, torch::equal(d.select(1, i), down.select(1, i))) << i;
      if (!same_g) redrawn[static_cast<size_t>(e)].insert(i);
    }
    EXPECT_EQ(static_cast<int64_t>(redrawn[static_cast<size_t>(e)].size()), k);
    // The redrawn rows follow the dense matrix's spread (std 0.02 at init; 10 % apart).
    std::vector<int64_t> rows(redrawn[static_cast<size_t>(e)].begin(),
                              redrawn[static_cast<size_t>(e)].end());
    const double s = g.index_select(0, torch::tensor(rows)).std().item<double>();
    EXPECT_NEAR(s, gate.std().item<double>(), 0.1 * gate.std().item<double>());
  }
  EXPECT_NE(redrawn[0], redrawn[1]) << "each expert draws its own units";
}

// Fine-grained upcycling (He et al. 2024): expert j takes slice j mod G of the dense
// units, each group of G experts shares a router row, and with upcycle scaling the
// feed-forward's output is the dense one: whatever the router's values when the weights are
// renormalised and a token picks whole groups, at tied scores (router zero) otherwise.
TEST(WeightsIO, FineGrainedUpcyclingWithScalingComputesTheDenseFunction) {
  torch::manual_seed(5);
  MiniMindForCausalLM dense(small(false));
  init_weights(dense);
  const std::string path = temp_path("dense-fg.pth");
  save_weights(dense, path);
  const torch::Tensor ids = torch::randint(0, 512, {2, 24}, torch::kLong);  // [B, T]
  torch::NoGradGuard no_grad;
  const torch::Tensor want = dense->forward(ids).logits;  // [B, T, V]
  const int64_t I = small(false).ffn_size();              // 448

  struct Case {
    const char* what;
    int64_t width, experts, k, shared;
    bool renorm, zero_router, scaling, preserved;
  };
  const Case cases[] = {
      {"top-1, no renormalisation, tied scores", I, 4, 1, 0, false, true, true, false},
      {"G 2, top-2, renormalised, seeded router", I / 2, 4, 2, 0, true, false, true, true},
      {"G 2, top-2, no renormalisation, tied scores", I / 2, 4, 2, 0, false, true, true, false},
      {"G 4, top-4 of 8, renormalised", I / 4, 8, 4, 0, true, false, true, true},
      {"one shared expert, top-1, renormalised", I, 4, 1, 1, true, false, true, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ModelConfig m = small(true);
    m.moe_intermediate_size = c.width;
    m.num_experts = c.experts;
    m.num_experts_per_tok = c.k;
    m.n_shared_experts = c.shared;
    m.norm_topk_prob = c.renorm;
    MiniMindForCausalLM moe(m);
    init_weights(moe);
    const UpcyclePlan plan = load_weights_upcycled(moe, path, c.scaling);
    EXPECT_EQ(plan.granularity, I / c.width);
    EXPECT_EQ(plan.not_preserved.empty(), c.preserved) << plan.not_preserved;
    auto mp = moe->named_parameters();
    const std::string layer = "model.layers.1.mlp.";
    const int64_t G = plan.granularity, w = c.width;
    for (int64_t e = 0; e < c.experts; ++e) {  // slice e mod G, scaled down_proj
      const std::string x = layer + "experts." + std::to_string(e) + ".";
      const int64_t g = e % G;
      EXPECT_TRUE(
          torch::equal(mp[x + "up_proj.weight"],
                       dense->named_parameters()[layer + "up_proj.weight"].narrow(0, g * w, w)));
      EXPECT_TRUE(torch::allclose(
          mp[x + "down_proj.weight"],
          dense->named_parameters()[layer + "down_proj.weight"].narrow(1, g * w, w) *
              plan.routed_scale));
      EXPECT_TRUE(torch::equal(mp[layer + "gate.weight"][e], mp[layer + "gate.weight"][e - g]));
    }
    if (c.zero_router)
      for (auto& item : mp)
        if (item.key().find(".mlp.gate.weight") != std::string::npos) item.value().zero_();
    const torch::Tensor got = moe->forward(ids).logits;
    const double diff = (got - want).abs().max().item<double>();
    EXPECT_LT(diff, 1e-5) << "largest |logit difference| vs the dense model";
  }

  // Without scaling, slices add up to 1/G of the dense output: not the dense function.
  ModelConfig m = small(true);
  m.moe_intermediate_size = I / 2;
  m.num_experts_per_tok = 2;
  MiniMindForCausalLM unscaled(m);
  const UpcyclePlan plan = load_weights_upcycled(unscaled, path, false);
  EXPECT_NE(plan.not_preserved.find("upcycle_scaling"), std::string::npos) << plan.not_preserved;
  EXPECT_GT((unscaled->forward(ids).logits - want).abs().max().item<double>(), 1e-3);

  // Widths that do not divide, and expert counts that are not whole groups: named.
  m.moe_intermediate_size = 300;
  MiniMindForCausalLM odd(m);
  EXPECT_NE(test::error_of<WeightsError>([&] {
              load_weights_upcycled(odd, path);
            }).find("model.moe_intermediate_size is 300, which does not divide"),
            std::string::npos);
  m.moe_intermediate_size = I / 2;
  m.num_experts = 3;
  m.num_experts_per_tok = 1;
  MiniMindForCausalLM three(m);
  EXPECT_NE(test::error_of<WeightsError>([&] {
              load_weights_upcycled(three, path);
            }).find("model.num_experts (3) is not a multiple of the 2 slices"),
            std::string::npos);
}

// The FLOPs the run log counts, against the model's own matrices: 6 per weight a token
// passes through (k of E experts), the lm_head (tied to the embedding), 12 L T heads d for
// attention.
TEST(Flops, PerTokenMatchesTheModelsMatrices) {
  for (const bool moe : {false, true}) {
    SCOPED_TRACE(moe ? "moe" : "dense");
    ModelConfig m = small(moe);
    m.num_experts_per_tok = 2;
    m.n_shared_experts = moe ? 1 : 0;
    MiniMindForCausalLM model(m);
    double attention = 0, ffn = 0, shared = 0, router = 0;
    for (const auto& item : model->named_parameters()) {
      const std::string& name = item.key();
      const auto n = static_cast<double>(item.value().numel());
      if (item.value().dim() != 2 || name.find("model.layers.") != 0) continue;
      if (name.find(".self_attn.") != std::string::npos)
        attention += n;
      else if (name.find(".mlp.experts.") != std::string::npos)
        ffn += n * 2 / 4;  // k of E
      else if (name.find(".mlp.shared_experts.") != std::string::npos)
        shared += n;
      else if (name.find(".mlp.gate.") != std::string::npos)
        router += n;
      else if (name.find(".mlp.") != std::string::npos)
        ffn += n;
    }
    const FlopsPerToken f = flops_per_token(m, 128);
    EXPECT_DOUBLE_EQ(f.attention_projections, 6 * attention);
    EXPECT_DOUBLE_EQ(f.feed_forward, 6 * ffn);
    EXPECT_DOUBLE_EQ(f.shared_experts, 6 * shared);
    EXPECT_DOUBLE_EQ(f.router, 6 * router);
    EXPECT_DOUBLE_EQ(f.lm_head, 6.0 * static_cast<double>(model->lm_head_weight().numel()));
    EXPECT_DOUBLE_EQ(f.attention_scores, 12.0 * 2 * 128 * 4 * 32);
    EXPECT_GT(f.feed_forward, 0.0);
  }
}

TEST(WeightsIO, MissingOrCorruptFilesAreClearErrors) {
  MiniMindForCausalLM m(small(false));
  EXPECT_THROW(load_weights(m, "/nonexistent/w.pth"), WeightsError);
  const std::string path = temp_path("corrupt.pth");
  save_weights(m, path);
  {
    // Truncate the file to half its size.
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), bytes.size() / 2);
  }
  try {
    load_weights(m, path);
    FAIL() << "no error";
  } catch (const WeightsError& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << "not a checkpoint";
  }
  EXPECT_THROW(load_weights(m, path), WeightsError);
  // Found by fuzz_weights: a zip whose directory points past the end of the file made
  // LibTorch's reader copy memory from outside it (an ASan report; scripts/sanitize.sh runs
  // this test), now a damaged-file error.
  const std::string past_end =
      test::source_path("tests/fuzz/seeds/weights/zip-directory-past-the-end");
  EXPECT_NE(test::error_of<WeightsError>([&] { read_tensor_dict(past_end); }).find("is damaged"),
            std::string::npos);
}

// Bit rot inside a tensor keeps the zip's structure whole: LibTorch's reader would load the
// bytes as they are (0xff..: NaN). Each entry's CRC-32 is checked first, so the file is
// named as damaged; the same bytes put back load again.
TEST(WeightsIO, ChangedBytesInsideATensorAreCaughtByTheCrc) {
  torch::manual_seed(3);
  MiniMindForCausalLM m(small(true));
  init_weights(m);
  const std::string path = temp_path("rot.pth");
  save_weights(m, path);
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  auto write = [&](const std::string& b) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(b.data(), static_cast<std::streamsize>(b.size()));
  };
  std::string rotten = bytes;
  std::fill(rotten.begin() + rotten.size() / 2, rotten.begin() + rotten.size() / 2 + 64, '\xff');
  write(rotten);
  const std::string msg = test::error_of<WeightsError>([&] { load_weights(m, path); });
  EXPECT_NE(msg.find("rot.pth' is damaged: entry '"), std::string::npos) << msg;
  EXPECT_NE(msg.find("CRC-32 mismatch"), std::string::npos) << msg;
  write(bytes);
  EXPECT_NO_THROW(load_weights(m, path));
}

TEST(Blas, OptimisedBlasIsLoaded) {
  // Debian's reference libblas.so.3 makes matmul ~20x slower; scripts/install-deps.sh
  // installs OpenBLAS, which the alternatives system then puts behind libblas.so.3.
  const std::string lib = loaded_blas_library();
  EXPECT_NE(lib.find("openblas"), std::string::npos) << "libblas.so.3 resolves to " << lib;
}

// run_blas_tasks: every task once, on two threads when OpenBLAS has two (one of them the
// caller's), OpenBLAS at one thread meanwhile and its count restored; the caller's grad
// mode reaches the helper; a task's exception comes back to the caller; serial when told.
TEST(BlasTasks, RunEachTaskOnceSideBySideAndRethrowAFailure) {
  const int before = blas_threads();
  ASSERT_TRUE(set_blas_threads(2));
  std::mutex m;
  std::vector<int64_t> done;
  std::set<std::thread::id> threads;
  std::set<int> blas_counts;
  std::set<bool> grad_modes;
  const std::vector<int64_t> order{5, 3, 9, 0, 7, 1, 8, 2, 6, 4};
  {
    const torch::NoGradGuard no_grad;
    run_blas_tasks(order, [&](int64_t t) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // long enough for both
      const std::lock_guard<std::mutex> lock(m);
      done.push_back(t);
      threads.insert(std::this_thread::get_id());
      blas_counts.insert(blas_threads());
      grad_modes.insert(torch::GradMode::is_enabled());
    });
  }
  std::vector<int64_t> sorted = done;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(threads.size(), 2u);
  EXPECT_TRUE(threads.count(std::this_thread::get_id()));
  EXPECT_EQ(blas_counts, std::set<int>{1});
  EXPECT_EQ(grad_modes, std::set<bool>{false});
  EXPECT_EQ(blas_threads(), 2);

  threads.clear();
  run_blas_tasks(
      order, [&](int64_t) { threads.insert(std::this_thread::get_id()); }, false);
  EXPECT_EQ(threads, std::set<std::thread::id>{std::this_thread::get_id()});

  std::atomic<int> ran{0};
  EXPECT_THROW(run_blas_tasks(order,
                              [&](int64_t t) {
                                ++ran;
                                if (t == 3) throw std::runtime_error("task 3 failed");
                              }),
               std::runtime_error);
  EXPECT_GE(ran.load(), 2);
  EXPECT_EQ(blas_threads(), 2);  // restored after the failure too
  set_blas_threads(before);
}

// The CPU features the bf16 decision reads, from /proc/cpuinfo text (the first processor).
TEST(CpuFeatures, ParsedFromCpuinfo) {
  const CpuFeatures amd = parse_cpu_features(
      "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse avx2 avx512f avx512_vnni "
      "avx512_bf16 rdrand\n\nprocessor\t: 1\nmodel name\t: other\nflags\t\t: fpu amx_bf16\n");
  EXPECT_EQ(amd.model, "AMD EPYC");
  EXPECT_TRUE(amd.avx2 && amd.avx512f && amd.avx512_bf16);
  EXPECT_FALSE(amd.amx_bf16);  // the second processor's flags are not read
  EXPECT_TRUE(amd.bf16());
  EXPECT_EQ(amd.flags(), "avx2 avx512f avx512_bf16");
  const CpuFeatures old = parse_cpu_features(
      "model name\t: Intel(R) Xeon(R) CPU E5-2680 v4\nflags\t\t: fpu sse4_2 avx avx2 fma\n");
  EXPECT_TRUE(old.avx2);
  EXPECT_FALSE(old.avx512f || old.bf16());
  const CpuFeatures spr = parse_cpu_features(
      "model name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: avx2 avx512f "
      "avx512_bf16 amx_bf16 amx_tile\n");
  EXPECT_TRUE(spr.amx_bf16 && spr.bf16());
  // "avx512_bf16" must not be read from a longer flag, nor from the model name.
  const CpuFeatures near =
      parse_cpu_features("model name\t: avx512_bf16 lookalike\nflags\t\t: avx512_bf16x avx2x\n");
  EXPECT_FALSE(near.bf16() || near.avx2);
  EXPECT_FALSE(parse_cpu_features("").bf16());
}

// oneDNN's fp32 GEMM as minimind-bench calls it gives torch's product (odd sizes, so the
// row-major leading dimensions are exercised), and every backend's peak is measured.
TEST(MatmulPeak, OneDnnGemmIsTheProductAndEveryBackendIsMeasured) {
  torch::manual_seed(3);
  const torch::Tensor a = torch::randn({37, 29}), b = torch::randn({29, 53});  // [M, K] [K, N]
  torch::Tensor c = torch::full({37, 53}, 7.0);
  onednn_sgemm(37, 53, 29, a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>());
  EXPECT_LE((c - torch::mm(a, b)).abs().max().item<double>(), 1e-4);  // |values| ~ 5
  const std::vector<MatmulPeak> peaks = measure_matmul_peaks();
  // oneDNN's bf16 matmul exists for AVX-512 CPUs only (oneDNN 2.6).
  const bool avx512 = cpu_features().avx512f;
  ASSERT_EQ(peaks.size(), avx512 ? 3u : 2u);
  for (const auto& p : peaks) {
    std::printf("matmul peak, one core: %s %s %.0f GFLOP/s (%s)\n", p.backend.c_str(),
                p.precision.c_str(), p.gflops, p.kernel.c_str());
    EXPECT_GT(p.gflops, 1.0) << p.backend << " " << p.precision;
    EXPECT_FALSE(p.kernel.empty());
  }
  ASSERT_NE(best_peak(peaks, "fp32"), nullptr);
  EXPECT_EQ(best_peak(peaks, "bf16"), avx512 ? &peaks[2] : nullptr);
  EXPECT_EQ(best_peak(peaks, "fp16"), nullptr);
  // With bf16 instructions oneDNN runs a bf16 kernel (AVX512_BF16 or AMX), not emulation.
  if (cpu_features().bf16()) {
    EXPECT_TRUE(peaks[2].kernel.find("bf16") != std::string::npos ||
                peaks[2].kernel.find("amx") != std::string::npos)
        << peaks[2].kernel;
  }
}

// An exchange that reaches nobody: the expert-parallel tests below only shard a model
// (a forward over it would call all_to_all).
class NoExchange final : public ExpertExchange {
 public:
  NoExchange(int index, int size) : index_(index), size_(size) {}
  int size() const override { return size_; }
  int index() const override { return index_; }
  torch::Tensor all_to_all(const torch::Tensor&, const std::vector<int64_t>&,
                           const std::vector<int64_t>&, int) override {
    throw std::logic_error("NoExchange: no other ranks");
  }

 private:
  int index_, size_;
};

// Expert parallelism: a model holding shard 1 of 2 of the experts names the whole model's
// parameters in the whole model's order and, sharded after its weights are set, holds the
// whole model's weights (every rank then trains the same model as one process would).
TEST(ExpertShard, HoldsItsExpertsUnderGlobalNamesWithTheWholeModelsWeights) {
  ModelConfig cfg = small(true);
  torch::manual_seed(3);
  MiniMindForCausalLM whole(cfg);
  init_weights(whole);
  torch::manual_seed(3);
  MiniMindForCausalLM part(cfg);
  init_weights(part);
  NoExchange exchange(1, 2);
  apply_expert_parallel(part, exchange);
  EXPECT_EQ(part->expert_shard().index, 1);
  EXPECT_EQ(part->expert_shard().count, 2);

  const std::vector<ParamSlot> slots = full_parameters(part);
  const auto names = whole->named_parameters();
  ASSERT_EQ(slots.size(), names.size());
  int64_t held = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    EXPECT_EQ(slots[i].name, names[i].key());
    EXPECT_EQ(slots[i].shape, names[i].value().sizes().vec());
    const bool expert = slots[i].name.find(".mlp.experts.") != std::string::npos;
    EXPECT_EQ(slots[i].expert >= 0, expert) << slots[i].name;
    if (expert) {
      EXPECT_NE(slots[i].name.find(".experts." + std::to_string(slots[i].expert) + "."),
                std::string::npos);
    }
    // Shard 1 of 2 of 4 experts: experts 2 and 3.
    const bool mine = !expert || slots[i].name.find(".experts.2.") != std::string::npos ||
                      slots[i].name.find(".experts.3.") != std::string::npos;
    ASSERT_EQ(slots[i].local.defined(), mine) << slots[i].name;
    if (!mine) continue;
    ++held;
    EXPECT_TRUE(torch::equal(slots[i].local, names[i].value())) << slots[i].name;
  }
  EXPECT_EQ(held, static_cast<int64_t>(part->parameters().size()));
  EXPECT_EQ(count_parameters(part).total, count_parameters(whole).total);
  EXPECT_THROW(part->model->blocks[0]->moe_mlp->expert(0), c10::Error);

  // Its checkpoint file is the whole model's; loading takes its own experts, and the
  // others' are no mismatch.
  const std::string path = testing::TempDir() + "/whole.pth";
  save_weights(whole, path);
  torch::manual_seed(4);
  MiniMindForCausalLM other(cfg);
  init_weights(other);
  apply_expert_parallel(other, exchange);
  load_weights(other, path);
  for (const auto& p : other->named_parameters())
    EXPECT_TRUE(torch::equal(p.value(), whole->named_parameters()[p.key()])) << p.key();
}

// A model is whole or a shard with the exchange that reaches the others: expert parallelism
// that cannot split the experts evenly, a second application and a dense model are clear
// errors, and a refused application leaves the model whole.
TEST(ExpertShard, AShardComesWithItsExchangeOrNotAtAll) {
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  MiniMindForCausalLM model(small(true));  // 4 experts
  NoExchange three(0, 3), past_the_end(2, 2), two(1, 2);
  EXPECT_NE(message([&] { apply_expert_parallel(model, three); }).find("cannot split 4 experts"),
            std::string::npos);
  EXPECT_NE(message([&] { apply_expert_parallel(model, past_the_end); }).find("this one number 2"),
            std::string::npos);
  EXPECT_TRUE(model->expert_shard().whole());
  EXPECT_EQ(model->model->blocks[0]->moe_mlp->expert(3)->gate_proj->weight.size(0),
            model->config().expert_ffn_size());

  apply_expert_parallel(model, two);
  EXPECT_NE(message([&] { apply_expert_parallel(model, two); }).find("applied twice"),
            std::string::npos);
  EXPECT_NE(message([&] { model->model->blocks[0]->moe_mlp->expert(0); }).find("another rank"),
            std::string::npos);

  MiniMindForCausalLM dense(small(false));
  EXPECT_NE(message([&] { apply_expert_parallel(dense, two); }).find("needs a MoE model"),
            std::string::npos);
}
