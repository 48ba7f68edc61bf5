// Each module of the model alone, with hand-set weights and answers worked out by hand, so a
// parity failure of the whole model can be traced to a module; here RMSNorm (the formula,
// its fused nodes) and rotary embeddings (rotate-half, the position offset of the KV cache).
// Attention, the MoE layer and the loss have their own files (test_attention.cpp,
// test_moe_layer.cpp, test_next_token_loss.cpp).
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

TEST(RMSNorm, ScalesByTheRootMeanSquareInFloat32) {
  RMSNorm norm(2, /*eps=*/0.0);
  set(norm->weight, torch::tensor({1.0, 2.0}));
  // x = [3, 4]: mean of squares 12.5, so x / sqrt(12.5) = [0.8485..., 1.1313...], times w.
  torch::Tensor y = norm(torch::tensor({{3.0f, 4.0f}}));
  EXPECT_NEAR(y[0][0].item<double>(), 3 / std::sqrt(12.5), 1e-6);
  EXPECT_NEAR(y[0][1].item<double>(), 2 * 4 / std::sqrt(12.5), 1e-6);
  // eps keeps a zero row at zero instead of NaN.
  RMSNorm with_eps(2, 1e-6);
  EXPECT_TRUE(torch::equal(with_eps(torch::zeros({1, 2})), torch::zeros({1, 2})));
  // A half-precision input is normalised in float32 and returned in its own type.
  torch::Tensor h = norm(torch::tensor({{3.0f, 4.0f}}).to(torch::kHalf));
  EXPECT_EQ(h.scalar_type(), torch::kHalf);
  EXPECT_NEAR(h[0][1].item<double>(), 8 / std::sqrt(12.5), 2e-3);
}

// The fused node against autograd through the plain formula: the same outputs bit for bit
// (its forward is those ATen ops), gradients of x and w within float rounding; float64
// to 1e-12. Widths of the model's norms (hidden 256, head 32) and one with a tail (37).
TEST(RMSNorm, FusedBackwardEqualsAutogradOfTheFormula) {
  torch::manual_seed(8);
  for (const auto type : {torch::kFloat32, torch::kFloat64}) {
    for (const int64_t H : {256, 32, 37}) {
      SCOPED_TRACE("H " + std::to_string(H) + (type == torch::kDouble ? " float64" : ""));
      const torch::Tensor x0 = 3 * torch::randn({4, 50, H}, type);
      const torch::Tensor w0 = 1 + 0.1 * torch::randn({H}, type);
      const torch::Tensor g = torch::randn({4, 50, H}, type);
      torch::Tensor xa = x0.clone().requires_grad_(), wa = w0.clone().requires_grad_();
      torch::Tensor xb = x0.clone().requires_grad_(), wb = w0.clone().requires_grad_();
      const torch::Tensor want = wa * (xa * torch::rsqrt(xa.pow(2).mean(-1, true) + 1e-5));
      const torch::Tensor got = rms_norm(xb, wb, 1e-5);
      EXPECT_TRUE(torch::equal(got, want));
      want.backward(g);
      got.backward(g);
      const double tol = type == torch::kDouble ? 1e-12 : 2e-6;
      EXPECT_TRUE(torch::allclose(xb.grad(), xa.grad(), tol, tol))
          << "max |difference| " << (xb.grad() - xa.grad()).abs().max().item<double>();
      EXPECT_TRUE(torch::allclose(wb.grad(), wa.grad(), tol, 10 * tol))
          << "max |difference| " << (wb.grad() - wa.grad()).abs().max().item<double>();
    }
  }
}

// bf16 training's one-pass forward against the formula's ATen ops: the output within float
// rounding (its sum of squares adds in another order); the gradients are the same backward's.
// With rounded_copy, to_bf16 of the output (or of a contiguous reshape, as the products take
// it) is the output rounded element by element, also after the copy was handed over; once
// the output changes in place, to_bf16 rounds the new numbers.
TEST(RMSNorm, Bf16TrainingForwardMatchesTheFormulaAndHandsOverItsRoundedCopy) {
  const test::PlanScope bf16(Precision::bf16, MatmulBackend::onednn, 2);
  torch::manual_seed(9);
  for (const int64_t H : {256, 32, 37}) {
    SCOPED_TRACE("H " + std::to_string(H));
    const torch::Tensor x0 = 3 * torch::randn({4, 50, H}), w0 = 1 + 0.1 * torch::randn({H});
    torch::Tensor xa = x0.clone().requires_grad_(), wa = w0.clone().requires_grad_();
    torch::Tensor xb = x0.clone().requires_grad_(), wb = w0.clone().requires_grad_();
    const torch::Tensor want = wa * (xa * torch::rsqrt(xa.pow(2).mean(-1, true) + 1e-5));
    torch::Tensor got = rms_norm(xb, wb, 1e-5, norm_node(bf16.products(), /*rounded_copy=*/true));
    EXPECT_TRUE(torch::allclose(got, want, 1e-6, 1e-6))
        << "max |difference| " << (got - want).abs().max().item<float>();
    EXPECT_FALSE(torch::equal(got, want)) << "the one-pass forward did not run";
    const torch::Tensor rounded = got.detach().to(torch::kBFloat16);
    EXPECT_TRUE(torch::equal(to_bf16(got.reshape({-1, H})), rounded.reshape({-1, H})));
    EXPECT_TRUE(torch::equal(to_bf16(got), rounded));
    const torch::Tensor g = torch::randn({4, 50, H});
    want.backward(g);
    got.backward(g);
    EXPECT_TRUE(torch::allclose(xb.grad(), xa.grad(), 1e-5, 1e-5))
        << "max |difference| " << (xb.grad() - xa.grad()).abs().max().item<float>();
    EXPECT_TRUE(torch::allclose(wb.grad(), wa.grad(), 1e-5, 1e-4))
        << "max |difference| " << (wb.grad() - wa.grad()).abs().max().item<float>();
    {
      const torch::NoGradGuard no_grad;
      got.mul_(2);  // a new version: the handed-over copy no longer holds
    }
    EXPECT_TRUE(torch::equal(to_bf16(got), got.detach().to(torch::kBFloat16)));
  }
}

