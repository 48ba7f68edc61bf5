// causal_attention's training node when its products leave ATen: in bf16 (run.precision:
// bf16) and in fp32 on oneDNN (run.matmul: onednn). Scores, mask, softmax and the product
// with v in one pass per query block, both ways.
//
// Why: the ATen form runs the scores [B, kv, T*rep, T] through a division, a mask, a
// softmax (and in bf16 a rounding) as separate passes over memory, each way; attention took
// about 4x its products' time in a bf16 step and 2x in fp32 (minimind-bench --breakdown).
// Here a block's scores go into a buffer of the thread's that stays in its cache, are
// scaled, masked, softmaxed (and rounded) there, and feed the product with v. The softmax is
// not kept: the backward forms the block's scores again and the softmax from each row's
// (max, 1 / sum), bit for bit, and its gradient in the same pass. Writing [B, kv, T*rep, T]
// floats (and their rounded copy) to memory and reading them back took longer than that
// extra product, and held 24 MB per layer on the bench model.
//
// Precision: the products' operands are E, the element type: bf16 bits (uint16_t) or float.
// In bf16 it is the scheme of every bf16 product here (docs/precision.md): the products'
// inputs and the gradient each product receives are rounded to bf16, sums are fp32. In both,
// the softmax and its backward run in fp32 on fp32 scores (s / sqrt(d), masked), as the ATen
// form computes them; only the order of fp32 sums and e^x's last bits differ (so fp32 on
// oneDNN is not ATen's bit for bit; fp32 on OpenBLAS keeps the ATen form and is).
#include <algorithm>
#include <cmath>
#include <memory>
#include <type_traits>

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
// How far a row's loops run: the keys it sees, rounded up to whole kLanes (but not past
// `end`), so that the loops have no scalar tail; the keys in between are masked.
inline int64_t padded(int64_t seen, int64_t end) {
  const int64_t up = (seen + kLanes - 1) / kLanes * kLanes;
  return up < end ? up : end;
}

// Where row r of a block starts, and what it sees: query position r / rep sees keys
// [0, r / rep]; its loops run to n = padded(seen, end).
struct BlockRow {
  int64_t at, seen, n;
  BlockRow(int64_t r, int64_t r0, int64_t ld, int64_t rep, int64_t end)
      : at((r - r0) * ld), seen(r / rep + 1), n(padded(r / rep + 1, end)) {}
};

// The rows are taken kGroup at a time when they run to the same n (the query heads of one
// position always do): their loops run together, with the group's partial maxima and sums
// in registers at once. One row alone, 8 vectors on average at T = 256, made each reduction
// a chain of dependent steps; grouping 4 rows took the forward's loops from 1.13 to 0.74 ns
// per element (a standalone harness, bit for bit the same numbers).
constexpr int kGroup = 4;

// Whether rows [r, r + kGroup) of a block that ends before r1 run to the same n.
inline bool whole_group(int64_t r, int64_t r1, int64_t rep, int64_t end) {
  return r + kGroup <= r1 && padded((r + kGroup - 1) / rep + 1, end) == padded(r / rep + 1, end);
}

// In fp32 the softmax and its gradient replace the scores and dp in place, and the products
// read them there: a copy of a float is the float. That keeps a block's buffers in the
// core's cache (four [rows, end] float buffers did not fit). In bf16 they go to buffers of
// rounded copies (sb, pb, dsb), which the fp32 calls leave untouched.
template <typename E>
constexpr bool kInPlace = std::is_same_v<E, float>;

