// causal_attention's training node in bf16 (run.precision: bf16): scores, mask, softmax and
// the product with v in one pass per query block, both ways.
//
// Why: the ATen form runs the scores [B, kv, T*rep, T] through a division, a mask, a
// softmax and a rounding to bf16 as separate passes over memory, each way; attention took
// about 4x its products' time in a bf16 step (minimind-bench --breakdown). Here each block's
// scores are written by the product, then scaled, masked, softmaxed and rounded in one pass
// while in cache; the backward likewise forms the softmax's gradient and rounds it in one.
//
// Precision: the same scheme as every bf16 product here (docs/precision.md): the products'
// inputs and the gradient each product receives are rounded to bf16, sums are fp32, and the
// softmax and its backward run in fp32 on fp32 scores (s / sqrt(d), masked), as the ATen
// form computes them; only the order of fp32 sums differs.
#include <cmath>
#include <vector>

#include "minimind/model/attention.h"
#include "minimind/model/vector_math.h"
#include "minimind/util/blas_tasks.h"
#include "minimind/util/cpu_clones.h"
#include "minimind/util/matmul.h"
#include "minimind/util/step_part.h"

namespace minimind {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

MINIMIND_NO_FMA_BEGIN
MINIMIND_NO_TRAPS_BEGIN
// Rows [r0, r1) of one slice's scores p [.., ld] (the product's output, in place): row r is
// query position r / rep, which sees keys [0, r / rep]; p = softmax(s / scale) over them,
// 0 over the keys after it up to `end`, and pb = p rounded.
MINIMIND_CPU_CLONES void softmax_rows(float* __restrict p, uint16_t* __restrict pb, int64_t ld,
                                      int64_t r0, int64_t r1, int64_t rep, int64_t end,
                                      float scale) {
  for (int64_t r = r0; r < r1; ++r) {
    float* row = p + (r - r0) * ld;
    uint16_t* brow = pb + (r - r0) * ld;
    const int64_t seen = r / rep + 1;
    for (int64_t j = 0; j < seen; ++j) row[j] = row[j] / scale;
    const float mx = max_lanes(row, seen);
    for (int64_t j = 0; j < seen; ++j) row[j] = exp_clamped(row[j] - mx);
    const float sum = sum_lanes(row, seen);
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < seen; ++j) {
      row[j] = row[j] * inv;
      brow[j] = bf16_bits(row[j]);
    }
    for (int64_t j = seen; j < end; ++j) row[j] = 0.0f, brow[j] = 0;
  }
}

// The softmax's and the scaling's backward for rows [0, n) of a block: ds = p * (dp -
// sum(dp * p)) / scale (ATen's softmax backward, then the division's), rounded into dsb.
MINIMIND_CPU_CLONES void softmax_backward_rows(const float* __restrict p, int64_t ldp,
                                               const float* __restrict dp, uint16_t* __restrict dsb,
                                               int64_t n, int64_t end, float scale) {
  for (int64_t r = 0; r < n; ++r) {
    const float *p_r = p + r * ldp, *dp_r = dp + r * end;
    uint16_t* ds_r = dsb + r * end;
    const float dot = dot_lanes(dp_r, p_r, end);
    for (int64_t j = 0; j < end; ++j) ds_r[j] = bf16_bits((p_r[j] * (dp_r[j] - dot)) / scale);
  }
}
MINIMIND_NO_TRAPS_END
MINIMIND_NO_FMA_END

const uint16_t* bits(const torch::Tensor& t) {
  return static_cast<const uint16_t*>(t.data_ptr());
}