// fp32 training on oneDNN takes the same one-pass forward (float rounding of the formula,
// as bf16's); fp32 on OpenBLAS keeps the formula's ATen ops, PyTorch's numbers bit for bit.
TEST(RMSNorm, Fp32OnOneDnnTakesTheOnePassForwardAndOpenBlasTheFormula) {
  torch::manual_seed(11);
  for (const auto backend : {MatmulBackend::onednn, MatmulBackend::openblas}) {
    const test::PlanScope plan(Precision::fp32, backend, 2);
    for (const int64_t H : {256, 32, 37}) {
      SCOPED_TRACE("H " + std::to_string(H) +
                   (backend == MatmulBackend::onednn ? " onednn" : " openblas"));
      const torch::Tensor x0 = 3 * torch::randn({4, 50, H}), w0 = 1 + 0.1 * torch::randn({H});
      const torch::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
      const torch::Tensor want = w0 * (x0 * torch::rsqrt(x0.pow(2).mean(-1, true) + 1e-5));
      const NormNode node = norm_node(plan.products(), /*rounded_copy=*/true);
      const torch::Tensor got = rms_norm(x, w, 1e-5, node);
      EXPECT_NE(got.grad_fn()->name().find("RMSNormFused"), std::string::npos);
      if (backend == MatmulBackend::openblas) {
        EXPECT_TRUE(torch::equal(got, want));
        continue;
      }
      EXPECT_TRUE(torch::allclose(got, want, 1e-6, 1e-6))
          << "max |difference| " << (got - want).abs().max().item<float>();
      EXPECT_FALSE(torch::equal(got, want)) << "the one-pass forward did not run";
      const AddNormed two = add_rms_norm(x0.clone().requires_grad_(), torch::zeros_like(x0), w,
                                         1e-5, node, /*grad_copy=*/true);
      EXPECT_TRUE(torch::allclose(two.normed, want, 1e-6, 1e-6));
      EXPECT_FALSE(torch::equal(two.normed, want)) << "the one-pass forward did not run";
    }
  }
}

// The residual add folded into the norm's node against the two apart (s = a + b, then
// rms_norm(s)), in float32, float64 and bf16 training's one-pass forward: the sum, the norm
// and all three gradients bit for bit, when both outputs flow on and when only one does.
TEST(RMSNorm, AddAndNormInOneNodeEqualsTheAddThenTheNorm) {
  torch::manual_seed(10);
  for (const bool bf16 : {false, true}) {
    const test::PlanScope plan(bf16 ? Precision::bf16 : Precision::fp32, MatmulBackend::onednn, 2);
    for (const auto type : {torch::kFloat32, torch::kFloat64}) {
      if (bf16 && type == torch::kFloat64) continue;  // bf16 training is float32 only
      for (const int64_t H : {256, 37}) {
        for (const int uses : {0, 1, 2}) {  // 0: both outputs, 1: the norm only, 2: the sum only
          SCOPED_TRACE("H " + std::to_string(H) + (bf16 ? " bf16" : "") +
                       (type == torch::kDouble ? " float64" : "") + " uses " +
                       std::to_string(uses));
          const torch::Tensor a0 = 2 * torch::randn({3, 70, H}, type),
                              b0 = torch::randn({3, 70, H}, type),
                              w0 = 1 + 0.1 * torch::randn({H}, type);
          const torch::Tensor gs = torch::randn({3, 70, H}, type),
                              gy = torch::randn({3, 70, H}, type);
          auto leaf = [](const torch::Tensor& t) { return t.clone().requires_grad_(); };
          torch::Tensor a1 = leaf(a0), b1 = leaf(b0), w1 = leaf(w0);
          torch::Tensor a2 = leaf(a0), b2 = leaf(b0), w2 = leaf(w0);
          const NormNode node = norm_node(plan.products(), /*rounded_copy=*/bf16);
          const torch::Tensor s1 = a1 + b1, y1 = rms_norm(s1, w1, 1e-5, node);
          const AddNormed two = add_rms_norm(a2, b2, w2, 1e-5, node, /*grad_copy=*/bf16);
          EXPECT_TRUE(torch::equal(two.sum, s1));
          EXPECT_TRUE(torch::equal(two.normed, y1));
          EXPECT_NE(two.sum.grad_fn()->name().find("AddRMSNormFused"), std::string::npos);
          auto run = [&](const torch::Tensor& s, const torch::Tensor& y) {
            if (uses == 0) torch::autograd::backward({s, y}, {gs, gy});
            if (uses == 1) y.backward(gy);
            if (uses == 2) s.backward(gs);
          };
          run(s1, y1);
          run(two.sum, two.normed);
          EXPECT_TRUE(torch::equal(a2.grad(), a1.grad()));
          EXPECT_TRUE(torch::equal(b2.grad(), b1.grad()));
          if (uses == 2) {
            EXPECT_FALSE(w2.grad().defined());
          } else {
            EXPECT_TRUE(torch::equal(w2.grad(), w1.grad()));
          }
          if (bf16) {  // to_bf16 of a gradient: it rounded, whether or not its copy was handed over
            EXPECT_TRUE(torch::equal(to_bf16(b2.grad()), b2.grad().to(torch::kBFloat16)));
          }
        }
      }
    }
  }
}

