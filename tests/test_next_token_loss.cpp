// The next-token loss alone: the shifted cross-entropy bit for bit, the head-and-loss node
// against its formula, and the own training loops against ATen's.
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

// The loss without shifting the logits (next_token_loss) against the sliced cross_entropy it
// replaces, on the same inputs: the same loss and the same gradient, bit for bit (both
// follow log_softmax's and nll_loss's formulas), with ignored labels inside the rows, for
// a vocabulary the vector kernels cover whole (6,400) and one with a tail (37).
TEST(NextTokenLoss, EqualsCrossEntropyOfTheShiftedLogitsBitForBit) {
  for (const int64_t V : {6400, 37}) {
    torch::manual_seed(5);
    // V = 6400: 600 rows, so the log-softmax runs in two row blocks (side by side).
    const int64_t B = 3, T = V == 6400 ? 200 : 9;
    const torch::Tensor base = 4 * torch::randn({B, T, V});             // [B, T, V]
    torch::Tensor labels = torch::randint(0, V, {B, T}, torch::kLong);  // [B, T]
    labels[1][4] = -100, labels[2][T - 1] = -100, labels[0][0] = -100;  // [0][0] is never read
    for (const bool mean : {true, false}) {
      SCOPED_TRACE("V " + std::to_string(V) + (mean ? " mean" : " sum"));
      const torch::Tensor a = base.clone().requires_grad_(), b = base.clone().requires_grad_();
      auto options = torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100);
      if (!mean) options.reduction(torch::kSum);
      const torch::Tensor want =
          torch::nn::functional::cross_entropy(a.narrow(1, 0, T - 1).reshape({-1, V}),
                                               labels.narrow(1, 1, T - 1).reshape({-1}), options);
      const torch::Tensor got = next_token_loss(b, labels, mean);
      EXPECT_EQ(got.item<float>(), want.item<float>());
      (want * 1.7).backward();  // a non-unit upstream gradient
      (got * 1.7).backward();
      EXPECT_TRUE(torch::equal(a.grad(), b.grad()))
          << "max |difference| " << (a.grad() - b.grad()).abs().max().item<float>();
      EXPECT_TRUE(b.grad().select(1, T - 1).eq(0).all().item<bool>());  // predicts nothing
      EXPECT_TRUE(b.grad()[1][3].eq(0).all().item<bool>());             // its label is ignored
    }
  }
}

// Training's head and loss as one node (head_next_token_loss) in bf16 and in fp32 on oneDNN,
// with ignored labels, a row count that is not a multiple of the node's 32-row blocks, and
// both OpenBLAS thread counts (blocks side by side or one after another):
// - the loss is bit for bit that of the head's product (project) followed by next_token_loss;
// - the gradients are its formula, formed here in float64: with l the product's fp32 logits
//   and u = onehot - softmax(l) on the counted rows (0 elsewhere, rounded to bf16 in bf16),
//   d/dh = c u @ w and d/dw = c u^T @ h (h and w rounded in bf16), c = -upstream / count
//   (mean) or -upstream (sum). Within 2e-5 of the largest element (1.4e-6 measured in bf16):
//   the node's softmax is within a few ulp of ATen's, which moves a few of u's 1.3 M
//   roundings by one bf16 step, and its sums are fp32; a gradient missing the upstream
//   factor or the count, or with the label's 1 in the wrong place, is off by more than 10 %.
// - with every label ignored, the gradients are zero.
class HeadAndLossNode : public ::testing::TestWithParam<Precision> {};
TEST_P(HeadAndLossNode, MatchesItsFormula) {
  const bool bf16 = GetParam() == Precision::bf16;
  // The operands as the node's products take them.
  auto operand = [bf16](const torch::Tensor& t) {
    return (bf16 ? t.to(torch::kBFloat16) : t).to(torch::kDouble);
  };
  for (const int threads : {1, 2}) {
    const test::PlanScope compute(GetParam(), MatmulBackend::onednn, threads);
    torch::manual_seed(6);
    const int64_t B = 3, T = 70, H = 48, V = 6400;  // 210 rows
    const torch::Tensor h0 = torch::randn({B, T, H}), w0 = 0.2 * torch::randn({V, H});
    torch::Tensor labels = torch::randint(0, V, {B, T}, torch::kLong);  // [B, T]
    labels[1][4] = -100, labels[2][T - 1] = -100;
    const torch::Tensor targets = labels.narrow(1, 1, T - 1);  // [B, T-1]
    const torch::Tensor counted = targets.ne(-100);
    const torch::Tensor hb = operand(h0).reshape({-1, H}), wb = operand(w0);
    // u [B*T, V]: the last position and the ignored label's row stay 0.
    const Products pr = compute.products();
    const torch::Tensor logits = project(h0, w0, pr).detach();  // [B, T, V] the node's product
    torch::Tensor u = torch::zeros({B, T, V});
    u.narrow(1, 0, T - 1)
        .copy_(-torch::softmax(logits.narrow(1, 0, T - 1), -1))
        .scatter_add_(2, targets.clamp_min(0).unsqueeze(-1), torch::ones({B, T - 1, 1}))
        .mul_(counted.unsqueeze(-1));
    u = operand(u).reshape({-1, V});
    for (const bool mean : {true, false}) {
      SCOPED_TRACE("threads " + std::to_string(threads) + (mean ? " mean" : " sum"));
      torch::Tensor ha = h0.clone().requires_grad_(), wa = w0.clone().requires_grad_();
      torch::Tensor hn = h0.clone().requires_grad_(), wn = w0.clone().requires_grad_();
      const torch::Tensor want =
          next_token_loss(project(ha, wa, pr), labels, mean, training_node(pr));
      const torch::Tensor got = head_next_token_loss(hn, wn, labels, pr, mean);
      EXPECT_EQ(got.item<float>(), want.item<float>());
      (got * 1.7).backward();
      const double c = -1.7 / (mean ? counted.sum().item<double>() : 1.0);
      const torch::Tensor gh = c * u.mm(wb), gw = c * u.t().mm(hb);
      const double gh_diff =
          (hn.grad().reshape({-1, H}).to(torch::kDouble) - gh).abs().max().item<double>();
      const double gw_diff = (wn.grad().to(torch::kDouble) - gw).abs().max().item<double>();
      EXPECT_LE(gh_diff, 2e-5 * gh.abs().max().item<double>());
      EXPECT_LE(gw_diff, 2e-5 * gw.abs().max().item<double>());
      // Every label ignored: the mean is 0 / 0 as ATen's, the gradients zero as the unfused
      // form's (not the NaN of 0 * (upstream / 0)).
      torch::Tensor hz = h0.clone().requires_grad_(), wz = w0.clone().requires_grad_();
      const torch::Tensor none = torch::full({B, T}, -100, torch::kLong);
      const torch::Tensor lz = head_next_token_loss(hz, wz, none, pr, mean);
      EXPECT_EQ(std::isnan(lz.item<float>()), mean);
      lz.backward();
      EXPECT_TRUE(hz.grad().eq(0).all().item<bool>());
      EXPECT_TRUE(wz.grad().eq(0).all().item<bool>());
      // Not vacuous: the node ran; bf16's products are not fp32's; in fp32 the loss is
      // within a few ulp of ATen's on OpenBLAS (PyTorch's numbers).
      EXPECT_NE(got.grad_fn()->name().find("HeadNextTokenLossFused"), std::string::npos);
      const test::PlanScope other(Precision::fp32,
                                  bf16 ? MatmulBackend::onednn : MatmulBackend::openblas, threads);
      const float plain =
          next_token_loss(project(h0, w0, other.products()), labels, mean).item<float>();
      if (bf16) {
        EXPECT_GT(std::abs(plain - got.item<float>()), 0.0f);
      } else {
        EXPECT_LE(std::abs(plain - got.item<float>()), 1e-5 * std::abs(plain));
      }
    }
  }
}
INSTANTIATE_TEST_SUITE_P(Precisions, HeadAndLossNode,
                         ::testing::Values(Precision::bf16, Precision::fp32));