// Rows r .. r + G - 1 of softmax_rows, all running to the same n.
template <int G, typename E>
__attribute__((always_inline)) inline void softmax_group(float* __restrict s, E* __restrict sb,
                                                         int64_t ld, int64_t r0, int64_t r,
                                                         int64_t rep, int64_t end, float scale,
                                                         float* __restrict stats) {
  float* row[G];
  int64_t seen[G];
  for (int g = 0; g < G; ++g) {
    const BlockRow br(r + g, r0, ld, rep, end);
    row[g] = s + br.at, seen[g] = br.seen;
  }
  const int64_t n = BlockRow(r, r0, ld, rep, end).n;  // the group's rows share it
  // The keys between `seen` and n score -inf: e^x gives them e^-87 (it clamps there), far
  // below the last bit of a sum that holds the maximum's e^0 = 1; they are zeroed below.
  for (int g = 0; g < G; ++g)
    for (int64_t j = seen[g]; j < n; ++j) row[g][j] = -__builtin_inff();
  // s / scale and its maximum (max_lanes' order: lanes, then the tail, then the lanes).
  Lanes lanes[G];
  for (Lanes& l : lanes) l = all_lanes(-__builtin_inff());
  int64_t j0 = 0;
  for (; j0 + kLanes <= n; j0 += kLanes)
    for (int g = 0; g < G; ++g) {
      const Lanes x = load_lanes(row[g] + j0) / scale;
      store_lanes(row[g] + j0, x);
      lanes[g] = greater_of(x, lanes[g]);
    }
  float mx[G], sum[G];
  for (int g = 0; g < G; ++g) {
    mx[g] = -__builtin_inff();
    for (int64_t j = j0; j < n; ++j) {
      row[g][j] = row[g][j] / scale;
      mx[g] = row[g][j] > mx[g] ? row[g][j] : mx[g];
    }
    for (int64_t l = 0; l < kLanes; ++l) mx[g] = lanes[g][l] > mx[g] ? lanes[g][l] : mx[g];
  }
  // e^(x - max) and its sum (sum_lanes' order).
  for (Lanes& l : lanes) l = Lanes{};
  for (j0 = 0; j0 + kLanes <= n; j0 += kLanes)
    for (int g = 0; g < G; ++g) {
      const Lanes e = exp_clamped(load_lanes(row[g] + j0) - mx[g]);
      store_lanes(row[g] + j0, e);
      lanes[g] += e;
    }
  for (int g = 0; g < G; ++g) {
    sum[g] = 0;
    for (int64_t j = j0; j < n; ++j) sum[g] += row[g][j] = exp_clamped(row[g][j] - mx[g]);
    for (int64_t l = 0; l < kLanes; ++l) sum[g] += lanes[g][l];
  }
  for (int g = 0; g < G; ++g) {
    const float inv = 1.0f / sum[g];
    if constexpr (kInPlace<E>) {
      for (int64_t j = 0; j < n; ++j) row[g][j] = row[g][j] * inv;
      for (int64_t j = seen[g]; j < end; ++j) row[g][j] = 0;
    } else {
      E* brow = sb + (row[g] - s);
      for (int64_t j = 0; j < n; ++j) brow[j] = as_operand<E>(row[g][j] * inv);
      for (int64_t j = seen[g]; j < end; ++j) brow[j] = 0;
    }
    stats[2 * (r + g - r0)] = mx[g], stats[2 * (r + g - r0) + 1] = inv;
  }
}

// Rows [r0, r1) of one block's scores s [.., ld] (the product's output, in place): row r is
// query position r / rep, which sees keys [0, r / rep]. sb = softmax(s / scale) over them,
// as an operand (rounded in bf16), 0 over the keys after it up to `end`; stats gets each row's
// (max, 1 / sum), from which softmax_backward_rows forms the same numbers again.
template <typename E>
MINIMIND_CPU_CLONES void softmax_rows(float* __restrict s, E* __restrict sb, int64_t ld, int64_t r0,
                                      int64_t r1, int64_t rep, int64_t end, float scale,
                                      float* __restrict stats) {
  for (int64_t r = r0; r < r1;) {
    if (whole_group(r, r1, rep, end)) {
      softmax_group<kGroup, E>(s, sb, ld, r0, r, rep, end, scale, stats);
      r += kGroup;
    } else {
      softmax_group<1, E>(s, sb, ld, r0, r, rep, end, scale, stats);
      r += 1;
    }
  }
}

