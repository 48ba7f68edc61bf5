// The optimizer step: the lr schedule, the fused AdamW against torch's, micro-batch shards
// side by side, and gradient accumulation.
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
#include "minimind/util/matmul.h"
#include "minimind/util/side_by_side.h"
#include "support/test_support.h"

using namespace minimind;
using namespace minimind::test;
namespace fs = std::filesystem;

namespace {

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

// Clipping handed to the optimizer (clip_gradients' `deferred` scale, step_scaled) gives the
// weights and moments of clipping first and then step(), bitwise, and leaves the gradients
// as they were; once clipping (scale < 1) and once under the limit (scale 1).
TEST(FusedAdamW, ClippingHandedToTheStepGivesTheNumbersOfClippingFirst) {
  torch::manual_seed(6);
  TrainConfig tc;
  tc.weight_decay = 0.1;
  const std::vector<std::vector<int64_t>> shapes = {{300, 700}, {33}, {1 << 18}};
  for (const double max_norm : {1.0, 1e9}) {
    std::vector<torch::Tensor> first, handed, grads;
    for (const auto& shape : shapes) {
      const torch::Tensor init = torch::randn(shape);
      first.push_back(init.clone().requires_grad_());
      handed.push_back(init.clone().requires_grad_());
    }
    auto opt_first = make_optimizer(first, tc), opt_handed = make_optimizer(handed, tc);
    auto* fused = dynamic_cast<FusedAdamW*>(opt_handed.get());
    ASSERT_NE(fused, nullptr);
    for (int step = 1; step <= 3; ++step) {
      grads.clear();
      for (size_t i = 0; i < shapes.size(); ++i) {
        grads.push_back(torch::randn(shapes[i]));
        first[i].mutable_grad() = grads[i].clone(), handed[i].mutable_grad() = grads[i].clone();
      }
      const double norm_first = clip_gradients(first, max_norm);
      opt_first->step();
      float scale = -1;
      const double norm_handed = clip_gradients(handed, max_norm, &scale);
      fused->step_scaled(scale);
      EXPECT_EQ(norm_first, norm_handed);
      EXPECT_GT(norm_first, 1.0);
      if (max_norm == 1.0)
        EXPECT_LT(scale, 1.0f);
      else
        EXPECT_EQ(scale, 1.0f);
      for (size_t i = 0; i < shapes.size(); ++i) {
        EXPECT_TRUE(torch::equal(first[i], handed[i])) << max_norm << " " << step << " " << i;
        EXPECT_TRUE(torch::equal(handed[i].grad(), grads[i])) << "the gradient was changed";
      }
    }
    for (size_t i = 0; i < shapes.size(); ++i) {
      const std::string key = c10::guts::to_string(first[i].unsafeGetTensorImpl());
      const std::string key_h = c10::guts::to_string(handed[i].unsafeGetTensorImpl());
      auto& a = static_cast<torch::optim::AdamWParamState&>(*opt_first->state().at(key));
      auto& b = static_cast<torch::optim::AdamWParamState&>(*opt_handed->state().at(key_h));
      EXPECT_TRUE(torch::equal(a.exp_avg(), b.exp_avg())) << i;
      EXPECT_TRUE(torch::equal(a.exp_avg_sq(), b.exp_avg_sq())) << i;
    }
  }
}

// bf16 training rounds each weight once per step into a kept copy (to_bf16, and
// to_bf16_cat for an expert's stacked gate and up). FusedAdamW writes those copies as it
// updates the weights: after a step the cache hands out the same buffers, now holding the
// new weights rounded, bit for bit, without rounding again. A copy that something else
// still holds (a graph that saved it) keeps its numbers, and the next call rounds afresh.
TEST(FusedAdamW, WritesTheKeptBf16CopiesAsItUpdates) {
  torch::manual_seed(8);
  TrainConfig tc;
  tc.weight_decay = 0.1;
  std::vector<torch::Tensor> params;
  for (const auto& shape :
       std::vector<std::vector<int64_t>>{{300, 700}, {40, 64}, {24, 64}, {33}, {50, 8}})
    params.push_back(torch::randn(shape).requires_grad_());
  const torch::Tensor &a = params[0], &b = params[1], &c = params[2], &e = params[4];
  auto opt = make_optimizer(params, tc);
  auto rounded = [](const torch::Tensor& x) { return x.detach().to(torch::kBFloat16); };
  for (int step = 1; step <= 2; ++step) {
    const void* a_buffer = to_bf16(a, /*parameter=*/true).data_ptr();
    const void* bc_buffer = to_bf16_cat({b, c}).data_ptr();
    const torch::Tensor held = to_bf16(e, /*parameter=*/true);  // as a saved graph would
    const torch::Tensor held_before = held.clone();
    for (auto& p : params) p.mutable_grad() = torch::randn(p.sizes());
    opt->step();
    const torch::Tensor a_copy = to_bf16(a, true), bc_copy = to_bf16_cat({b, c});
    EXPECT_EQ(a_copy.data_ptr(), a_buffer) << "step " << step << ": rounded again";
    EXPECT_EQ(bc_copy.data_ptr(), bc_buffer) << "step " << step << ": rounded again";
    EXPECT_TRUE(torch::equal(a_copy, rounded(a))) << step;
    EXPECT_TRUE(torch::equal(bc_copy, torch::cat({rounded(b), rounded(c)}))) << step;
    EXPECT_TRUE(torch::equal(held, held_before)) << "a held copy was overwritten";
    const torch::Tensor e_copy = to_bf16(e, true);
    EXPECT_NE(e_copy.data_ptr(), held.data_ptr());
    EXPECT_TRUE(torch::equal(e_copy, rounded(e))) << step;
  }
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
      "        router_z_loss_coef: 0.001, router_importance_loss_coef: 0.1}\n"
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
      return Batch{rows.narrow(0, r, 5), labels.narrow(0, r, 5), {}};
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
      // The importance loss is a function of the whole micro-batch's gate sums: the
      // shards' parts add up to it.
      ASSERT_TRUE(sl.importance && wl.importance);
      EXPECT_NEAR(*sl.importance, *wl.importance, 1e-12);
      EXPECT_GT(*sl.importance, 0.0);
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
        return Batch{bad, bad, {}};
      },
      two_shards));
}

