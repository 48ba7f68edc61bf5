// Quantile balancing and hash-routed layers (balancing.h), against the test vectors of the
// trainers that define them and against the estimators' own contract.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "minimind/config.h"
#include "minimind/model/balancing/balancing.h"
#include "minimind/model/moe_feed_forward.h"

using namespace minimind;

namespace {

// cutoff - score of each token and expert [N, E]: the cutoff is the (k+1)-th largest of
// score + bias, as the MoE layer computes it in training.
torch::Tensor required_of(const torch::Tensor& scores, const torch::Tensor& bias, int64_t k) {
  const torch::Tensor top = std::get<0>(torch::topk(scores + bias, k + 1, -1));  // [N, k+1]
  return top.narrow(1, k, 1) - scores;                                           // [N, E]
}

torch::Tensor four_tokens(std::vector<float> scores) {  // [4, E]: one score row, 4 times
  return torch::tensor(scores).unsqueeze(0).repeat({4, 1});
}

void expect_near(const torch::Tensor& got, std::vector<double> want, double tol) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[static_cast<int64_t>(i)].item<double>(), want[i], tol) << "element " << i;
}

}  // namespace

// torchtitan's two-router, two-rank test (tests/unit_tests/gpu/test_quantile_balance.py):
// E = 4, k = 1, 10 bins, bias 0; each rank alone solves its own bias, and the summed
// histograms (the all-reduce) give the global one.
TEST(QuantileBalancing, TorchtitanTwoRankVectors) {
  const torch::Tensor bias = torch::zeros({4});
  const int64_t bins = 10, k = 1;
  const double width = quantile_bin_width(bias, bins);
  EXPECT_NEAR(width, 0.2, 1e-7);
  struct Layer {
    std::vector<float> rank0, rank1;
    std::vector<double> local0, local1, global;
  };
  const Layer layers[] = {{{0.92f, 0.68f, 0.31f, 0.07f},
                           {0.07f, 0.31f, 0.92f, 0.68f},
                           {-0.5, -0.1, 0.1, 0.5},
                           {0.5, 0.1, -0.5, -0.1},
                           {-0.2, 0.2, -0.2, 0.2}},
                          {{0.68f, 0.92f, 0.07f, 0.31f},
                           {0.31f, 0.07f, 0.68f, 0.92f},
                           {-0.1, -0.5, 0.5, 0.1},
                           {0.1, 0.5, -0.1, -0.5},
                           {0.2, -0.2, 0.2, -0.2}}};
  for (const Layer& l : layers) {
    const torch::Tensor h0 =
        quantile_histogram(required_of(four_tokens(l.rank0), bias, k), bias, bins);
    const torch::Tensor h1 =
        quantile_histogram(required_of(four_tokens(l.rank1), bias, k), bias, bins);
    EXPECT_EQ(h0.sizes(), (torch::IntArrayRef{4, bins}));
    expect_near(quantile_bias_from_histogram(h0, width, k), l.local0, 1e-6);
    expect_near(quantile_bias_from_histogram(h1, width, k), l.local1, 1e-6);
    expect_near(quantile_bias_from_histogram(h0 + h1, width, k), l.global, 1e-6);
  }
}

// torchtitan's newer k = 2 case of the same test: the first rank's first layer chooses two
// experts a token, so the cutoff is the third score (0.31) and every expert takes half of
// the four tokens: positions [1.5, 3.5, 5.5, 6.5] bins, centred and times 0.2.
TEST(QuantileBalancing, TorchtitanTopTwoVector) {
  const torch::Tensor bias = torch::zeros({4});
  const int64_t bins = 10, k = 2;
  const torch::Tensor h = quantile_histogram(
      required_of(four_tokens({0.92f, 0.68f, 0.31f, 0.07f}), bias, k), bias, bins);
  expect_near(quantile_bias_from_histogram(h, quantile_bin_width(bias, bins), k),
              {-0.55, -0.15, 0.25, 0.45}, 1e-6);
}

