// The MoE layer alone: a fixed router (dispatch, weights, counts, aux loss), the routing
// margins, the single-token path, and the routed experts' and fused feed-forward nodes
// against their plain forms.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "minimind/compute_plan.h"
#include "minimind/config.h"
#include "minimind/model/attention.h"
#include "minimind/model/feed_forward.h"
#include "minimind/model/linear.h"
#include "minimind/model/moe_feed_forward.h"
#include "minimind/model/next_token_loss.h"
#include "minimind/model/rms_norm.h"
#include "minimind/model/rope.h"
#include "minimind/model/routed_experts.h"
#include "minimind/util/blas_check.h"
#include "minimind/util/matmul.h"
#include "support/hand_set.h"
#include "support/test_support.h"

using namespace minimind;
using test::set;
using test::silu;

namespace {

// A MoE layer of 4 experts, top-2, over hidden 4, whose router is fixed: token n is the
// one-hot vector e_n and gate.weight[e][n] its logit for expert e. Expert e has width 1 with
// gate and up weights 1 and down_proj = e_e, so for a one-hot token it returns
// silu(1) * e_e: the output of token n is sum over its two experts of weight * silu(1) * e_e.
MOEFeedForward fixed_router_moe(bool norm_topk_prob, double aux_coef) {
  ModelConfig cfg;
  cfg.hidden_size = 4, cfg.use_moe = true, cfg.num_experts = 4, cfg.num_experts_per_tok = 2;
  cfg.moe_intermediate_size = 1, cfg.norm_topk_prob = norm_topk_prob;
  cfg.router_aux_loss_coef = aux_coef;
  MOEFeedForward moe(MoEOptions::from(cfg));
  const double l2 = std::log(2.0), l4 = std::log(4.0);
  // Router probabilities (softmax of the logits): token 0 and 1 [.5 .25 .125 .125],
  // token 2 [.125 .125 .5 .25], token 3 [.25 .125 .125 .5].
  const torch::Tensor logits = torch::tensor({{l4, l2, 0.0, 0.0},
                                              {l4, l2, 0.0, 0.0},
                                              {0.0, 0.0, l4, l2},
                                              {l2, 0.0, 0.0, l4}});  // [token, expert]
  set(moe->gate->weight, logits.t().contiguous());
  for (int64_t e = 0; e < 4; ++e) {
    auto& expert = *moe->expert(e);
    set(expert.gate_proj->weight, torch::ones({1, 4}));
    set(expert.up_proj->weight, torch::ones({1, 4}));
    set(expert.down_proj->weight, torch::eye(4).narrow(1, e, 1));
  }
  return moe;
}

const double kProbs[4][4] = {
    {.5, .25, .125, .125}, {.5, .25, .125, .125}, {.125, .125, .5, .25}, {.25, .125, .125, .5}};
const int kTop2[4][2] = {{0, 1}, {0, 1}, {2, 3}, {3, 0}};

}  // namespace

TEST(MoE, FixedRouterDispatchWeightsCountsAndAuxLoss) {
  const torch::Tensor x = torch::eye(4).unsqueeze(0);  // [B=1, T=4, H=4]: token n = e_n
  for (bool renorm : {false, true}) {
    MOEFeedForward moe = fixed_router_moe(renorm, 0.01);
    const MoEOutput out = moe(x);
    for (int n = 0; n < 4; ++n) {
      const double p0 = kProbs[n][kTop2[n][0]], p1 = kProbs[n][kTop2[n][1]];
      for (int e = 0; e < 4; ++e) {
        double expected = 0;  // weight of expert e for token n, times silu(1)
        if (e == kTop2[n][0]) expected = (renorm ? p0 / (p0 + p1) : p0) * silu(1.0);
        if (e == kTop2[n][1]) expected = (renorm ? p1 / (p0 + p1) : p1) * silu(1.0);
        EXPECT_NEAR(out.y[0][n][e].item<double>(), expected, 1e-6)
            << "token " << n << " expert " << e << (renorm ? " (renormalised)" : "");
      }
    }
    // Experts 0..3 are picked by 3, 2, 1 and 2 (token, slot) pairs.
    EXPECT_TRUE(torch::equal(out.stats.counts, torch::tensor({3, 2, 1, 2}, torch::kLong)));
    // MiniMind's aux: E * coef * sum_e (c_e / N) * mean_n p_ne
    //   = 4 * 0.01 * (3 * 11/32 + 2 * 6/32 + 1 * 7/32 + 2 * 8/32) / 4 = 0.01 * 2.125.
    EXPECT_NEAR(out.aux_loss.item<double>(), 0.02125, 1e-8);
  }
  // In eval mode, or with coefficient 0, there is no aux loss; padding is left out of counts.
  MOEFeedForward moe = fixed_router_moe(false, 0.01);
  moe->eval();
  EXPECT_EQ(moe(x).aux_loss.item<double>(), 0.0);
  const MoEOutput no_coef = fixed_router_moe(false, 0.0)(x);
  EXPECT_EQ(no_coef.aux_loss.item<double>(), 0.0);
  const torch::Tensor real = torch::tensor({true, true, true, false});  // token 3 is padding
  EXPECT_TRUE(torch::equal(moe(x, real).stats.counts, torch::tensor({2, 2, 1, 1}, torch::kLong)));
}