TEST(Rope, RotatesDimensionPairsHalfAWidthApartByPositionTimesFrequency) {
  // head_dim 4, theta 100: frequencies 1 and 100^(-2/4) = 0.1. Rotate-half pairs dimension
  // i with i + 2: (x0, x2) turns by p radians, (x1, x3) by 0.1 p.
  const RotaryTables t = make_rotary_tables(4, 8, 100.0);
  torch::manual_seed(0);
  torch::Tensor x = torch::randn({1, 8, 1, 4});  // [B, T, heads, d]
  torch::Tensor y = apply_rotary(x, t.cos, t.sin);
  for (int64_t p = 0; p < 8; ++p) {
    const double a = x[0][p][0][0].item<double>(), b = x[0][p][0][1].item<double>();
    const double c = x[0][p][0][2].item<double>(), d = x[0][p][0][3].item<double>();
    const double f0 = p * 1.0, f1 = p * 0.1;
    EXPECT_NEAR(y[0][p][0][0].item<double>(), a * std::cos(f0) - c * std::sin(f0), 1e-5) << p;
    EXPECT_NEAR(y[0][p][0][2].item<double>(), c * std::cos(f0) + a * std::sin(f0), 1e-5) << p;
    EXPECT_NEAR(y[0][p][0][1].item<double>(), b * std::cos(f1) - d * std::sin(f1), 1e-5) << p;
    EXPECT_NEAR(y[0][p][0][3].item<double>(), d * std::cos(f1) + b * std::sin(f1), 1e-5) << p;
  }
  // The KV cache feeds later tokens with the table rows of their absolute positions: the
  // rows from an offset rotate exactly like the same positions of the whole sequence.
  torch::Tensor tail =
      apply_rotary(x.narrow(1, 5, 3), t.cos.narrow(0, 5, 3), t.sin.narrow(0, 5, 3));
  EXPECT_TRUE(torch::equal(tail, y.narrow(1, 5, 3)));
}

// apply_rotary computes the rotation half by half, with a backward of its own; it must give
// the numbers of the plain rotate-half form (MiniMind's) and of autograd through it, bitwise.
TEST(Rope, EqualsTheRotateHalfFormAndItsAutogradBitForBit) {
  const RotaryTables t = make_rotary_tables(32, 64, 1e6);
  torch::manual_seed(3);
  const torch::Tensor base = torch::randn({2, 16, 4, 32});  // [B, T, heads, d]
  const torch::Tensor cos = t.cos.narrow(0, 7, 16), sin = t.sin.narrow(0, 7, 16);
  const torch::Tensor a = base.clone().requires_grad_(), b = base.clone().requires_grad_();
  const torch::Tensor rotated = torch::cat({-a.narrow(-1, 16, 16), a.narrow(-1, 0, 16)}, -1);
  const torch::Tensor want = a * cos.unsqueeze(1) + rotated * sin.unsqueeze(1);
  const torch::Tensor got = apply_rotary(b, cos, sin);
  EXPECT_TRUE(torch::equal(got, want));
  const torch::Tensor g = torch::randn_like(base);
  want.backward(g);
  got.backward(g);
  EXPECT_TRUE(torch::equal(b.grad(), a.grad()))
      << "max |difference| " << (b.grad() - a.grad()).abs().max().item<float>();
  // The backward is the rotation's transpose: rotating back by the same angles.
  EXPECT_TRUE(torch::allclose(b.grad(), apply_rotary(g, cos, -sin), 0, 0));
}