// The routing margin's mean runs over the micro-batch's real tokens (input id != 0), which
// the shards count once before they split it: padding spread unevenly over the shards gives
// the whole micro-batch's margin, not a mean of the shards' own means.
TEST(ShardedMicroBatch, RoutingMarginCountsTheWholeMicroBatchsRealTokens) {
  Config cfg = load_config_string(
      "model: {hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4,\n"
      "        num_key_value_heads: 2, vocab_size: 256, max_position_embeddings: 64,\n"
      "        use_moe: true, num_experts: 4, num_experts_per_tok: 2}\n"
      "data: {max_seq_len: 16}\n",
      "shards");
  validate_and_resolve(cfg);
  torch::manual_seed(5);
  torch::Tensor rows = torch::randint(3, 256, {4, 17}, torch::kLong);  // [4, 17]
  // Rows 0-1 (the first shard) padded from position 4, rows 2-3 not at all.
  rows.narrow(0, 0, 2).narrow(1, 4, 13).fill_(0);
  torch::Tensor labels = rows.masked_fill(rows == 0, -100);
  auto margins = [&](int shards) {
    auto [model, opt] = seeded_model(cfg, torch::kFloat64);
    StepOptions so;
    so.lr = 1e-3, so.shards = shards;
    const StepStats s = optimizer_step(
        model, *opt,
        [&] {
          return Batch{rows, labels, {}};
        },
        so);
    std::vector<std::pair<double, double>> out;
    for (const LayerStats& l : s.layers) {
      EXPECT_TRUE(l.margin && l.margin_small);
      out.emplace_back(l.margin.value_or(-1), l.margin_small.value_or(-1));
    }
    return out;
  };
  const auto whole = margins(1), sharded = margins(2);
  ASSERT_EQ(whole.size(), 2u);
  ASSERT_EQ(sharded.size(), 2u);
  // Independently: the router's probabilities of the same first forward (softmax, no bias:
  // what top-k chose by), each real token's 2nd minus 3rd largest, averaged over the 38 real
  // tokens; the share of them under kSmallMargin.
  auto [model, opt] = seeded_model(cfg, torch::kFloat64);
  const ForwardOutput out = model->forward(rows, labels);
  const torch::Tensor real = (rows != 0).reshape({-1});  // [N]
  ASSERT_EQ(real.sum().item<int64_t>(), 2 * 4 + 2 * 17);
  for (size_t l = 0; l < 2; ++l) {
    const torch::Tensor p = out.moe[l].probs.index({real});            // [n, E]
    const torch::Tensor top = std::get<0>(torch::sort(p, 1, true));    // [n, E] descending
    const torch::Tensor margin = top.select(1, 1) - top.select(1, 2);  // [n]
    EXPECT_GT(whole[l].first, 0.0);
    EXPECT_NEAR(whole[l].first, margin.mean().item<double>(), 1e-12) << "layer " << l;
    EXPECT_NEAR(whole[l].second, (margin < kSmallMargin).to(torch::kFloat64).mean().item<double>(),
                1e-12)
        << "layer " << l;
    EXPECT_NEAR(sharded[l].first, whole[l].first, 1e-12) << "layer " << l;
    EXPECT_NEAR(sharded[l].second, whole[l].second, 1e-12) << "layer " << l;
  }
}

