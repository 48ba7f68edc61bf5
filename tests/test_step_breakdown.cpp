// minimind-bench --breakdown: how a profiled step's time is split into parts, and its
// products set beside their lone speed.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "minimind/compute_plan.h"
#include "minimind/flops.h"
#include "minimind/model/minimind_model.h"
#include "minimind/train/bench.h"
#include "minimind/train/optim.h"
#include "minimind/train/step_breakdown.h"
#include "minimind/train/train_step.h"
#include "minimind/util/blas_check.h"
#include "minimind/util/matmul.h"
#include "minimind/util/step_part.h"
#include "minimind/util/stopwatch.h"
#include "support/test_support.h"

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

// A model of the bench config `preset` with two layers built with `products`, and one
// optimizer step of it on random ids [2, T] each call.
std::function<void()> two_layer_step(const std::string& preset, int64_t T,
                                     const Products& products) {
  const Config cfg = bench_config(preset, {"model.num_hidden_layers=2"});
  torch::manual_seed(0);
  MiniMindForCausalLM model(cfg.model, products);
  init_weights(model);
  model->train();
  std::shared_ptr<torch::optim::AdamW> opt = make_optimizer(model->parameters(), cfg.train);
  const torch::Tensor ids = torch::randint(3, cfg.model.vocab_size, {2, T}, torch::kLong);
  StepOptions so;
  so.lr = cfg.train.learning_rate, so.grad_clip = cfg.train.grad_clip;
  return [model, opt, ids, so]() mutable {
    optimizer_step(
        model, *opt,
        [&] {
          return Batch{ids, ids, {}};
        },
        so);
  };
}

// A real MoE step, recorded: the rows add up to the step, and the parts the model marks show.
TEST(StepBreakdown, RecordsATrainingStep) {
  auto step = two_layer_step("moe-top1", 64, Products{});  // fp32 on OpenBLAS
  step();                                                  // warm-up
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

// A 100 ms step on 2 cores: 30, 20 and 25 ms of products, 10 of attention, 15 of other ops.
StepBreakdown hundred_ms_step() {
  StepBreakdown b;
  b.step_ms = 100, b.cores = 2;
  b.rows = {{"products forward", 30},
            {"products backward, by input", 20},
            {"products backward, by weight", 25},
            {"attention", 10},
            {"other ops", 15}};
  return b;
}

// The products alone: shapes to the breakdown's rows, counts per step, and the step with its
// product rows at their lone time.
TEST(ProductsAlone, RowsFollowTheBreakdownPerStep) {
  const test::PlanScope compute(Precision::fp32, MatmulBackend::onednn);
  const StepBreakdown b = hundred_ms_step();
  const ProductShape fwd{StepPart::product_forward, Precision::fp32, 'N', 'T', 64, 32, 16};
  const ProductShape att{StepPart::attention, Precision::fp32, 'N', 'N', 16, 8, 32};
  const ProductsAlone p = time_products_alone({{fwd, {6, 0.03}}, {att, {2, 0.001}}}, 2, b);
  ASSERT_EQ(p.rows.size(), 4u);  // no product ran elsewhere: no such row
  EXPECT_EQ(p.cores, 2);
  EXPECT_EQ(p.rows[0].step_ms, 30);
  EXPECT_EQ(p.rows[1].step_ms, 20);
  EXPECT_EQ(p.rows[2].step_ms, 25);
  EXPECT_LT(p.rows[3].step_ms, 0);  // the attention row holds more than its products
  EXPECT_DOUBLE_EQ(p.rows[0].gflop, 3 * fwd.flops() / 1e9);  // 6 over 2 steps
  EXPECT_DOUBLE_EQ(p.rows[3].gflop, att.flops() / 1e9);
  EXPECT_GT(p.rows[0].alone_ms, 0);
  EXPECT_EQ(p.rows[1].alone_ms, 0);
  EXPECT_GT(p.rows[3].alone_ms, 0);
  EXPECT_DOUBLE_EQ(p.alone_ms(), p.rows[0].alone_ms + p.rows[3].alone_ms);
  EXPECT_DOUBLE_EQ(p.gflop(), p.rows[0].gflop + p.rows[3].gflop);
  // Each product row at its lone time (the attention row stays): 100 - (30 - t) - 20 - 25.
  EXPECT_DOUBLE_EQ(p.step_ms_at_lone_speed(b), 25 + p.rows[0].alone_ms);
  const nlohmann::json j = products_alone_json(p);
  EXPECT_EQ(j["rows"].size(), 4u);
  EXPECT_TRUE(j["rows"][3]["step_ms"].is_null());
  EXPECT_THROW(time_products_alone({{fwd, {1, 0.01}}}, 0, b), std::invalid_argument);
}

// The families: shapes alike but for the tokens' dimension (m forward and by input, k by
// weight; any in attention's blocks) are one, with each dimension's range, their calls and
// times per step (core time / cores), most time lost first.
TEST(ProductsAlone, FamiliesJoinShapesThatDifferInTheirTokens) {
  const test::PlanScope compute(Precision::fp32, MatmulBackend::onednn);
  const StepBreakdown b = hundred_ms_step();
  const Precision f32 = Precision::fp32;
  const ProductShape fwd_a{StepPart::product_forward, f32, 'N', 'T', 40, 32, 16},
      fwd_b{StepPart::product_forward, f32, 'N', 'T', 24, 32, 16},
      fwd_other{StepPart::product_forward, f32, 'N', 'T', 40, 16, 32},
      wgt_a{StepPart::product_grad_weight, f32, 'T', 'N', 32, 16, 40},
      wgt_b{StepPart::product_grad_weight, f32, 'T', 'N', 32, 16, 24},
      att_a{StepPart::attention, f32, 'N', 'T', 16, 8, 32},
      att_b{StepPart::attention, f32, 'N', 'T', 32, 16, 32};
  // Four steps; the first forward family's calls take long in the step: it loses the most.
  const ProductsAlone p = time_products_alone({{fwd_a, {8, 0.4}},
                                               {fwd_b, {4, 0.2}},
                                               {fwd_other, {4, 1e-6}},
                                               {wgt_a, {4, 0.004}},
                                               {wgt_b, {4, 0.004}},
                                               {att_a, {8, 1e-6}},
                                               {att_b, {8, 1e-6}}},
                                              4, b);
  ASSERT_EQ(p.families.size(), 4u);
  const ProductsAlone::Family& f = p.families[0];
  EXPECT_EQ(f.row, "forward");
  EXPECT_EQ(f.m, (std::array<int64_t, 2>{24, 40}));
  EXPECT_EQ(f.n, (std::array<int64_t, 2>{32, 32}));
  EXPECT_EQ(f.k, (std::array<int64_t, 2>{16, 16}));
  EXPECT_DOUBLE_EQ(f.per_step, 3);                 // 12 calls over 4 steps
  EXPECT_DOUBLE_EQ(f.step_ms, 1e3 * 0.6 / 4 / 2);  // their seconds a step / cores
  EXPECT_GT(f.alone_ms, 0);
  EXPECT_DOUBLE_EQ(f.lost_ms(), f.step_ms - f.alone_ms);
  for (size_t i = 1; i < p.families.size(); ++i)
    EXPECT_GE(p.families[i - 1].lost_ms(), p.families[i].lost_ms());
  double alone = 0;
  for (const auto& fam : p.families) {
    alone += fam.alone_ms;
    if (fam.row == "backward, by weight") {
      EXPECT_EQ(fam.k, (std::array<int64_t, 2>{24, 40}));
      EXPECT_DOUBLE_EQ(fam.per_step, 2);
    }
    if (fam.row == "attention's (in its row)") {
      EXPECT_EQ(fam.m, (std::array<int64_t, 2>{16, 32}));
      EXPECT_EQ(fam.n, (std::array<int64_t, 2>{8, 16}));
      EXPECT_DOUBLE_EQ(fam.per_step, 4);
    }
  }
  EXPECT_NEAR(alone, p.alone_ms(), 1e-9 * alone);  // the families hold every product
  const std::string table = format_product_families(p, 2);
  EXPECT_NE(table.find("| forward (fp32) | [24-40, 16] @ [16, 32]^T | 3.0 |"), std::string::npos)
      << table;
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 4);  // header, rule, two rows
  EXPECT_EQ(products_alone_json(p)["families"].size(), 4u);
}