// Rows r .. r + G - 1 of softmax_backward_rows, all running to the same n.
template <int G, typename E>
__attribute__((always_inline)) inline void softmax_backward_group(
    float* __restrict s, E* __restrict pb, float* __restrict dp, E* __restrict dsb, int64_t ld,
    int64_t r0, int64_t r, int64_t rep, int64_t end, float scale, const float* __restrict stats) {
  float* p[G];
  int64_t seen[G];
  float mx[G], inv[G], dot[G];
  for (int g = 0; g < G; ++g) {
    const BlockRow br(r + g, r0, ld, rep, end);
    p[g] = s + br.at, seen[g] = br.seen;
    mx[g] = stats[2 * (r + g - r0)], inv[g] = stats[2 * (r + g - r0) + 1];
  }
  const int64_t n = BlockRow(r, r0, ld, rep, end).n;  // the group's rows share it
  // p again (0 after `seen`), and sum(dp * p) in dot_lanes' order.
  Lanes lanes[G];
  for (Lanes& l : lanes) l = Lanes{};
  int64_t j0 = 0;
  for (; j0 + kLanes <= n; j0 += kLanes)
    for (int g = 0; g < G; ++g) {
      const Lanes x = first_lanes(exp_clamped(load_lanes(p[g] + j0) / scale - mx[g]) * inv[g],
                                  static_cast<int32_t>(seen[g] - j0));
      store_lanes(p[g] + j0, x);
      lanes[g] += load_lanes(dp + (p[g] - s) + j0) * x;
    }
  for (int g = 0; g < G; ++g) {
    const float* dp_g = dp + (p[g] - s);
    dot[g] = 0;
    for (int64_t j = j0; j < n; ++j) {
      p[g][j] = j < seen[g] ? exp_clamped(p[g][j] / scale - mx[g]) * inv[g] : 0.0f;
      dot[g] += dp_g[j] * p[g][j];
    }
    for (int64_t l = 0; l < kLanes; ++l) dot[g] += lanes[g][l];
  }
  // pb = p rounded; ds = p * (dp - dot) / scale rounded, 0 after `seen` (in fp32: p stays
  // in s, ds replaces dp).
  for (int g = 0; g < G; ++g) {
    float* dp_g = dp + (p[g] - s);
    for (int64_t j = n; j < end; ++j) p[g][j] = 0.0f;
    if constexpr (kInPlace<E>) {
      for (int64_t j = 0; j < n; ++j) dp_g[j] = (p[g][j] * (dp_g[j] - dot[g])) / scale;
      for (int64_t j = seen[g]; j < end; ++j) dp_g[j] = 0;
    } else {
      E *pb_g = pb + (p[g] - s), *ds_g = dsb + (p[g] - s);
      for (int64_t j = 0; j < end; ++j) pb_g[j] = as_operand<E>(p[g][j]);
      for (int64_t j = 0; j < n; ++j)
        ds_g[j] = as_operand<E>((p[g][j] * (dp_g[j] - dot[g])) / scale);
      for (int64_t j = seen[g]; j < end; ++j) ds_g[j] = 0;
    }
  }
}

// The backward's rows [r0, r1) of a block, from the block's scores s [.., ld] (formed again
// by the same product) and the forward's stats: the softmax p again, in place in s, bit for
// bit as softmax_rows formed it (the same operations, in the same order for each element),
// pb = p rounded (for v's gradient), and ds = p * (dp - sum(dp * p)) / scale (ATen's softmax
// backward, then the division's) rounded into dsb; 0 over the keys a row does not see.
template <typename E>
MINIMIND_CPU_CLONES void softmax_backward_rows(float* __restrict s, E* __restrict pb,
                                               float* __restrict dp, E* __restrict dsb, int64_t ld,
                                               int64_t r0, int64_t r1, int64_t rep, int64_t end,
                                               float scale, const float* __restrict stats) {
  for (int64_t r = r0; r < r1;) {
    if (whole_group(r, r1, rep, end)) {
      softmax_backward_group<kGroup, E>(s, pb, dp, dsb, ld, r0, r, rep, end, scale, stats);
      r += kGroup;
    } else {
      softmax_backward_group<1, E>(s, pb, dp, dsb, ld, r0, r, rep, end, scale, stats);
      r += 1;
    }
  }
}
MINIMIND_NO_TRAPS_END
MINIMIND_NO_FMA_END

