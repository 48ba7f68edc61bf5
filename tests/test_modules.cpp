// Each module of the model alone, with hand-set weights and answers worked out by hand, so a
// parity failure of the whole model can be traced to a module: RMSNorm, rotary embeddings
// (rotate-half, the position offset of the KV cache), attention (GQA head mapping, causal
// mask) and the MoE layer with a fixed router (dispatch, weights, counts, aux loss).
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
#include "support/test_support.h"

using namespace minimind;

namespace {

// Copies hand-written values into a parameter.
void set(torch::Tensor& param, const torch::Tensor& value) {
  torch::NoGradGuard no_grad;
  param.copy_(value.to(param.scalar_type()).view_as(param));
}

double silu(double x) {
  return x / (1 + std::exp(-x));
}

}  // namespace

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
  const ComputeScope bf16(test::test_plan(Precision::bf16, MatmulBackend::onednn, 2));
  torch::manual_seed(9);
  for (const int64_t H : {256, 32, 37}) {
    SCOPED_TRACE("H " + std::to_string(H));
    const torch::Tensor x0 = 3 * torch::randn({4, 50, H}), w0 = 1 + 0.1 * torch::randn({H});
    torch::Tensor xa = x0.clone().requires_grad_(), wa = w0.clone().requires_grad_();
    torch::Tensor xb = x0.clone().requires_grad_(), wb = w0.clone().requires_grad_();
    const torch::Tensor want = wa * (xa * torch::rsqrt(xa.pow(2).mean(-1, true) + 1e-5));
    torch::Tensor got = rms_norm(xb, wb, 1e-5, /*rounded_copy=*/true);
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
    const ComputeScope plan(test::test_plan(Precision::fp32, backend, 2));
    for (const int64_t H : {256, 32, 37}) {
      SCOPED_TRACE("H " + std::to_string(H) +
                   (backend == MatmulBackend::onednn ? " onednn" : " openblas"));
      const torch::Tensor x0 = 3 * torch::randn({4, 50, H}), w0 = 1 + 0.1 * torch::randn({H});
      const torch::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
      const torch::Tensor want = w0 * (x0 * torch::rsqrt(x0.pow(2).mean(-1, true) + 1e-5));
      const torch::Tensor got = rms_norm(x, w, 1e-5, /*rounded_copy=*/true);
      EXPECT_NE(got.grad_fn()->name().find("FusedRMSNorm"), std::string::npos);
      if (backend == MatmulBackend::openblas) {
        EXPECT_TRUE(torch::equal(got, want));
        continue;
      }
      EXPECT_TRUE(torch::allclose(got, want, 1e-6, 1e-6))
          << "max |difference| " << (got - want).abs().max().item<float>();
      EXPECT_FALSE(torch::equal(got, want)) << "the one-pass forward did not run";
      const AddNormed two = add_rms_norm(x0.clone().requires_grad_(), torch::zeros_like(x0), w,
                                         1e-5, /*rounded_copy=*/true, /*grad_copy=*/true);
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
    const ComputeScope plan(
        test::test_plan(bf16 ? Precision::bf16 : Precision::fp32, MatmulBackend::onednn, 2));
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
          const torch::Tensor s1 = a1 + b1, y1 = rms_norm(s1, w1, 1e-5, bf16);
          const AddNormed two = add_rms_norm(a2, b2, w2, 1e-5, bf16, /*grad_copy=*/bf16);
          EXPECT_TRUE(torch::equal(two.sum, s1));
          EXPECT_TRUE(torch::equal(two.normed, y1));
          EXPECT_NE(two.sum.grad_fn()->name().find("FusedAddRMSNorm"), std::string::npos);
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

// Attention in query blocks (the future keys of a block never scored) against the whole
// masked square (block >= T, MiniMind's form): the same outputs and gradients within float
// rounding (each softmax row sums fewer zeros), for a T that is not a multiple of the block.
TEST(Attention, QueryBlocksEqualTheWholeMaskedSquare) {
  torch::manual_seed(9);
  const int64_t B = 2, T = 150, heads = 4, kv = 2, d = 16;
  const torch::Tensor q0 = torch::randn({B, T, heads, d}), k0 = torch::randn({B, T, kv, d});
  const torch::Tensor v0 = torch::randn({B, T, kv, d}), g = torch::randn({B, T, heads * d});
  std::vector<torch::Tensor> out, grads;
  for (const int64_t block : {T, int64_t{64}, int64_t{1}}) {
    torch::Tensor q = q0.clone().requires_grad_(), k = k0.clone().requires_grad_();
    torch::Tensor v = v0.clone().requires_grad_();
    out.push_back(causal_attention(q, k, v, block, 0.0, true));
    out.back().backward(g);
    grads.push_back(torch::cat({q.grad().reshape(-1), k.grad().reshape(-1), v.grad().reshape(-1)}));
  }
  for (size_t i = 1; i < out.size(); ++i) {
    EXPECT_TRUE(torch::allclose(out[i], out[0], 1e-5, 1e-6))
        << "max |difference| " << (out[i] - out[0]).abs().max().item<float>();
    EXPECT_TRUE(torch::allclose(grads[i], grads[0], 1e-5, 1e-6))
        << "max |difference| " << (grads[i] - grads[0]).abs().max().item<float>();
  }
  // Position 0 sees only itself: query heads 0 and 1 (kv head 0) return its value.
  EXPECT_TRUE(torch::allclose(out[1][0][0].narrow(0, 0, d), v0[0][0][0], 1e-6, 1e-6));
  EXPECT_TRUE(torch::allclose(out[1][0][0].narrow(0, d, d), v0[0][0][0], 1e-6, 1e-6));
}

namespace {

// Causal attention in float64 on q0 [B, T, h, d], k0 and v0 [B, T, kv, d] (query head h uses
// kv head h / (h / kv); the mask hides the future), with q, k, v requiring gradients.
struct Float64Attention {
  torch::Tensor q, k, v, probs, v_rep;  // probs [B, h, T, T], v_rep [B, T, h, d]
  Float64Attention(const torch::Tensor& q0, const torch::Tensor& k0, const torch::Tensor& v0) {
    const int64_t T = q0.size(1), rep = q0.size(2) / k0.size(2), d = q0.size(3);
    q = q0.to(torch::kDouble).requires_grad_();
    k = k0.to(torch::kDouble).requires_grad_();
    v = v0.to(torch::kDouble).requires_grad_();
    v_rep = v.repeat_interleave(rep, 2);
    const torch::Tensor scores =
        torch::einsum("bthd,bshd->bhts", {q, k.repeat_interleave(rep, 2)}) / std::sqrt(double(d));
    const torch::Tensor mask = torch::ones({T, T}, torch::kBool).triu(1);
    probs = torch::softmax(scores.masked_fill(mask, -INFINITY), -1);
  }
  // The output [B, T, h * d] for the given probabilities.
  torch::Tensor out(const torch::Tensor& p) const {
    return torch::einsum("bhts,bshd->bthd", {p, v_rep}).reshape({q.size(0), q.size(1), -1});
  }
};

double relative(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b).norm().item<double>() / b.norm().item<double>();
}

}  // namespace

// bf16 training's attention node (attention_fused.cpp) against float64 on the same rounded
// q, k, v: the output with the softmax rounded to bf16 as the node's product takes it
// (only fp32 sums and the exp's last bits differ), and the gradients against float64's
// own (the node rounds each product's incoming gradient: bf16's resolution, 2^-8). Grouped
// query heads (4 on 2 kv heads) and one query head per kv head (3 on 3).
class Bf16Attention : public ::testing::TestWithParam<std::pair<int64_t, int64_t>> {};
TEST_P(Bf16Attention, NodeMatchesFloat64OnRoundedInputs) {
  const ComputeScope compute(test::test_plan(Precision::bf16, MatmulBackend::onednn));
  torch::manual_seed(11);
  const int64_t B = 2, T = 150, heads = GetParam().first, kv = GetParam().second, d = 16;
  auto rounded = [](const torch::Tensor& t) { return t.to(torch::kBFloat16).to(torch::kFloat); };
  const torch::Tensor q0 = rounded(torch::randn({B, T, heads, d})),
                      k0 = rounded(torch::randn({B, T, kv, d})),
                      v0 = rounded(torch::randn({B, T, kv, d})),
                      g = torch::randn({B, T, heads * d});
  torch::Tensor q = q0.clone().requires_grad_(), k = k0.clone().requires_grad_(),
                v = v0.clone().requires_grad_();
  const torch::Tensor out = causal_attention(q, k, v, 64, 0.0, true);
  out.backward(g);
  const Float64Attention want(q0, k0, v0);
  const torch::Tensor want_out =
      want.out(rounded(want.probs.detach().to(torch::kFloat)).to(torch::kDouble)).detach();
  EXPECT_LT(relative(out, want_out), 1e-3);
  want.out(want.probs).backward(g.to(torch::kDouble));
  EXPECT_LT(relative(q.grad(), want.q.grad()), 2e-2);
  EXPECT_LT(relative(k.grad(), want.k.grad()), 2e-2);
  EXPECT_LT(relative(v.grad(), want.v.grad()), 2e-2);
  EXPECT_GT(relative(q.grad(), want.q.grad()), 1e-5) << "no bf16 rounding: the node did not run";
}
INSTANTIATE_TEST_SUITE_P(Heads, Bf16Attention,
                         ::testing::Values(std::make_pair(int64_t{4}, int64_t{2}),
                                           std::make_pair(int64_t{3}, int64_t{3})));

// fp32 training on oneDNN takes the same node without rounding (attention_fused.cpp): against
// float64 on the same inputs, output and gradients within what fp32 sums and e^x's few ulp
// allow (bf16's rounding would be 1e-3); grouped heads, and a T past two query blocks.
TEST(Attention, Fp32NodeOnOneDnnMatchesFloat64) {
  const ComputeScope compute(test::test_plan(Precision::fp32, MatmulBackend::onednn));
  torch::manual_seed(13);
  const int64_t B = 2, T = 150, heads = 4, kv = 2, d = 16;
  const torch::Tensor q0 = torch::randn({B, T, heads, d}), k0 = torch::randn({B, T, kv, d}),
                      v0 = torch::randn({B, T, kv, d}), g = torch::randn({B, T, heads * d});
  torch::Tensor q = q0.clone().requires_grad_(), k = k0.clone().requires_grad_(),
                v = v0.clone().requires_grad_();
  const torch::Tensor out = causal_attention(q, k, v, 64, 0.0, true);
  ASSERT_NE(out.grad_fn()->name().find("CausalAttentionNode"), std::string::npos)
      << "the ATen form ran: " << out.grad_fn()->name();
  out.backward(g);
  const Float64Attention want(q0, k0, v0);
  const torch::Tensor want_out = want.out(want.probs);
  want_out.backward(g.to(torch::kDouble));
  EXPECT_LT(relative(out, want_out.detach()), 1e-6);
  EXPECT_LT(relative(q.grad(), want.q.grad()), 1e-5);
  EXPECT_LT(relative(k.grad(), want.k.grad()), 1e-5);
  EXPECT_LT(relative(v.grad(), want.v.grad()), 1e-5);
}

// fp32 on OpenBLAS keeps the ATen form (PyTorch's numbers bit for bit).
TEST(Attention, Fp32OnOpenBlasKeepsTheAtenForm) {
  const ComputeScope compute(test::test_plan(Precision::fp32, MatmulBackend::openblas));
  torch::Tensor q = torch::randn({1, 8, 2, 4}).requires_grad_(), k = torch::randn({1, 8, 1, 4});
  const torch::Tensor out = causal_attention(q, k, k, 64, 0.0, true);
  EXPECT_EQ(out.grad_fn()->name().find("CausalAttentionNode"), std::string::npos);
}

// The node's backward forms the softmax (rounded in bf16) again instead of keeping it: it
// must be the forward's, bit for bit. With v = identity the output rows are the forward's
// softmax rows, and with the incoming gradient = identity v's gradient is the backward's,
// transposed (every product then sums one nonzero term: exact). Two query blocks of 64; in
// bf16, and in fp32 on oneDNN.
class AttentionNode : public ::testing::TestWithParam<Precision> {};
TEST_P(AttentionNode, FormsTheSameSoftmaxAgainInItsBackward) {
  const bool bf16 = GetParam() == Precision::bf16;
  const ComputeScope compute(test::test_plan(GetParam(), MatmulBackend::onednn));
  torch::manual_seed(12);
  const int64_t T = 80, rep = 2, M = T * rep, d = M;  // one kv head, d wide enough for both
  torch::Tensor q = (3 * torch::randn({1, T, rep, d})).requires_grad_(),
                k = (3 * torch::randn({1, T, 1, d})).requires_grad_();
  torch::Tensor v = torch::eye(T, d).view({1, T, 1, d}).requires_grad_();
  const torch::Tensor out = causal_attention(q, k, v, 64, 0.0, true);  // [1, T, rep*d]
  // Row m = (position t, head h) of the node's [M, d] view gets gradient e_m.
  out.backward(torch::eye(M, d).view({1, T, rep * d}));
  const torch::Tensor forward_p = out.view({M, d}).narrow(1, 0, T);  // [M, T]
  const torch::Tensor backward_p = v.grad().view({T, d}).t();        // [M, T]
  EXPECT_TRUE(torch::equal(forward_p, backward_p))
      << "max |difference| " << (forward_p - backward_p).abs().max().item<float>();
  // Not vacuous: probabilities (rounded in bf16, not in fp32), each row summing to about 1,
  // none of the future.
  EXPECT_EQ(torch::equal(forward_p, forward_p.to(torch::kBFloat16).to(torch::kFloat)), bf16);
  EXPECT_LT((forward_p.sum(1) - 1).abs().max().item<float>(), bf16 ? 2e-2 : 1e-5);
  const torch::Tensor future = torch::arange(T).unsqueeze(0) >
                               torch::div(torch::arange(M), rep, "floor").unsqueeze(1);  // [M, T]
  EXPECT_TRUE(
      torch::equal(forward_p.masked_select(future), torch::zeros({future.sum().item<int64_t>()})));
  EXPECT_GT(forward_p[M - 1].gt(0).sum().item<int64_t>(), T / 2);
}
INSTANTIATE_TEST_SUITE_P(Precisions, AttentionNode,
                         ::testing::Values(Precision::bf16, Precision::fp32));

namespace {

// Attention with hidden 8, 4 query heads and 2 kv heads of width 2 (query heads 0, 1 share
// kv head 0; 2, 3 share kv head 1). v = the first four inputs, o_proj = identity; q = 0,
// so every score is 0 and each query averages the values it may see.
Attention hand_set_attention() {
  ModelConfig cfg;
  cfg.hidden_size = 8, cfg.num_attention_heads = 4, cfg.num_key_value_heads = 2;
  Attention attn(cfg);
  set(attn->q_proj->weight, torch::zeros({8, 8}));
  set(attn->v_proj->weight, torch::eye(4, 8));  // v = x[0:4]: kv head 0 (x0, x1), 1 (x2, x3)
  set(attn->o_proj->weight, torch::eye(8));
  return attn;
}

}  // namespace

TEST(Attention, GroupedQueryHeadsUseTheirKvHeadAndTheMaskHidesTheFuture) {
  Attention attn = hand_set_attention();
  const RotaryTables rope = make_rotary_tables(2, 16, 1e6);
  torch::Tensor x = torch::arange(1, 25, torch::kFloat32).view({1, 3, 8});  // [B, T, H]
  torch::Tensor out = attn(x, rope);                                        // [1, 3, 8]
  for (int64_t t = 0; t < 3; ++t) {
    // Uniform attention over positions 0..t: the mean of their values.
    const torch::Tensor mean_v = x[0].narrow(0, 0, t + 1).narrow(1, 0, 4).mean(0);  // [4]
    for (int64_t head = 0; head < 4; ++head) {
      const int64_t kv = head / 2;
      for (int64_t i = 0; i < 2; ++i)
        EXPECT_NEAR(out[0][t][head * 2 + i].item<double>(), mean_v[kv * 2 + i].item<double>(), 1e-5)
            << "position " << t << " head " << head;
    }
  }
  // With real queries the future still does not leak: changing position 2 leaves 0 and 1 alone.
  torch::manual_seed(4);
  ModelConfig cfg;
  cfg.hidden_size = 8, cfg.num_attention_heads = 4, cfg.num_key_value_heads = 2;
  Attention random_attn(cfg);
  torch::Tensor a = torch::randn({1, 3, 8}), b = a.clone();
  b[0][2] = torch::randn({8});
  torch::Tensor ya = random_attn(a, rope), yb = random_attn(b, rope);
  EXPECT_TRUE(torch::equal(ya.narrow(1, 0, 2), yb.narrow(1, 0, 2)));
  EXPECT_FALSE(torch::equal(ya.narrow(1, 2, 1), yb.narrow(1, 2, 1)));
  // The KV cache: 2 tokens, then 1 more, give the whole sequence's outputs.
  LayerKVCache cache;
  torch::Tensor first = random_attn(a.narrow(1, 0, 2), rope, &cache);
  torch::Tensor last = random_attn(a.narrow(1, 2, 1), rope, &cache);
  EXPECT_EQ(cache.length(), 3);
  EXPECT_TRUE(torch::allclose(torch::cat({first, last}, 1), ya, 1e-6, 1e-6));
}

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
    const ComputeScope compute(test::test_plan(GetParam(), MatmulBackend::onednn, threads));
    torch::manual_seed(6);
    const int64_t B = 3, T = 70, H = 48, V = 6400;  // 210 rows
    const torch::Tensor h0 = torch::randn({B, T, H}), w0 = 0.2 * torch::randn({V, H});
    torch::Tensor labels = torch::randint(0, V, {B, T}, torch::kLong);  // [B, T]
    labels[1][4] = -100, labels[2][T - 1] = -100;
    const torch::Tensor targets = labels.narrow(1, 1, T - 1);  // [B, T-1]
    const torch::Tensor counted = targets.ne(-100);
    const torch::Tensor hb = operand(h0).reshape({-1, H}), wb = operand(w0);
    // u [B*T, V]: the last position and the ignored label's row stay 0.
    const torch::Tensor logits = project(h0, w0).detach();  // [B, T, V] the node's product
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
      const torch::Tensor want = next_token_loss(project(ha, wa), labels, mean);
      const torch::Tensor got = head_next_token_loss(hn, wn, labels, mean);
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
      const torch::Tensor lz = head_next_token_loss(hz, wz, none, mean);
      EXPECT_EQ(std::isnan(lz.item<float>()), mean);
      lz.backward();
      EXPECT_TRUE(hz.grad().eq(0).all().item<bool>());
      EXPECT_TRUE(wz.grad().eq(0).all().item<bool>());
      // Not vacuous: the node ran; bf16's products are not fp32's; in fp32 the loss is
      // within a few ulp of ATen's on OpenBLAS (PyTorch's numbers).
      EXPECT_NE(got.grad_fn()->name().find("HeadNextTokenLoss"), std::string::npos);
      const ComputeScope other(test::test_plan(
          Precision::fp32, bf16 ? MatmulBackend::onednn : MatmulBackend::openblas, threads));
      const float plain = next_token_loss(project(h0, w0), labels, mean).item<float>();
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
        const ComputeScope fp32(test::test_plan(Precision::fp32, MatmulBackend::openblas, 2));
        want = next_token_loss(a, labels, mean);  // ATen's
      }
      {
        const ComputeScope bf16(test::test_plan(Precision::bf16, MatmulBackend::onednn, 2));
        got = next_token_loss(b, labels, mean);  // the own loops
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

// The routed experts as one node (routed_experts) against the plain form through autograd:
// gather the assigned rows, each expert's FeedForward on its slice, times the routing
// weights, index_add into the tokens. Outputs and every gradient within float rounding
// (the GEMMs write into column ranges of shared buffers, for which OpenBLAS may pick other
// kernels at these small sizes; the SwiGLU backward is one pass of its own); an idle
// expert's gradients zero, a token whose slots were all dropped gets zero. With OpenBLAS on
// 2 threads the experts run two at once. (The golden-loss test checks the bits.)
TEST(RoutedExperts, EqualTheGatherExpertsScatterFormThroughAutograd) {
  const ComputeScope compute(test::test_plan(Precision::fp32, MatmulBackend::openblas, 2));
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
    const torch::Tensor got = routed_experts(xb, token, wb, counts, b);
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

// The dense feed-forward's node (swiglu_fused.h, taken by FeedForward in bf16 training and
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
    const ComputeScope compute(test::test_plan(GetParam(), MatmulBackend::onednn, threads));
    torch::manual_seed(22);
    const int64_t N = 100, H = 48, I = 80;
    FeedForward ff(H, I);
    for (auto& p : ff->parameters()) p.data().normal_(0.0, 0.3);
    const torch::Tensor x0 = torch::randn({2, N / 2, H}), g = torch::randn({2, N / 2, H});
    torch::Tensor xa = x0.clone().requires_grad_(), xb = x0.clone().requires_grad_();
    std::vector<torch::Tensor> plain;  // gate, down, up (registration order)
    for (const auto& p : ff->parameters()) plain.push_back(p.detach().clone().requires_grad_());
    const torch::Tensor want =
        project(torch::silu(project(xa, plain[0])) * project(xa, plain[2]), plain[1]);
    const torch::Tensor got = ff(xb);
    ASSERT_NE(got.grad_fn()->next_edges()[0].function->name().find("DenseSwiGLU"),
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
    const ComputeScope fp32(test::test_plan(Precision::fp32, MatmulBackend::onednn, threads));
    torch::NoGradGuard no_grad;
    EXPECT_GT(rel(ff(x0), got.detach()), 2e-3);
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
    const ComputeScope compute(test::test_plan(GetParam(), MatmulBackend::onednn, threads));
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
    const torch::Tensor got = routed_experts(xb, token, wb, counts, experts);
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