// routing_margins against torch::topk's k-th minus (k+1)-th values, bitwise: random scores,
// scores with ties (rounded to a few levels, so that top-k's choice among equal values is
// its own), k from 1 to E - 1, 4 and 64 experts, the chosen columns as top-k gives them
// (unsorted, as the router asks); and a NaN (torch::topk's own answer).
TEST(MoE, RoutingMarginsEqualTorchTopks) {
  torch::manual_seed(13);
  for (const int64_t E : {int64_t{4}, int64_t{64}}) {
    const torch::Tensor random = torch::softmax(torch::randn({300, E}), -1);
    const torch::Tensor tied = (torch::rand({300, E}) * 4).round() / 4;  // many equal values
    for (const torch::Tensor& x : {random, tied})
      for (const int64_t k : {int64_t{1}, int64_t{2}, E / 4 + 1, E - 1}) {
        const torch::Tensor top = std::get<0>(torch::topk(x, k + 1, -1));  // [N, k+1]
        const torch::Tensor want = top.select(1, k - 1) - top.select(1, k);
        const torch::Tensor index = std::get<1>(torch::topk(x, k, -1, true, false));
        EXPECT_TRUE(torch::equal(routing_margins(x, index), want)) << "E " << E << " k " << k;
      }
    EXPECT_GT((tied.narrow(1, 0, 2) == tied.narrow(1, 2, 2)).sum().item<int64_t>(), 0);
  }
  torch::Tensor nan = torch::rand({5, 8});
  nan[2][3] = NAN;
  const torch::Tensor top = std::get<0>(torch::topk(nan, 4, -1));
  const torch::Tensor got = routing_margins(nan, std::get<1>(torch::topk(nan, 3, -1)));
  EXPECT_TRUE(torch::allclose(got, top.select(1, 2) - top.select(1, 3), 0, 0, /*equal_nan=*/true));
  // No margin without a score left over, nor from a chosen-column list of another type.
  const torch::Tensor x = torch::rand({5, 4});
  EXPECT_THROW(routing_margins(x, std::get<1>(torch::topk(x, 4, -1))), c10::Error);
  EXPECT_THROW(routing_margins(x, std::get<1>(torch::topk(x, 2, -1)).to(torch::kInt)), c10::Error);
  EXPECT_THROW(routing_margins(x, torch::zeros({5, 0}, torch::kLong)), c10::Error);
}

// A generated token (one row, eval) takes the direct path: its k experts in ascending order,
// no sort or scatter. It must give what the batched dispatch gives that token inside a batch.
TEST(MoE, SingleTokenPathEqualsTheBatchedDispatch) {
  torch::manual_seed(11);
  ModelConfig cfg;
  cfg.hidden_size = 16, cfg.use_moe = true, cfg.num_experts = 8, cfg.num_experts_per_tok = 3;
  cfg.moe_intermediate_size = 12;
  MOEFeedForward moe(MoEOptions::from(cfg));
  for (auto& p : moe->parameters()) p.data().normal_(0.0, 0.5);
  moe->eval();
  torch::NoGradGuard no_grad;
  const torch::Tensor x = torch::randn({1, 6, 16});  // [B, T, H]
  const MoEOutput batched = moe(x);
  for (int64_t t = 0; t < 6; ++t) {
    const MoEOutput one = moe->forward(x.narrow(1, t, 1), {}, {}, /*stats=*/false);
    EXPECT_TRUE(torch::allclose(one.y[0][0], batched.y[0][t], 1e-6, 1e-6)) << "token " << t;
    EXPECT_TRUE(torch::equal(one.stats.index, batched.stats.index.narrow(0, t, 1)));
    EXPECT_TRUE(
        torch::equal(one.stats.counts, torch::bincount(one.stats.index.reshape({-1}), {}, 8)));
    EXPECT_FALSE(one.stats.router_sums.defined());  // stats off: nothing computed for the logs
  }
}