template <typename E>
E* operands(const torch::Tensor& t) {
  return static_cast<E*>(t.data_ptr());
}

// n floats as the products take them: rounded to bf16, or copied.
void to_operands(const float* src, uint16_t* dst, int64_t n) {
  round_to_bf16(src, dst, n);
}
void to_operands(const float* src, float* dst, int64_t n) {
  std::copy_n(src, n, dst);
}

// A thread's working memory for one block, kept between calls (a block's scores are at most
// [block * rep, T] floats: they stay in the core's cache, and are not allocated and first
// touched again for every block).
template <typename T>
struct Scratch {
  std::unique_ptr<T[]> data;
  int64_t size = 0;
  T* get(int64_t n) {
    if (n > size) data.reset(new T[static_cast<size_t>(n)]), size = n;
    return data.get();
  }
};
template <typename E>
struct BlockBuffers {
  Scratch<float> s, dp, part, rows;
  Scratch<E> sb, dsb, go;
};

// Where the products read a block's softmax (or its gradient) from: the float buffer f
// itself in fp32 (kInPlace), else the buffer of rounded copies.
template <typename E>
E* operand_rows(float* f, Scratch<E>& copies, int64_t n) {
  if constexpr (kInPlace<E>)
    return f;
  else
    return copies.get(n);
}
template <typename E>
thread_local BlockBuffers<E> buffers;

// Where slice i = (batch b, kv head g) of the node finds its rows in the model's layouts:
// q and the output [B, T, h, d] hold the rep query heads of g at position t as rep * d
// contiguous floats; k and v [B, T, kv, d] hold g's key at t as d floats. The node works on
// each slice as [T * rep, d] rows ordered (position, head), and [T, d], gathering them as
// it rounds (or copies) them and scattering its results back, instead of permuted copies of
// q, k, v and the output (and of their gradients) made by ATen around it.
struct Slices {
  int64_t B, T, kv, rep, d;
  int64_t q_at(int64_t i, int64_t t) const {  // rep * d floats
    return ((i / kv * T + t) * kv + i % kv) * rep * d;
  }
  int64_t kv_at(int64_t i, int64_t t) const {  // d floats
    return ((i / kv * T + t) * kv + i % kv) * d;
  }
  // Slice i's rows of x [B, T, h, d] as operands into dst [T * rep, d].
  template <typename E>
  void q_rows(int64_t i, const float* x, E* dst) const {
    for (int64_t t = 0; t < T; ++t) to_operands(x + q_at(i, t), dst + t * rep * d, rep * d);
  }
  // Slice i's rows of x [B, T, kv, d] as operands into dst [T, d].
  template <typename E>
  void kv_rows(int64_t i, const float* x, E* dst) const {
    for (int64_t t = 0; t < T; ++t) to_operands(x + kv_at(i, t), dst + t * d, d);
  }
  // Rows [t0 * rep, end * rep) of slice i, src [(end - t0) * rep, d], into out [B, T, h, d].
  void put_q_rows(int64_t i, int64_t t0, int64_t end, const float* src, float* out) const {
    for (int64_t t = t0; t < end; ++t)
      std::copy_n(src + (t - t0) * rep * d, rep * d, out + q_at(i, t));
  }
  // to [B, T, kv, d] += src [keys, d] at slice i's positions [first, first + keys).
  void add_kv_rows(int64_t i, int64_t first, int64_t keys, const float* src, float* to) const {
    for (int64_t t = 0; t < keys; ++t) {
      float* row = to + kv_at(i, first + t);
      for (int64_t j = 0; j < d; ++j) row[j] += src[t * d + j];
    }
  }
};

// Row b's document starts in starts [B, T] (empty: one document a row).
const int64_t* row_starts(const torch::Tensor& starts, int64_t b, int64_t T) {
  return starts.numel() > 0 ? starts.data_ptr<int64_t>() + b * T : nullptr;
}