// Megatron-LM PR #6637's test_qb_histogram_recovery: bounds [-1, 1], 4 bins, k = 1.
TEST(QuantileBalancing, MegatronHistogramRecovery) {
  const torch::Tensor h = torch::tensor({{0, 2, 2, 0}, {2, 2, 0, 0}}, torch::kLong);
  expect_near(quantile_bias_from_histogram(h, 0.5, 1), {0.25, -0.25}, 1e-12);
  // The next bins span [min b - 1, max b + 1] = [-1.25, 1.25], as Megatron's stored bounds.
  EXPECT_NEAR(quantile_bin_width(torch::tensor({0.25f, -0.25f}), 4), 2.5 / 4, 1e-7);
}

// The exact estimator admits each expert's balanced share: #(r < b) <= N*k/E <= #(r <= b)
// per expert, on skewed sigmoid scores; the histogram approaches it as its bins shrink.
TEST(QuantileBalancing, ExactQuantileMeetsItsContractAndTheHistogramApproachesIt) {
  torch::manual_seed(3);
  const int64_t N = 4096, E = 16, k = 2;
  const torch::Tensor skew = torch::linspace(-2, 2, E);
  const torch::Tensor scores = torch::sigmoid(torch::randn({N, E}) + skew);  // [N, E]
  const torch::Tensor bias = torch::randn({E}) * 0.1;
  const torch::Tensor r = required_of(scores, bias, k);
  const torch::Tensor b = quantile_bias_exact(r, k);  // [E] float64, not centred
  const double q = static_cast<double>(N * k) / E;
  for (int64_t j = 0; j < E; ++j) {
    const torch::Tensor col = r.select(1, j).to(torch::kFloat64);
    const double bj = b[j].item<double>();
    EXPECT_LE((col < bj).sum().item<int64_t>(), q) << "expert " << j;
    EXPECT_GE((col <= bj).sum().item<int64_t>(), q) << "expert " << j;
  }
  // Centred, the exact and a fine histogram agree to about a bin's width.
  const int64_t bins = 100000;
  const double width = quantile_bin_width(bias, bins);
  const torch::Tensor from_hist =
      quantile_bias_from_histogram(quantile_histogram(r, bias, bins), width, k);
  const torch::Tensor exact = b - b.mean();
  EXPECT_LE((from_hist - exact).abs().max().item<double>(), 2 * width);
  // Solving once moves the counts towards N*k/E = 512 on this batch (each expert's own
  // quantile; every bias moves at once, so one step is not exact balance).
  const auto count = [&](const torch::Tensor& with) {
    const torch::Tensor index = std::get<1>(torch::topk(scores + with, k, -1));
    return torch::bincount(index.reshape({-1}), {}, E).to(torch::kFloat64);
  };
  const auto max_vio = [&](const torch::Tensor& c) {
    return (c.max() / c.mean() - 1).item<double>();
  };
  const double before = max_vio(count(bias)), after = max_vio(count(exact.to(torch::kFloat32)));
  EXPECT_GT(before, 1.0);
  EXPECT_LT(after, 0.5 * before);
}

TEST(QuantileBalancing, UpdateBlendsByEmaAndCentres) {
  BalancingOptions o;
  o.bias_rule = BiasRule::quantile, o.qb_estimator = QbEstimator::exact;
  torch::manual_seed(1);
  const torch::Tensor r = torch::rand({64, 4});
  const torch::Tensor solved = quantile_bias_exact(r, 1);
  torch::Tensor bias = torch::tensor({0.3f, -0.1f, -0.1f, -0.1f});
  const torch::Tensor old = bias.clone();
  o.qb_ema = 0.25;
  update_quantile_bias(bias, r, o, 1);
  torch::Tensor want = old.to(torch::kFloat64) * 0.25 + (solved - solved.mean()) * 0.75;
  want = want - want.mean();
  EXPECT_LE((bias.to(torch::kFloat64) - want).abs().max().item<double>(), 1e-7);
  EXPECT_NEAR(bias.sum().item<double>(), 0.0, 1e-6);
  // A step without tokens leaves the bias.
  const torch::Tensor kept = bias.clone();
  update_quantile_bias(bias, torch::zeros({0, 4}), o, 1);
  EXPECT_TRUE(bias.equal(kept));
}