// Training outside ATen (here bf16) runs the loss's loops of its own (an AVX-512 e^x) where
// fp32 on OpenBLAS, evaluation and generation run ATen's log-softmax and its backward: the
// same loss and logits' gradient
// within 1e-5 relative (e^x to about 2 ulp against Sleef's 1; the log-probabilities of
// 3-sigma logits are off by a few ulp of their magnitude), on a row length that is a
// multiple of the 16 lanes and one that is not, with ignored labels and mean or sum.
TEST(NextTokenLoss, OwnTrainingLoopsMatchAtenWithinTolerance) {
  for (const int64_t V : {6400, 1001}) {
    for (const bool mean : {true, false}) {
      SCOPED_TRACE("V " + std::to_string(V) + (mean ? " mean" : " sum"));
      torch::manual_seed(8);
      const int64_t B = 2, T = 37;
      const torch::Tensor logits0 = 3 * torch::randn({B, T, V});
      torch::Tensor labels = torch::randint(0, V, {B, T}, torch::kLong);  // [B, T]
      labels[0][5] = -100, labels[1][T - 2] = -100;
      torch::Tensor a = logits0.clone().requires_grad_(), b = logits0.clone().requires_grad_();
      torch::Tensor want, got;
      {
        const test::PlanScope fp32(Precision::fp32, MatmulBackend::openblas, 2);
        want = next_token_loss(a, labels, mean);  // ATen's
      }
      {
        const test::PlanScope bf16(Precision::bf16, MatmulBackend::onednn, 2);
        got = next_token_loss(b, labels, mean, training_node(bf16.products()));  // the own loops
      }
      EXPECT_NEAR(got.item<float>(), want.item<float>(), 1e-5 * std::abs(want.item<float>()));
      (want * 1.7).backward();
      (got * 1.7).backward();
      EXPECT_TRUE(torch::allclose(b.grad(), a.grad(), /*rtol=*/1e-5, /*atol=*/1e-30))
          << "max |difference| " << (a.grad() - b.grad()).abs().max().item<float>() << " of "
          << a.grad().abs().max().item<float>();
      EXPECT_FALSE(torch::equal(a.grad(), b.grad())) << "the own loops did not run";
      EXPECT_TRUE(b.grad().select(1, T - 1).eq(0).all().item<bool>());  // predicts nothing
      EXPECT_TRUE(b.grad()[0][4].eq(0).all().item<bool>());             // its label is ignored
    }
  }
}