// Every product of a training step reaches the log once: the products' FLOPs are the model's
// FLOPs (flops.h) less attention's. Attention's own: the causal blocks skip what the mask
// hides, and the backward forms the scores again (7 products where the formula counts 6).
TEST(ProductsAlone, TheLogSeesEveryProductOfATrainingStep) {
  for (const Precision prec : {Precision::fp32, Precision::bf16}) {
    SCOPED_TRACE(name_of(prec));
    const test::PlanScope compute(prec, MatmulBackend::onednn);
    const Config cfg = bench_config("moe-top2", {"model.num_hidden_layers=2"});
    const int64_t B = 2, T = 64;
    auto step = two_layer_step("moe-top2", T, compute.products());
    std::map<ProductShape, int64_t> counts;
    double kernel_seconds = 0, wall = 0;
    {
      const ProductLog log;
      const Stopwatch clock;
      step();
      wall = clock.seconds();
      counts = log.counts();
      for (const auto& [shape, t] : log.tallies()) kernel_seconds += t.seconds;
    }
    // The kernels' time: part of the step, no more than the cores had.
    EXPECT_GT(kernel_seconds, 0);
    EXPECT_LE(kernel_seconds, wall * std::max(1, blas_threads()));
    std::map<StepPart, double> flops;
    for (const auto& [shape, n] : counts) {
      // The router's gate stays fp32 in bf16 training (docs/precision.md): E columns.
      const int64_t E = cfg.model.num_experts;
      // Without oneDNN's bf16 GEMM (no AVX-512) bf16 products run as fp32 GEMMs.
      if (shape.m != E && shape.n != E && shape.k != E) {
        EXPECT_EQ(shape.precision, bf16_gemm_native() ? prec : Precision::fp32);
      }
      flops[shape.part] += shape.flops() * static_cast<double>(n);
    }
    const FlopsPerToken f = flops_per_token(cfg.model, T);
    const double tokens = B * T;
    EXPECT_NEAR(flops[StepPart::product_forward] + flops[StepPart::product_grad_input] +
                    flops[StepPart::product_grad_weight],
                (f.total() - f.attention_scores) * tokens, 1e-9 * f.total() * tokens);
    EXPECT_NEAR(flops[StepPart::product_forward] * 2,
                flops[StepPart::product_grad_input] + flops[StepPart::product_grad_weight],
                1e-9 * f.total() * tokens);
    EXPECT_GT(flops[StepPart::attention], 0.5 * f.attention_scores * tokens);
    EXPECT_LE(flops[StepPart::attention], 7.0 / 6 * f.attention_scores * tokens);
    EXPECT_EQ(flops.size(), 4u);  // no product outside these parts
  }
}

}  // namespace
}  // namespace minimind