TEST(HashLayers, TablesAreRoundRobinOrDistinctRandomExperts) {
  const torch::Tensor rr = hash_routing_table(HashTable::round_robin, 10, 4, 2);  // [10, 2]
  for (int64_t t = 0; t < 10; ++t)
    for (int64_t j = 0; j < 2; ++j) EXPECT_EQ(rr[t][j].item<int64_t>(), (t + j) % 4);
  torch::manual_seed(0);
  const torch::Tensor rnd = hash_routing_table(HashTable::random, 500, 8, 3);  // [500, 3]
  EXPECT_GE(rnd.min().item<int64_t>(), 0);
  EXPECT_LT(rnd.max().item<int64_t>(), 8);
  for (int64_t t = 0; t < 500; ++t) {
    const torch::Tensor row = std::get<0>(torch::sort(rnd[t]));
    EXPECT_TRUE((row.slice(0, 1) != row.slice(0, 0, 2)).all().item<bool>()) << "token " << t;
  }
  // Every expert is used, near evenly (a uniform draw: 500 * 3 / 8 = 187.5 each).
  const torch::Tensor used = torch::bincount(rnd.reshape({-1}), {}, 8);
  EXPECT_GT(used.min().item<int64_t>(), 120);
}

// A hash-routed layer chooses by the table and weighs by its gate's renormalised scores; it
// has no bias and no balancing loss.
TEST(HashLayers, TheTableChoosesAndTheGateWeighs) {
  ModelConfig cfg;
  cfg.hidden_size = 8, cfg.use_moe = true, cfg.num_experts = 4, cfg.num_experts_per_tok = 2;
  cfg.moe_intermediate_size = 4, cfg.vocab_size = 16, cfg.hash_layers = 1;
  cfg.scoring_func = ScoringFunc::sigmoid, cfg.router_aux_loss_coef = 0.1;
  torch::manual_seed(7);
  MOEFeedForward hashed(MoEOptions::from(cfg, 0));
  MOEFeedForward learned(MoEOptions::from(cfg, 1));
  EXPECT_TRUE(hashed->hash_table().defined());
  EXPECT_FALSE(learned->hash_table().defined());
  const torch::Tensor x = torch::randn({1, 6, 8});
  const torch::Tensor ids = torch::tensor({3, 3, 9, 0, 15, 6}, torch::kLong);
  hashed->train();
  const MoEOutput out = hashed->forward(x, torch::Tensor(), ids);
  EXPECT_TRUE(out.stats.index.equal((ids.unsqueeze(1) + torch::arange(2)).remainder(4)));
  EXPECT_EQ(out.aux_loss.item<double>(), 0.0);
  // The same output from the plain formula.
  const torch::Tensor s = torch::sigmoid(torch::matmul(x.view({6, 8}), hashed->gate->weight.t()));
  torch::Tensor w = s.gather(1, out.stats.index);
  w = w / w.sum(1, true);
  torch::Tensor y = torch::zeros({6, 8});
  for (int64_t t = 0; t < 6; ++t)
    for (int64_t j = 0; j < 2; ++j) {
      const int64_t e = out.stats.index[t][j].item<int64_t>();
      y[t] += w[t][j] * hashed->expert(e)(x[0][t].unsqueeze(0)).squeeze(0);
    }
  EXPECT_LE((out.y.view({6, 8}) - y).abs().max().item<double>(), 1e-6);
  // The learned layer has its aux loss.
  learned->train();
  EXPECT_GT(learned->forward(x, torch::Tensor(), ids).aux_loss.item<double>(), 0.0);

  // No bias: with the sign rule or quantile balancing configured, the learned layer carries a
  // selection bias (a buffer, moved by an update); the hash layer has none, saves none and
  // an update leaves its choice and output as they were.
  for (const BiasRule rule : {BiasRule::sign, BiasRule::quantile}) {
    ModelConfig b = cfg;
    b.router_aux_loss_coef = 0, b.router_bias_rule = rule;
    b.router_bias_update_rate = rule == BiasRule::sign ? 0.5 : 0.0;
    torch::manual_seed(7);
    MOEFeedForward h(MoEOptions::from(b, 0));
    MOEFeedForward l(MoEOptions::from(b, 1));
    ASSERT_TRUE(l->bias().defined()) << name_of(rule);
    EXPECT_FALSE(h->bias().defined()) << name_of(rule);
    for (const auto& buffer : h->named_buffers())
      EXPECT_EQ(buffer.key().find("e_score_correction_bias"), std::string::npos) << buffer.key();
    h->train(), l->train();
    const MoEOutput before = h->forward(x, torch::Tensor(), ids);
    const MoEOutput l_out = l->forward(x, torch::Tensor(), ids);
    EXPECT_FALSE(before.stats.qb.defined()) << "a hash layer gathers no quantile statistic";
    const torch::Tensor l_bias = l->bias().clone();
    h->update_bias({6, 0, 0, 0}, torch::Tensor());
    l->update_bias({6, 0, 0, 0}, l_out.stats.qb);
    EXPECT_FALSE(torch::equal(l->bias(), l_bias)) << name_of(rule) << ": the learned bias moves";
    const MoEOutput after = h->forward(x, torch::Tensor(), ids);
    EXPECT_TRUE(after.stats.index.equal(before.stats.index));
    EXPECT_TRUE(after.y.equal(before.y));
  }
}