// The routed experts as one node (routed_experts) against the plain form through autograd:
// gather the assigned rows, each expert's FeedForward on its slice, times the routing
// weights, index_add into the tokens. Outputs and every gradient within float rounding
// (the GEMMs write into column ranges of shared buffers, for which OpenBLAS may pick other
// kernels at these small sizes; the SwiGLU backward is one pass of its own); an idle
// expert's gradients zero, a token whose slots were all dropped gets zero. With OpenBLAS on
// 2 threads the experts run two at once. (The golden-loss test checks the bits.)
TEST(RoutedExperts, EqualTheGatherExpertsScatterFormThroughAutograd) {
  const test::PlanScope compute(Precision::fp32, MatmulBackend::openblas, 2);
  for (const auto dtype : {torch::kFloat32, torch::kFloat64}) {
    torch::manual_seed(12);
    const int64_t N = 12, H = 24, I = 40;
    const std::vector<int64_t> counts{5, 0, 9, 3};  // expert 1 idle
    // Each expert's tokens, ascending; token 11 has no rows (its slots dropped).
    const torch::Tensor token =
        torch::tensor({0, 2, 3, 5, 8, 0, 1, 2, 4, 5, 6, 7, 9, 10, 3, 6, 8}, torch::kLong);
    std::vector<FeedForward> a, b;
    for (size_t e = 0; e < counts.size(); ++e) {
      a.emplace_back(H, I), b.emplace_back(H, I);
      a.back()->to(dtype), b.back()->to(dtype);
      for (auto& p : a.back()->parameters()) p.data().normal_(0.0, 0.3);
      auto pa = a.back()->parameters(), pb = b.back()->parameters();
      for (size_t i = 0; i < pa.size(); ++i) pb[i].data().copy_(pa[i].data());
    }
    const auto opt = torch::TensorOptions().dtype(dtype);
    const torch::Tensor x0 = torch::randn({N, H}, opt), g = torch::randn({N, H}, opt);
    const torch::Tensor w0 = torch::rand({token.size(0)}, opt);
    torch::Tensor xa = x0.clone().requires_grad_(), xb = x0.clone().requires_grad_();
    torch::Tensor wa = w0.clone().requires_grad_(), wb = w0.clone().requires_grad_();
    const torch::Tensor xs = xa.index_select(0, token);
    std::vector<torch::Tensor> parts;
    for (size_t e = 0, off = 0; e < counts.size(); off += counts[e], ++e)
      if (counts[e] > 0) parts.push_back(a[e](xs.narrow(0, off, counts[e])));
    const torch::Tensor want =
        torch::zeros({N, H}, opt).index_add(0, token, torch::cat(parts) * wa.unsqueeze(1));
    const torch::Tensor got = routed_experts(xb, token, wb, counts, b,
                                             experts_node(compute.products()), compute.products());
    const double tol = dtype == torch::kFloat32 ? 1e-6 : 1e-12;
    EXPECT_TRUE(torch::allclose(got, want, tol, tol))
        << "max |difference| " << (got - want).abs().max().item<double>();
    EXPECT_TRUE(got[11].eq(0).all().item<bool>());
    want.backward(g);
    got.backward(g);
    EXPECT_TRUE(torch::allclose(xb.grad(), xa.grad(), tol, tol))
        << "max |difference| " << (xb.grad() - xa.grad()).abs().max().item<double>();
    EXPECT_TRUE(xb.grad()[11].eq(0).all().item<bool>());
    EXPECT_TRUE(torch::allclose(wb.grad(), wa.grad(), tol, tol))
        << "max |difference| " << (wb.grad() - wa.grad()).abs().max().item<double>();
    for (size_t e = 0; e < counts.size(); ++e) {
      auto pa = a[e]->parameters(), pb = b[e]->parameters();
      for (size_t i = 0; i < pa.size(); ++i) {
        if (counts[e] == 0) {
          EXPECT_TRUE(pb[i].grad().eq(0).all().item<bool>());
          continue;
        }
        EXPECT_TRUE(torch::allclose(pb[i].grad(), pa[i].grad(), tol, tol))
            << "expert " << e << " weight " << i;
      }
    }
  }
}