// qg [n, M = T*rep, d] (rows ordered (position, head)), k and v [n, T, d], float32
// contiguous; -> [n, M, d].
struct CausalAttentionBf16 : torch::autograd::Function<CausalAttentionBf16> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& qg,
                               const torch::Tensor& k, const torch::Tensor& v, int64_t rep,
                               int64_t block) {
    const int64_t n = qg.size(0), M = qg.size(1), d = qg.size(2), T = k.size(1);
    const torch::Tensor qb = to_bf16(qg), kb = to_bf16(k), vb = to_bf16(v);
    const auto f32 = qg.options();
    torch::Tensor p = torch::empty({n, M, T}, f32);  // [n, M, T] the softmax, kept
    torch::Tensor pb = torch::empty({n, M, T}, f32.dtype(torch::kBFloat16));  // rounded
    torch::Tensor out = torch::empty({n, M, d}, f32);                         // [n, M, d]
    const auto scale = static_cast<float>(std::sqrt(static_cast<double>(d)));
    run_blas_tasks(n, [&](int64_t i) {
      float* p_i = p.data_ptr<float>() + i * M * T;
      auto* pb_i = static_cast<uint16_t*>(pb.data_ptr()) + i * M * T;
      const uint16_t *q_i = bits(qb) + i * M * d, *k_i = bits(kb) + i * T * d,
                     *v_i = bits(vb) + i * T * d;
      float* o_i = out.data_ptr<float>() + i * M * d;
      for (int64_t t0 = 0; t0 < T; t0 += block) {
        const int64_t end = std::min(T, t0 + block), r0 = t0 * rep, rows = (end - t0) * rep;
        // s [rows, end] = q @ k^T, into the kept softmax's rows.
        gemm_bf16_rows('N', 'T', rows, end, d, q_i + r0 * d, d, k_i, d, p_i + r0 * T, T);
        softmax_rows(p_i + r0 * T, pb_i + r0 * T, T, r0, r0 + rows, rep, end, scale);
        gemm_bf16_rows('N', 'N', rows, d, end, pb_i + r0 * T, T, v_i, d, o_i + r0 * d, d);
      }
    });
    ctx->save_for_backward({qb, kb, vb, p, pb});
    ctx->saved_data["rep"] = rep;
    ctx->saved_data["block"] = block;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const StepScope part(StepPart::attention);
    const variable_list s = ctx->get_saved_variables();
    const torch::Tensor &qb = s[0], &kb = s[1], &vb = s[2], &p = s[3], &pb = s[4];
    const int64_t rep = ctx->saved_data["rep"].toInt(), block = ctx->saved_data["block"].toInt();
    const int64_t n = qb.size(0), M = qb.size(1), d = qb.size(2), T = kb.size(1);
    const torch::Tensor gob = to_bf16(grad_out[0].contiguous());  // [n, M, d]
    const auto f32 = p.options();
    torch::Tensor gq = torch::empty({n, M, d}, f32), gk = torch::zeros({n, T, d}, f32),
                  gv = torch::zeros({n, T, d}, f32);
    const auto scale = static_cast<float>(std::sqrt(static_cast<double>(d)));
    run_blas_tasks(n, [&](int64_t i) {
      const float* p_i = p.data_ptr<float>() + i * M * T;
      const uint16_t *pb_i = bits(pb) + i * M * T, *q_i = bits(qb) + i * M * d,
                     *k_i = bits(kb) + i * T * d, *v_i = bits(vb) + i * T * d,
                     *go_i = bits(gob) + i * M * d;
      float *gq_i = gq.data_ptr<float>() + i * M * d, *gk_i = gk.data_ptr<float>() + i * T * d,
            *gv_i = gv.data_ptr<float>() + i * T * d;
      std::vector<float> dp, part(static_cast<size_t>(T * d));
      std::vector<uint16_t> dsb;
      auto add_part = [&](float* to, int64_t keys) {
        for (int64_t j = 0; j < keys * d; ++j) to[j] += part[static_cast<size_t>(j)];
      };
      for (int64_t t0 = 0; t0 < T; t0 += block) {
        const int64_t end = std::min(T, t0 + block), r0 = t0 * rep, rows = (end - t0) * rep;
        dp.resize(static_cast<size_t>(rows * end));
        dsb.resize(static_cast<size_t>(rows * end));
        // dp [rows, end] = go @ v^T; gv[:end] += pb^T @ go.
        gemm_bf16_rows('N', 'T', rows, end, d, go_i + r0 * d, d, v_i, d, dp.data(), end);
        gemm_bf16_rows('T', 'N', end, d, rows, pb_i + r0 * T, T, go_i + r0 * d, d, part.data(), d);
        add_part(gv_i, end);
        softmax_backward_rows(p_i + r0 * T, T, dp.data(), dsb.data(), rows, end, scale);
        // gq = ds @ k; gk[:end] += ds^T @ q.
        gemm_bf16_rows('N', 'N', rows, d, end, dsb.data(), end, k_i, d, gq_i + r0 * d, d);
        gemm_bf16_rows('T', 'N', end, d, rows, dsb.data(), end, q_i + r0 * d, d, part.data(), d);
        add_part(gk_i, end);
      }
    });
    return {gq, gk, gv, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor causal_attention_bf16(const torch::Tensor& qg, const torch::Tensor& k,
                                    const torch::Tensor& v, int64_t rep, int64_t block) {
  return CausalAttentionBf16::apply(qg.contiguous(), k.contiguous(), v.contiguous(), rep, block);
}

}  // namespace minimind