// q [B, T, h, d], k and v [B, T, kv, d], float32 contiguous -> [B, T, h * d]; starts [B, T]
// int64 or empty (packed_rows.h). The softmax is not kept: the backward forms each
// block's scores again (one more product of q and k, a sixth of the node's products) and the
// softmax from each row's (max, 1 / sum), instead of writing [n, M, T] floats and their
// rounded copy to memory and reading them back (their traffic took longer than the product).
template <typename E>
struct CausalAttentionFused : torch::autograd::Function<CausalAttentionFused<E>> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, int64_t block, const torch::Tensor& starts) {
    const int64_t B = q.size(0), T = q.size(1), h = q.size(2), d = q.size(3), kv = k.size(2);
    const Slices sl{B, T, kv, h / kv, d};
    const int64_t rep = sl.rep, n = B * kv, M = T * rep;
    const auto f32 = q.options(), of_e = f32.dtype(operand_dtype<E>);
    // The slices' rows as operands, kept for the backward: [n, M, d], [n, T, d] x2.
    torch::Tensor qb = torch::empty({n, M, d}, of_e), kb = torch::empty({n, T, d}, of_e),
                  vb = torch::empty({n, T, d}, of_e);
    torch::Tensor stats = torch::empty({n, M, 2}, f32);  // [n, M, 2] (max, 1 / sum) per row
    torch::Tensor out = torch::empty({B, T, h * d}, f32);
    const auto scale = static_cast<float>(std::sqrt(static_cast<double>(d)));
    run_blas_tasks(n, [&](int64_t i) {
      E *q_i = operands<E>(qb) + i * M * d, *k_i = operands<E>(kb) + i * T * d,
        *v_i = operands<E>(vb) + i * T * d;
      sl.q_rows(i, q.data_ptr<float>(), q_i);
      sl.kv_rows(i, k.data_ptr<float>(), k_i);
      sl.kv_rows(i, v.data_ptr<float>(), v_i);
      float* st_i = stats.data_ptr<float>() + i * M * 2;
      BlockBuffers<E>& b = buffers<E>;
      float* s = b.s.get(block * rep * T);             // [rows, end]
      E* sb = operand_rows(s, b.sb, block * rep * T);  // [rows, end]
      float* o = b.rows.get(block * rep * d);          // [rows, d]
      // Each document of the row as a sequence of its own: rows and keys from its start a.
      for (const DocumentSpan& doc : row_documents(row_starts(starts, i / kv, T), T)) {
        const int64_t a = doc.start, L = doc.length;
        const E *qa = q_i + a * rep * d, *ka = k_i + a * d, *va = v_i + a * d;
        float* sta = st_i + a * rep * 2;
        for (int64_t t0 = 0; t0 < L; t0 += block) {
          const int64_t end = std::min(L, t0 + block), r0 = t0 * rep, rows = (end - t0) * rep;
          gemm_rows('N', 'T', rows, end, d, qa + r0 * d, d, ka, d, s, end);  // q @ k^T
          softmax_rows(s, sb, end, r0, r0 + rows, rep, end, scale, sta + r0 * 2);
          gemm_rows('N', 'N', rows, d, end, sb, end, va, d, o, d);
          sl.put_q_rows(i, a + t0, a + end, o, out.data_ptr<float>());
        }
      }
    });
    ctx->save_for_backward({qb, kb, vb, stats});
    ctx->saved_data["B"] = B;
    ctx->saved_data["rep"] = rep;
    ctx->saved_data["block"] = block;
    ctx->saved_data["starts"] = starts;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const StepScope part(StepPart::attention);
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &qb = saved[0], &kb = saved[1], &vb = saved[2], &stats = saved[3];
    const int64_t B = ctx->saved_data["B"].toInt(), rep = ctx->saved_data["rep"].toInt(),
                  block = ctx->saved_data["block"].toInt();
    const torch::Tensor starts = ctx->saved_data["starts"].toTensor();
    const int64_t n = qb.size(0), M = qb.size(1), d = qb.size(2), T = kb.size(1), kv = n / B;
    const Slices sl{B, T, kv, rep, d};
    const torch::Tensor go = grad_out[0].contiguous();  // [B, T, h * d]
    const auto f32 = stats.options();
    torch::Tensor gq = torch::empty({B, T, kv * rep, d}, f32),
                  gk = torch::zeros({B, T, kv, d}, f32), gv = torch::zeros({B, T, kv, d}, f32);
    const auto scale = static_cast<float>(std::sqrt(static_cast<double>(d)));
    run_blas_tasks(n, [&](int64_t i) {
      const E *q_i = operands<E>(qb) + i * M * d, *k_i = operands<E>(kb) + i * T * d,
              *v_i = operands<E>(vb) + i * T * d;
      const float* st_i = stats.data_ptr<float>() + i * M * 2;
      BlockBuffers<E>& b = buffers<E>;
      float* s = b.s.get(block * rep * T);                // [rows, end]
      float* dp = b.dp.get(block * rep * T);              // [rows, end]
      float* part = b.part.get(T * d);                    // [end, d]
      float* dq = b.rows.get(block * rep * d);            // [rows, d]
      E* pb = operand_rows(s, b.sb, block * rep * T);     // [rows, end]
      E* dsb = operand_rows(dp, b.dsb, block * rep * T);  // [rows, end]
      E* go_i = b.go.get(M * d);                          // [M, d] the slice's rows
      sl.q_rows(i, go.data_ptr<float>(), go_i);
      for (const DocumentSpan& doc : row_documents(row_starts(starts, i / kv, T), T)) {
        const int64_t a = doc.start, L = doc.length;
        const E *qa = q_i + a * rep * d, *ka = k_i + a * d, *va = v_i + a * d,
                *goa = go_i + a * rep * d;
        const float* sta = st_i + a * rep * 2;
        for (int64_t t0 = 0; t0 < L; t0 += block) {
          const int64_t end = std::min(L, t0 + block), r0 = t0 * rep, rows = (end - t0) * rep;
          // s = q @ k^T again, dp = go @ v^T; then p, pb and ds.
          gemm_rows('N', 'T', rows, end, d, qa + r0 * d, d, ka, d, s, end);
          gemm_rows('N', 'T', rows, end, d, goa + r0 * d, d, va, d, dp, end);
          softmax_backward_rows(s, pb, dp, dsb, end, r0, r0 + rows, rep, end, scale, sta + r0 * 2);
          // gv[:end] += pb^T @ go; gq = ds @ k; gk[:end] += ds^T @ q (the document's keys).
          gemm_rows('T', 'N', end, d, rows, pb, end, goa + r0 * d, d, part, d);
          sl.add_kv_rows(i, a, end, part, gv.data_ptr<float>());
          gemm_rows('N', 'N', rows, d, end, dsb, end, ka, d, dq, d);
          sl.put_q_rows(i, a + t0, a + end, dq, gq.data_ptr<float>());
          gemm_rows('T', 'N', end, d, rows, dsb, end, qa + r0 * d, d, part, d);
          sl.add_kv_rows(i, a, end, part, gk.data_ptr<float>());
        }
      }
    });
    return {gq, gk, gv, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor causal_attention_node(const torch::Tensor& q, const torch::Tensor& k,
                                    const torch::Tensor& v, int64_t block, Precision precision,
                                    const torch::Tensor& starts) {
  // An autograd function's tensor arguments must be defined: no starts is an empty one.
  const torch::Tensor s = starts.defined() ? starts.contiguous() : torch::empty({0}, torch::kLong);
  if (precision == Precision::bf16)
    return CausalAttentionFused<uint16_t>::apply(q.contiguous(), k.contiguous(), v.contiguous(),
                                                 block, s);
  return CausalAttentionFused<float>::apply(q.contiguous(), k.contiguous(), v.contiguous(), block,
                                            s);
}

}  // namespace minimind