// The dense feed-forward's node (feed_forward_fused.cpp, taken by FeedForward in bf16 training and
// in fp32 training on oneDNN) against the unfused form in the same precision: the same
// products through project() and ATen's silu and mul between them. Both take the same
// operands; they differ in the SwiGLU's exp (a polynomial against ATen's, a few ulp), in the
// order of fp32 sums ([g | u] as one product; the input gradient as one sum over 2I), and so
// in bf16 possibly in a rare rounding of a or of the SwiGLU's gradient. Measured in bf16:
// output and weight gradients equal, the input gradient 1.3e-7 relative; allowed 1e-3 in bf16
// (against fp32's distance from bf16 here of 4.3e-3, checked, so that the test sees a bf16
// run) and 1e-5 in fp32. 100 rows (not a multiple of the node's 64-row blocks), I = 80 (not
// a multiple of the vector width), one and two threads, and in bf16 the bf16 GEMM's fallback.
class FusedFeedForward : public ::testing::TestWithParam<Precision> {};
TEST_P(FusedFeedForward, MatchesTheUnfusedForm) {
  const bool bf16 = GetParam() == Precision::bf16;
  const double tol = bf16 ? 1e-3 : 1e-5;
  for (const int run : {0, 1, 2}) {
    if (run == 2 && !bf16) continue;
    const int threads = run == 0 ? 1 : 2;
    force_bf16_gemm_fallback(run == 2);
    SCOPED_TRACE("threads " + std::to_string(threads) + (run == 2 ? ", fallback" : ""));
    const test::PlanScope compute(GetParam(), MatmulBackend::onednn, threads);
    torch::manual_seed(22);
    const int64_t N = 100, H = 48, I = 80;
    FeedForward ff(H, I, compute.products());
    for (auto& p : ff->parameters()) p.data().normal_(0.0, 0.3);
    const torch::Tensor x0 = torch::randn({2, N / 2, H}), g = torch::randn({2, N / 2, H});
    torch::Tensor xa = x0.clone().requires_grad_(), xb = x0.clone().requires_grad_();
    std::vector<torch::Tensor> plain;  // gate, down, up (registration order)
    for (const auto& p : ff->parameters()) plain.push_back(p.detach().clone().requires_grad_());
    const Products pr = compute.products();
    const torch::Tensor want =
        project(torch::silu(project(xa, plain[0], pr)) * project(xa, plain[2], pr), plain[1], pr);
    const torch::Tensor got = ff(xb);
    ASSERT_NE(got.grad_fn()->next_edges()[0].function->name().find("DenseSwiGLUFused"),
              std::string::npos);
    auto rel = [](const torch::Tensor& a, const torch::Tensor& b) {
      return (a - b).norm().item<double>() / b.norm().item<double>();
    };
    EXPECT_LE(rel(got, want), tol);
    want.backward(g);
    got.backward(g);
    EXPECT_LE(rel(xb.grad(), xa.grad()), tol);
    const auto params = ff->parameters();
    for (size_t i = 0; i < params.size(); ++i)
      EXPECT_LE(rel(params[i].grad(), plain[i].grad()), tol) << "weight " << i;
    if (!bf16) continue;
    // fp32's output is farther away: the node ran in bf16.
    const Products fp32{Precision::fp32, MatmulBackend::onednn};
    torch::NoGradGuard no_grad;
    const torch::Tensor in_fp32 = project(
        torch::silu(project(x0, plain[0], fp32)) * project(x0, plain[2], fp32), plain[1], fp32);
    EXPECT_GT(rel(in_fp32, got.detach()), 2e-3);
  }
  force_bf16_gemm_fallback(false);
}
INSTANTIATE_TEST_SUITE_P(Precisions, FusedFeedForward,
                         ::testing::Values(Precision::bf16, Precision::fp32));