// Live routing change (RoutingChange): per layer, the share of the probe's real tokens whose
// expert set changed since the previous measure. Layer 0's experts 0 and 1 are made equal,
// so that swapping their router rows sends every token of one to the other without changing
// what the layer computes: layer 0 changes for exactly the real tokens that chose 0 or 1
// (counted from the model's own routing), layer 1 for none. The previous choices travel in a
// checkpoint's monitor state; a checkpoint without them starts afresh.
TEST(RoutingChange, CountsRealTokensWhoseExpertsChangedAndResumes) {
  Config cfg = load_config_string(
      "model: {hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 2,\n"
      "        num_key_value_heads: 1, vocab_size: 64, max_position_embeddings: 32,\n"
      "        use_moe: true, num_experts: 4, num_experts_per_tok: 1, norm_topk_prob: true}\n"
      "data: {max_seq_len: 16}\n",
      "routing_change");
  validate_and_resolve(cfg);
  torch::manual_seed(3);
  MiniMindForCausalLM model(cfg.model);
  init_weights(model);
  auto params = model->named_parameters();
  const std::string e = "model.layers.0.mlp.experts.";
  {
    torch::NoGradGuard no_grad;
    for (const char* m : {".gate_proj.weight", ".up_proj.weight", ".down_proj.weight"})
      params[e + "1" + m].copy_(params[e + "0" + m]);
  }
  torch::Tensor ids = torch::randint(3, 64, {2, 12}, torch::kLong);  // [2, 12]
  ids[1].narrow(0, 8, 4).fill_(0);                                   // 4 padding tokens
  auto swap_router_rows = [&] {
    torch::NoGradGuard no_grad;
    torch::Tensor w = params["model.layers.0.mlp.gate.weight"];  // [E, H]
    const torch::Tensor row0 = w[0].clone();
    w[0].copy_(w[1]);
    w[1].copy_(row0);
  };
  auto measured = [](RoutingChange& rc, MiniMindForCausalLM& m) {
    std::vector<LayerStats> layers;
    rc.measure(m, layers);
    std::vector<std::optional<double>> out;
    for (const LayerStats& l : layers) out.push_back(l.routing_change);
    return out;
  };

  RoutingChange rc(ids);
  for (const auto& v : measured(rc, model)) EXPECT_FALSE(v) << "the first measure sets nothing";
  EXPECT_EQ(measured(rc, model), (std::vector<std::optional<double>>{0.0, 0.0}));

  model->eval();
  const ForwardOutput before = model->forward(ids);
  model->train();
  const torch::Tensor real = (ids != 0).reshape({-1});                         // [24]
  const torch::Tensor chose = before.moe[0].index.select(1, 0).index({real});  // [20]
  const double expected = ((chose == 0) | (chose == 1)).to(torch::kFloat64).mean().item<double>();
  ASSERT_GT(expected, 0.0);
  ASSERT_LT(expected, 1.0);
  nlohmann::json state;
  rc.save_state(state);
  swap_router_rows();
  const auto swapped = measured(rc, model);
  ASSERT_EQ(swapped.size(), 2u);
  EXPECT_NEAR(swapped[0].value_or(-1), expected, 1e-12);
  EXPECT_EQ(swapped[1].value_or(-1), 0.0);

  // Restored from the state saved before the swap: the same figures as the run that kept
  // going; without a saved probe, nothing at the first measure.
  RoutingChange resumed(ids);
  resumed.restore_state(state);
  EXPECT_EQ(measured(resumed, model), swapped);
  RoutingChange older(ids);
  older.restore_state(nlohmann::json::object());
  for (const auto& v : measured(older, model)) EXPECT_FALSE(v);
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
      return Batch{b, b, {}};
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

}  // namespace
