// Attention alone: the query-block node against the masked square, the bf16 and fp32 nodes
// against float64, and a hand-set layer (GQA head mapping, causal mask, cached decoding).
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
  const test::PlanScope compute(Precision::bf16, MatmulBackend::onednn);
  torch::manual_seed(11);
  const int64_t B = 2, T = 150, heads = GetParam().first, kv = GetParam().second, d = 16;
  auto rounded = [](const torch::Tensor& t) { return t.to(torch::kBFloat16).to(torch::kFloat); };
  const torch::Tensor q0 = rounded(torch::randn({B, T, heads, d})),
                      k0 = rounded(torch::randn({B, T, kv, d})),
                      v0 = rounded(torch::randn({B, T, kv, d})),
                      g = torch::randn({B, T, heads * d});
  torch::Tensor q = q0.clone().requires_grad_(), k = k0.clone().requires_grad_(),
                v = v0.clone().requires_grad_();
  const torch::Tensor out = causal_attention(q, k, v, 64, 0.0, true, compute.products(),
                                             attention_node(compute.products(), 0.0));
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
  const test::PlanScope compute(Precision::fp32, MatmulBackend::onednn);
  torch::manual_seed(13);
  const int64_t B = 2, T = 150, heads = 4, kv = 2, d = 16;
  const torch::Tensor q0 = torch::randn({B, T, heads, d}), k0 = torch::randn({B, T, kv, d}),
                      v0 = torch::randn({B, T, kv, d}), g = torch::randn({B, T, heads * d});
  torch::Tensor q = q0.clone().requires_grad_(), k = k0.clone().requires_grad_(),
                v = v0.clone().requires_grad_();
  const torch::Tensor out = causal_attention(q, k, v, 64, 0.0, true, compute.products(),
                                             attention_node(compute.products(), 0.0));
  ASSERT_NE(out.grad_fn()->name().find("CausalAttentionFused"), std::string::npos)
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
  const test::PlanScope compute(Precision::fp32, MatmulBackend::openblas);
  torch::Tensor q = torch::randn({1, 8, 2, 4}).requires_grad_(), k = torch::randn({1, 8, 1, 4});
  const torch::Tensor out = causal_attention(q, k, k, 64, 0.0, true, compute.products(),
                                             attention_node(compute.products(), 0.0));
  EXPECT_EQ(out.grad_fn()->name().find("CausalAttentionFused"), std::string::npos);
}

// The node's backward forms the softmax (rounded in bf16) again instead of keeping it: it
// must be the forward's, bit for bit. With v = identity the output rows are the forward's
// softmax rows, and with the incoming gradient = identity v's gradient is the backward's,
// transposed (every product then sums one nonzero term: exact). Two query blocks of 64; in
// bf16, and in fp32 on oneDNN.
class AttentionNode : public ::testing::TestWithParam<Precision> {};
TEST_P(AttentionNode, FormsTheSameSoftmaxAgainInItsBackward) {
  const bool bf16 = GetParam() == Precision::bf16;
  const test::PlanScope compute(GetParam(), MatmulBackend::onednn);
  torch::manual_seed(12);
  const int64_t T = 80, rep = 2, M = T * rep, d = M;  // one kv head, d wide enough for both
  torch::Tensor q = (3 * torch::randn({1, T, rep, d})).requires_grad_(),
                k = (3 * torch::randn({1, T, 1, d})).requires_grad_();
  torch::Tensor v = torch::eye(T, d).view({1, T, 1, d}).requires_grad_();
  const torch::Tensor out =
      causal_attention(q, k, v, 64, 0.0, true, compute.products(),
                       attention_node(compute.products(), 0.0));  // [1, T, rep*d]
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