// The fused node (routed_experts_fused.cpp; bf16, and fp32 training on oneDNN) against the
// plain form written in fp32 with every product's inputs as the node takes them: in bf16
// rounded (autograd through the casts rounds the gradients reaching them too), outputs within
// 2e-3 and gradients within 3e-2 of the plain form, relative to its norm (a few bf16
// roundings of 2^-8 each; a wrong layout or a missing product is off by far more); in fp32
// within 1e-5 (other orders of fp32 sums; the routing weight's gradient as (ga . a) / w). A
// row with routing weight 0 takes the direct sum gy . ys for its weight's gradient, which
// sees no rounding the plain form lacks: within 1e-4 relative. Serial (one OpenBLAS thread)
// and side by side (two), and in bf16 on the bf16 GEMM's fallback.
class FusedRoutedExperts : public ::testing::TestWithParam<Precision> {};
TEST_P(FusedRoutedExperts, MatchThePlainFormOnTheSameOperands) {
  const bool bf16 = GetParam() == Precision::bf16;
  const double out_tol = bf16 ? 2e-3 : 1e-5, grad_tol = bf16 ? 3e-2 : 1e-5;
  for (const int run : {0, 1, 2}) {
    if (run == 2 && !bf16) continue;
    const int threads = run == 0 ? 1 : 2;
    force_bf16_gemm_fallback(run == 2);
    SCOPED_TRACE("OpenBLAS threads " + std::to_string(threads) + (run == 2 ? ", fallback" : ""));
    const test::PlanScope compute(GetParam(), MatmulBackend::onednn, threads);
    torch::manual_seed(21);
    const int64_t N = 12, H = 32, I = 40;
    const std::vector<int64_t> counts{5, 0, 9, 3};  // expert 1 idle
    const torch::Tensor token =
        torch::tensor({0, 2, 3, 5, 8, 0, 1, 2, 4, 5, 6, 7, 9, 10, 3, 6, 8}, torch::kLong);
    std::vector<FeedForward> experts;
    for (size_t e = 0; e < counts.size(); ++e) {
      experts.emplace_back(H, I);
      for (auto& p : experts.back()->parameters()) p.data().normal_(0.0, 0.3);
    }
    auto rounded = [bf16](const torch::Tensor& t) {
      return bf16 ? t.to(torch::kBFloat16).to(torch::kFloat32) : t;
    };
    const torch::Tensor x0 = torch::randn({N, H}), g = torch::randn({N, H});
    torch::Tensor w0 = torch::rand({token.size(0)}) + 0.1;
    w0[6] = 0;  // the direct path for this row's weight gradient
    torch::Tensor xa = x0.clone().requires_grad_(), xb = x0.clone().requires_grad_();
    torch::Tensor wa = w0.clone().requires_grad_(), wb = w0.clone().requires_grad_();
    // The plain form, on copies of the weights.
    std::vector<std::vector<torch::Tensor>> plain(counts.size());
    const torch::Tensor xs = rounded(xa).index_select(0, token);
    std::vector<torch::Tensor> parts;
    for (size_t e = 0, off = 0; e < counts.size(); off += counts[e], ++e) {
      for (const auto& p : experts[e]->parameters())
        plain[e].push_back(p.detach().clone().requires_grad_());
      if (counts[e] == 0) continue;
      const torch::Tensor xe = xs.narrow(0, off, counts[e]);
      const torch::Tensor gate = torch::matmul(xe, rounded(plain[e][0]).t());
      const torch::Tensor up = torch::matmul(xe, rounded(plain[e][2]).t());
      const torch::Tensor a = rounded(torch::silu(gate) * up);
      parts.push_back(torch::matmul(a, rounded(plain[e][1]).t()));
    }
    const torch::Tensor want =
        torch::zeros({N, H}).index_add(0, token, torch::cat(parts) * wa.unsqueeze(1));
    const torch::Tensor got = routed_experts(xb, token, wb, counts, experts,
                                             experts_node(compute.products()), compute.products());
    ASSERT_NE(got.grad_fn()->name().find("RoutedSwiGLUFused"), std::string::npos)
        << got.grad_fn()->name();
    auto rel = [](const torch::Tensor& a, const torch::Tensor& b) {
      return (a - b).norm().item<double>() / b.norm().item<double>();
    };
    EXPECT_LE(rel(got, want), out_tol);
    EXPECT_TRUE(got[11].eq(0).all().item<bool>());  // a token without rows
    want.backward(g);
    got.backward(g);
    EXPECT_LE(rel(xb.grad(), xa.grad()), grad_tol);
    EXPECT_LE(rel(wb.grad(), wa.grad()), grad_tol);
    EXPECT_NEAR(wb.grad()[6].item<double>(), wa.grad()[6].item<double>(),
                1e-4 * std::abs(wa.grad()[6].item<double>()));
    for (size_t e = 0; e < counts.size(); ++e) {
      const auto params = experts[e]->parameters();  // gate, down, up (registration order)
      for (size_t i = 0; i < params.size(); ++i) {
        if (counts[e] == 0) {
          EXPECT_TRUE(params[i].grad().eq(0).all().item<bool>()) << "idle expert " << e;
          continue;
        }
        EXPECT_LE(rel(params[i].grad(), plain[e][i].grad()), grad_tol)
            << "expert " << e << " weight " << i;
      }
    }
  }
  force_bf16_gemm_fallback(false);
}
INSTANTIATE_TEST_SUITE_P(Precisions, FusedRoutedExperts,
                         ::testing::Values(Precision::bf16, Precision::fp32));