// DeepSeek-V4's scores s = sqrt(softplus(logit)) at known points (s(0) = sqrt(ln 2)), as the
// layer computes them: a one-hot token whose logits are the gate's first column; the aux
// losses' probabilities are s / sum s, and top-1 without renormalisation mixes with s itself
// (times routed_scaling_factor).
TEST(SqrtSoftplus, ScoresAtKnownPoints) {
  ModelConfig cfg;
  cfg.hidden_size = 4, cfg.use_moe = true, cfg.num_experts = 4, cfg.num_experts_per_tok = 1;
  cfg.moe_intermediate_size = 1, cfg.norm_topk_prob = false, cfg.routed_scaling_factor = 1.5;
  cfg.scoring_func = ScoringFunc::sqrtsoftplus;
  MOEFeedForward moe(MoEOptions::from(cfg));
  torch::NoGradGuard no_grad;
  moe->gate->weight.zero_();
  moe->gate->weight.select(1, 0).copy_(torch::tensor({0.0f, 1.0f, -1.0f, 30.0f}));  // [E]
  for (int64_t e = 0; e < 4; ++e) {  // expert e returns silu(1) on output 0 for this token
    moe->expert(e)->gate_proj->weight.fill_(1), moe->expert(e)->up_proj->weight.fill_(1);
    moe->expert(e)->down_proj->weight.zero_()[0][0] = 1;
  }
  const torch::Tensor x = torch::tensor({1.0f, 0.0f, 0.0f, 0.0f}).view({1, 1, 4});
  const MoEOutput out = moe->forward(x);
  const double s[4] = {0.832554611, 1.14597630, 0.559697854, std::sqrt(30.0)};
  const double sum = s[0] + s[1] + s[2] + s[3];
  for (int64_t e = 0; e < 4; ++e)
    EXPECT_NEAR(out.stats.probs[0][e].item<double>(), s[e] / sum, 2e-7) << "expert " << e;
  EXPECT_EQ(out.stats.index[0][0].item<int64_t>(), 3);
  const double silu1 = 1.0 / (1.0 + std::exp(-1.0));
  EXPECT_NEAR(out.y[0][0][0].item<double>(), 1.5 * s[3] * silu1, 1e-5);
}
