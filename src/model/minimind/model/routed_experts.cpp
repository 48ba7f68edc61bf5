#include "minimind/model/routed_experts.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>

#include "minimind/util/blas_tasks.h"
#include "minimind/util/cpu_clones.h"
#include "minimind/util/matmul.h"

namespace minimind {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// d/dg = (ga * u) * s * (1 + g * (1 - s)) with s = sigmoid(g) (SiluBackward's formula),
// d/du = ga * silu(g), in one pass over the rows (three passes and a temporary as ATen ops);
// g, u, dg, du are column ranges of [M, 2I] buffers. No fused multiply-adds.
MINIMIND_NO_FMA_BEGIN
MINIMIND_CPU_CLONES void swiglu_backward_rows(const float* __restrict ga, const float* __restrict g,
                                              const float* __restrict u,
                                              const float* __restrict sig,
                                              const float* __restrict silu_g, float* __restrict dg,
                                              float* __restrict du, int64_t M, int64_t I,
                                              int64_t stride) {
  for (int64_t m = 0; m < M; ++m) {
    const float *ga_m = ga + m * I, *s_m = sig + m * I, *silu_m = silu_g + m * I;
    const float *g_m = g + m * stride, *u_m = u + m * stride;
    float *dg_m = dg + m * stride, *du_m = du + m * stride;
    for (int64_t i = 0; i < I; ++i) {
      const float t = ga_m[i] * u_m[i];
      dg_m[i] = t * s_m[i] * (1.0f + g_m[i] * (1.0f - s_m[i]));
      du_m[i] = ga_m[i] * silu_m[i];
    }
  }
}
MINIMIND_NO_FMA_END

// ga, silu_g: [M, I]; g, u, dg, du: [M, I] views with a row stride (columns of gu / dgu).
void swiglu_backward(const torch::Tensor& ga, const torch::Tensor& g, const torch::Tensor& u,
                     const torch::Tensor& silu_g, torch::Tensor& dg, torch::Tensor& du) {
  const bool fused = ga.scalar_type() == torch::kFloat32 && ga.is_contiguous() &&
                     silu_g.is_contiguous() && g.stride(1) == 1 && u.stride(1) == 1 &&
                     dg.stride(1) == 1 && du.stride(1) == 1 && g.stride(0) == u.stride(0) &&
                     g.stride(0) == dg.stride(0) && g.stride(0) == du.stride(0);
  if (!fused) {  // float64 experts (the fp64 tests): ATen's ops
    at::silu_backward_out(dg, ga * u, g);
    at::mul_out(du, ga, silu_g);
    return;
  }
  const torch::Tensor sig = torch::sigmoid(g);  // [M, I] contiguous
  swiglu_backward_rows(ga.data_ptr<float>(), g.data_ptr<float>(), u.data_ptr<float>(),
                       sig.data_ptr<float>(), silu_g.data_ptr<float>(), dg.data_ptr<float>(),
                       du.data_ptr<float>(), ga.size(0), ga.size(1), g.stride(0));
}

MINIMIND_NO_FMA_BEGIN
// a [m, I] = s [m, I] * u [m, I] (row stride ld) rounded to bfloat16: the bf16 forward's
// SwiGLU product, in one pass.
MINIMIND_CPU_CLONES void mul_rounded(const float* __restrict s, const float* __restrict u,
                                     int64_t ld, uint16_t* __restrict a, int64_t m, int64_t I) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < I; ++j) {
      a[i * I + j] = bf16_bits(s[i * I + j] * u[i * ld + j]);
    }
}
MINIMIND_NO_FMA_END

// The rows of each token, in the order the plain form adds them (ascending assignment):
// rows[start[n] .. start[n + 1]) for token n. token: [M] int64 contiguous.
struct TokenRows {
  std::vector<int64_t> start, rows;
};

TokenRows rows_of_tokens(const torch::Tensor& token, int64_t N) {
  const int64_t* t = token.data_ptr<int64_t>();
  const int64_t M = token.numel();
  TokenRows r{std::vector<int64_t>(N + 1, 0), std::vector<int64_t>(M)};
  for (int64_t i = 0; i < M; ++i) {
    TORCH_CHECK(t[i] >= 0 && t[i] < N, "routed_experts: token ", t[i], " outside [0, ", N, ")");
    ++r.start[t[i] + 1];
  }
  for (int64_t n = 0; n < N; ++n) r.start[n + 1] += r.start[n];
  std::vector<int64_t> fill(r.start.begin(), r.start.end() - 1);
  for (int64_t i = 0; i < M; ++i) r.rows[fill[t[i]]++] = i;
  return r;
}

MINIMIND_NO_FMA_BEGIN
// o[h] += s[h] * (*w) (the product rounded first), or o[h] += s[h] without w.
template <typename T>
inline void add_row(T* __restrict o, const T* __restrict s, const T* w, int64_t H) {
  if (w) {
    const T wi = *w;
    for (int64_t h = 0; h < H; ++h) o[h] += s[h] * wi;
  } else {
    for (int64_t h = 0; h < H; ++h) o[h] += s[h];
  }
}

// out[n] = 0 + src[i0] * w[i0] + src[i1] * w[i1] + ..., over token n's rows in order, for
// n in [n0, n1): index_add of the rows (times w, rounded first, when w is given) into zeros.
template <typename T>
MINIMIND_CPU_CLONES void sum_rows_per_token(const T* __restrict src, const T* __restrict w,
                                            const TokenRows& r, T* __restrict out, int64_t n0,
                                            int64_t n1, int64_t H) {
  for (int64_t n = n0; n < n1; ++n) {
    T* o = out + n * H;
    for (int64_t h = 0; h < H; ++h) o[h] = T(0);
    for (int64_t j = r.start[n]; j < r.start[n + 1]; ++j) {
      const int64_t i = r.rows[j];
      add_row(o, src + i * H, w ? w + i : nullptr, H);
    }
  }
}
MINIMIND_NO_FMA_END

// y = the per-token sums of src's rows (times w if defined): [N, H], split among the cores.
torch::Tensor sum_per_token(const torch::Tensor& src, const torch::Tensor& w, const TokenRows& r,
                            int64_t N) {
  const int64_t H = src.size(1);
  torch::Tensor out = torch::empty({N, H}, src.options());
  constexpr int64_t kChunks = 8;  // a few per core, so an uneven chunk does not hold one back
  AT_DISPATCH_FLOATING_TYPES(src.scalar_type(), "sum_per_token", [&] {
    const scalar_t* wp = w.defined() ? w.data_ptr<scalar_t>() : nullptr;
    run_blas_tasks(kChunks, [&](int64_t c) {
      sum_rows_per_token<scalar_t>(src.data_ptr<scalar_t>(), wp, r, out.data_ptr<scalar_t>(),
                                   N * c / kChunks, N * (c + 1) / kChunks, H);
    });
  });
  return out;
}

MINIMIND_NO_FMA_BEGIN
// out[tok[i]] += src[i] (* w[i], rounded first), i = 0 .. m - 1: one expert's rows added into
// its tokens. Called for the experts in ascending order on zeroed `out`, this is
// sum_rows_per_token's sum, bit for bit, while the expert's rows are still in cache.
template <typename T>
MINIMIND_CPU_CLONES void add_rows_to_tokens(const T* __restrict src, const T* __restrict w,
                                            const int64_t* __restrict tok, int64_t m,
                                            T* __restrict out, int64_t H) {
  for (int64_t i = 0; i < m; ++i) add_row(out + tok[i] * H, src + i * H, w ? w + i : nullptr, H);
}
MINIMIND_NO_FMA_END

// out [N, H] += the rows of src [m, H] (times w[off ..] if w is defined) at the tokens
// tok [m]. (w whole and an offset: a narrow view of a tensor that requires grad costs an
// autograd record, per expert.)
void add_to_tokens(const torch::Tensor& src, const torch::Tensor& w, int64_t off,
                   const int64_t* tok, torch::Tensor& out) {
  AT_DISPATCH_FLOATING_TYPES(src.scalar_type(), "add_to_tokens", [&] {
    add_rows_to_tokens<scalar_t>(src.data_ptr<scalar_t>(),
                                 w.defined() ? w.data_ptr<scalar_t>() + off : nullptr, tok,
                                 src.size(0), out.data_ptr<scalar_t>(), src.size(1));
  });
}

// A [rows, cols] tensor of `type` over a buffer this thread keeps for its next experts (an
// expert's gathered rows and temporaries: ATen's allocations for them were a large part of a
// small expert's time). One buffer per slot; valid until the thread's next use of the slot.
enum Slot { kRows, kGradRows, kOut, kTemp, kRounded, kGa, kDgu, kSlots };
torch::Tensor scratch(Slot slot, int64_t rows, int64_t cols, torch::ScalarType type) {
  struct Buffer {
    void* data = nullptr;
    size_t bytes = 0;
    ~Buffer() { std::free(data); }
  };
  thread_local std::array<Buffer, kSlots> buffers;
  Buffer& b = buffers[slot];
  const size_t need = static_cast<size_t>(rows * cols) * c10::elementSize(type);
  if (b.bytes < need) {
    std::free(b.data);
    b.bytes = (need + 63) / 64 * 64;
    b.data = std::aligned_alloc(64, b.bytes);  // whole cache lines, as oneDNN prefers
    TORCH_CHECK(b.data, "routed_experts: out of memory for ", b.bytes, " bytes of scratch");
  }
  return torch::from_blob(b.data, {rows, cols}, torch::TensorOptions().dtype(type));
}

// dst [m, C] = the rows tok[0 .. m) of src [*, C] (both contiguous): index_select without
// its allocation.
void gather_rows(const torch::Tensor& src, const int64_t* tok, torch::Tensor& dst) {
  const size_t row = static_cast<size_t>(src.size(1)) * src.element_size();
  const auto* s = static_cast<const uint8_t*>(src.data_ptr());
  auto* d = static_cast<uint8_t*>(dst.data_ptr());
  for (int64_t i = 0; i < dst.size(0); ++i)
    std::memcpy(d + static_cast<size_t>(i) * row, s + static_cast<size_t>(tok[i]) * row, row);
}

// The experts with rows in the order run_blas_tasks takes them: ascending when the tasks
// run one after another (each then adds its rows into the tokens in the plain form's order),
// else most rows first, so the long tasks start early and the short ones fill in at the end.
std::vector<int64_t> expert_order(const std::vector<int64_t>& counts, bool serial) {
  std::vector<int64_t> order;
  for (int64_t e = 0; e < static_cast<int64_t>(counts.size()); ++e)
    if (counts[e] > 0) order.push_back(e);
  if (!serial)
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return counts[a] > counts[b]; });
  return order;
}

// Whether experts of width I run side by side, one core each (run_blas_tasks), or one
// after another with OpenBLAS splitting each GEMM over the cores. Narrow experts' GEMMs
// split badly; wide ones split well, and side by side they ran slower here (two one-thread
// GEMMs on this machine's two cores share more than OpenBLAS's two threads do). Measured
// with scripts/bench-experts.sh on 2 cores: E = 32 (width 104) and E = 64 (width 52) ~10 %
// faster side by side, E = 16 (208) no clear difference, E = 4 (832) 10-25 % slower.
constexpr int64_t kSideBySideMaxWidth = 128;
bool side_by_side(int64_t I) {
  return I <= kSideBySideMaxWidth;
}

// Each expert's first row.
std::vector<int64_t> row_offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> off(counts.size(), 0);
  for (size_t e = 1; e < counts.size(); ++e) off[e] = off[e - 1] + counts[e - 1];
  return off;
}

// The products' operands in `p`: bf16 rounds x (and the experts' weights, kept rounded until
// the optimizer changes them) once per call, not once per product.
torch::Tensor operand(const torch::Tensor& t, Precision p, bool parameter = false) {
  return p == Precision::bf16 ? to_bf16(t, parameter) : t;
}

// An expert's product operand [m, C] in `p`: itself, or rounded into this thread's buffer.
torch::Tensor rows_operand(const torch::Tensor& rows, Precision p) {
  if (p != Precision::bf16) return rows;
  torch::Tensor r = scratch(kRounded, rows.size(0), rows.size(1), torch::kBFloat16);
  const torch::Tensor src = rows.contiguous();
  round_to_bf16(src.data_ptr<float>(), static_cast<uint16_t*>(r.data_ptr()), src.numel());
  return r;
}

MINIMIND_NO_FMA_BEGIN
// One expert's rows of the weighted sum's backward in bf16, in one pass: gweight[i] =
// gy[tok[i]] . ys[i] (the routing weight's gradient) and gyw[i] = w[i] * gy[tok[i]] rounded
// (the gradient the down projection receives).
MINIMIND_CPU_CLONES void weighted_grad_rows(const float* __restrict gy, const float* __restrict ys,
                                            const float* __restrict w,
                                            const int64_t* __restrict tok, int64_t m, int64_t H,
                                            float* __restrict gweight, uint16_t* __restrict gyw) {
  // The dot product in kLanes partial sums, added up in a fixed order at the end: one sum
  // would be a chain of dependent additions the compiler may not vectorise.
  constexpr int64_t kLanes = 16;
  for (int64_t i = 0; i < m; ++i) {
    const float* g = gy + tok[i] * H;
    const float* y = ys + i * H;
    float lanes[kLanes] = {};
    int64_t h = 0;
    for (; h + kLanes <= H; h += kLanes)
      for (int64_t j = 0; j < kLanes; ++j) lanes[j] += g[h + j] * y[h + j];
    float dot = 0;
    for (; h < H; ++h) dot += g[h] * y[h];
    for (int64_t j = 0; j < kLanes; ++j) dot += lanes[j];
    for (h = 0; h < H; ++h) gyw[i * H + h] = bf16_bits(g[h] * w[i]);
    gweight[i] = dot;
  }
}
MINIMIND_NO_FMA_END

// Inputs: x, the routing weights, then per expert gate_proj, up_proj, down_proj weights
// ([I, H], [I, H], [H, I]); the tokens, counts and precision ride along as constants.
// Products run in the precision (util/matmul.h); the SwiGLU, the weighted sum and the
// routing weight's gradient stay fp32.
// bf16 keeps a rounded (only products read it), stacks each expert's gate and up weights
// so that one product gives [g | u] and one the input gradient (a sum over 2I rather than two
// over I then added: the scheme up to the order of fp32 sums), and computes the weighted
// sum's backward in one pass.
struct RoutedSwiGLU : torch::autograd::Function<RoutedSwiGLU> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x_in,
                               const torch::Tensor& weight, const torch::Tensor& token,
                               std::vector<int64_t> counts, int64_t precision,
                               at::TensorList weights_in) {
    const auto p = static_cast<Precision>(precision);
    const bool bf16 = p == Precision::bf16;
    const torch::Tensor x = operand(x_in, p);  // [N, H]
    variable_list weights = weights_in.vec();
    const int64_t N = x.size(0), H = x.size(1), M = token.size(0), I = weights[0].size(0);
    // bf16: each expert's gate and up weights as one [2I, H] copy, for one product over both
    // forward and one backward (at 3 * e and 3 * e + 1); the down weight rounded alone.
    for (size_t e = 0; 3 * e < weights.size(); ++e) {
      if (bf16) {
        weights[3 * e] = weights[3 * e + 1] = to_bf16_cat({weights[3 * e], weights[3 * e + 1]});
      }
      weights[3 * e + 2] = operand(weights[3 * e + 2], p, true);
    }
    const std::vector<int64_t> first = row_offsets(counts);
    // gu = [g | u]: gate and up projections side by side, so the backward gets both weights'
    // gradients from one GEMM over dgu = [d/dg | d/du].
    const auto opts = weight.options();                 // fp32 (float64 in the fp64 tests)
    torch::Tensor gu = torch::empty({M, 2 * I}, opts);  // [M, 2I]
    torch::Tensor silu_g = torch::empty({M, I}, opts);  // [M, I], kept for the backward
    torch::Tensor a =
        torch::empty({M, I}, bf16 ? opts.dtype(torch::kBFloat16) : opts);  // silu(g) * u
    // Tasks one after another add their rows into y as they go; side by side, y is summed
    // over the tokens afterwards (the same bits).
    const bool serial = blas_tasks_serial(side_by_side(I));
    torch::Tensor y = serial ? torch::zeros({N, H}, opts) : torch::Tensor();  // [N, H]
    torch::Tensor ys = torch::empty({M, H}, opts);  // [M, H] each row's expert output
    const int64_t* tokens = token.data_ptr<int64_t>();
    run_blas_tasks(
        expert_order(counts, serial),
        [&](int64_t e) {
          const int64_t off = first[e], m = counts[e];
          torch::Tensor xe = scratch(kRows, m, H, x.scalar_type());  // [m, H]
          gather_rows(x, tokens + off, xe);
          const torch::Tensor rows = gu.narrow(0, off, m);
          const torch::Tensor g = rows.narrow(1, 0, I), u = rows.narrow(1, I, I);  // [m, I] each
          if (bf16) {
            matmul_into(rows, xe, weights[3 * e].t(), p);  // [m, 2I] = [g | u]
          } else {
            matmul_into(g, xe, weights[3 * e].t(), p);
            matmul_into(u, xe, weights[3 * e + 1].t(), p);
          }
          torch::Tensor s = silu_g.narrow(0, off, m), a_e = a.narrow(0, off, m);
          at::silu_out(s, g);
          if (bf16) {
            mul_rounded(s.data_ptr<float>(), u.data_ptr<float>(), u.stride(0),
                        static_cast<uint16_t*>(a_e.data_ptr()), m, I);
          } else {
            at::mul_out(a_e, s, u);
          }
          torch::Tensor ys_e = ys.narrow(0, off, m);  // [m, H]
          matmul_into(ys_e, a_e, weights[3 * e + 2].t(), p);
          if (serial) add_to_tokens(ys_e, weight, off, tokens + off, y);
        },
        side_by_side(I));
    if (!serial) y = sum_per_token(ys, weight, rows_of_tokens(token, N), N);
    ctx->save_for_backward({x, weight, gu, a, silu_g, ys});
    ctx->saved_data["token"] = token;
    ctx->saved_data["counts"] = counts;
    ctx->saved_data["precision"] = precision;
    ctx->saved_data["weights"] = weights;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &weight = saved[1], &gu = saved[2], &a = saved[3],
                        &silu_g = saved[4], &ys = saved[5];
    const torch::Tensor token = ctx->saved_data["token"].toTensor();
    const std::vector<int64_t> counts = ctx->saved_data["counts"].toIntVector();
    const variable_list weights = ctx->saved_data["weights"].toTensorVector();
    const auto p = static_cast<Precision>(ctx->saved_data["precision"].toInt());
    const bool bf16 = p == Precision::bf16;
    const torch::Tensor gy = grad_out[0].contiguous();  // [N, H]
    const int64_t N = x.size(0), H = gy.size(1), E = static_cast<int64_t>(counts.size()),
                  I = a.size(1);
    const std::vector<int64_t> first = row_offsets(counts);
    variable_list gw(3 * E);
    for (int64_t e = 0; e < E; ++e)
      if (counts[e] == 0)  // an idle expert: zero gradients, as MiniMind's 0 * sum(params)
        for (int j = 0; j < 3; ++j)
          gw[3 * e + j] =
              torch::zeros(j == 2 ? weights[3 * e + 2].sizes() : c10::IntArrayRef{I, x.size(1)},
                           weight.options());
    const auto type = gy.scalar_type();
    torch::Tensor gweight = torch::empty_like(weight);  // [M]
    // The input gradient: added into gx as the tasks go when they run one after another,
    // else each row's kept in gxs [M, H] and summed over the tokens afterwards.
    const bool serial = blas_tasks_serial(side_by_side(I));
    torch::Tensor gx = serial ? torch::zeros_like(gy) : torch::Tensor();  // [N, H]
    torch::Tensor gxs = serial ? torch::Tensor() : torch::empty({weight.size(0), H}, gy.options());
    const int64_t* tokens = token.data_ptr<int64_t>();
    run_blas_tasks(
        expert_order(counts, serial),
        [&](int64_t e) {
          const int64_t off = first[e], m = counts[e];
          const torch::Tensor a_e = a.narrow(0, off, m);
          torch::Tensor gweight_e = gweight.narrow(0, off, m);  // [m]
          torch::Tensor ga_e = scratch(kGa, m, I, type);        // [m, I] d/da
          // The weighted sum's backward: each row gets its token's gradient (gy_e), the
          // routing weight gy_e . ys_i, and the expert output gy_e * w_i (as MulBackward).
          torch::Tensor gy_p;  // [m, H] gy_e * w in the products' precision
          if (bf16) {
            gy_p = scratch(kGradRows, m, H, torch::kBFloat16);
            weighted_grad_rows(gy.data_ptr<float>(), ys.data_ptr<float>() + off * H,
                               weight.data_ptr<float>() + off, tokens + off, m, H,
                               gweight_e.data_ptr<float>(),
                               static_cast<uint16_t*>(gy_p.data_ptr()));
          } else {
            torch::Tensor gy_e = scratch(kGradRows, m, H, type);
            gather_rows(gy, tokens + off, gy_e);
            torch::Tensor prod = scratch(kTemp, m, H, type);
            at::sum_out(gweight_e, at::mul_out(prod, gy_e, ys.narrow(0, off, m)), {1});
            gy_e.mul_(weight.narrow(0, off, m).unsqueeze(1));
            gy_p = gy_e;
          }
          // Through down_proj: d/da = gy_e @ W_down, d/dW_down = gy_e^T @ a_e (MmBackward's).
          matmul_into(ga_e, gy_p, weights[3 * e + 2], p);
          gw[3 * e + 2] = matmul(gy_p.t(), a_e, p);
          // Through a = silu(g) * u (as MulBackward and SiluBackward).
          const torch::Tensor rows = gu.narrow(0, off, m);
          torch::Tensor drows = scratch(kDgu, m, 2 * I, type);  // [m, 2I] = [d/dg | d/du]
          torch::Tensor dg = drows.narrow(1, 0, I), du = drows.narrow(1, I, I);
          swiglu_backward(ga_e, rows.narrow(1, 0, I), rows.narrow(1, I, I),
                          silu_g.narrow(0, off, m), dg, du);
          torch::Tensor xe = scratch(kRows, m, H, x.scalar_type());  // [m, H]
          gather_rows(x, tokens + off, xe);
          const torch::Tensor drows_p = rows_operand(drows, p);    // [m, 2I]
          const torch::Tensor gw_gu = matmul(drows_p.t(), xe, p);  // [2I, H]: both weights' grads
          gw[3 * e] = gw_gu.narrow(0, 0, I);
          gw[3 * e + 1] = gw_gu.narrow(0, I, I);
          // The row's two uses (gate and up) each give a gradient; they add up (a + b == b + a).
          // bf16 sums both in one product over [d/dg | d/du] and the stacked weights.
          torch::Tensor gx_e = serial ? scratch(kOut, m, H, type) : gxs.narrow(0, off, m);
          if (bf16) {
            matmul_into(gx_e, drows_p, weights[3 * e], p);
          } else {
            matmul_into(gx_e, drows_p.narrow(1, 0, I), weights[3 * e], p);
            torch::Tensor up = scratch(kTemp, m, H, type);
            matmul_into(up, drows_p.narrow(1, I, I), weights[3 * e + 1], p);
            gx_e.add_(up);
          }
          if (serial) add_to_tokens(gx_e, torch::Tensor(), 0, tokens + off, gx);
        },
        side_by_side(I));
    // The gather's backward: each token adds its rows' gradients in order (index_add).
    if (!serial) gx = sum_per_token(gxs, torch::Tensor(), rows_of_tokens(token, N), N);
    variable_list grads{gx, gweight, torch::Tensor(), torch::Tensor(), torch::Tensor()};
    grads.insert(grads.end(), gw.begin(), gw.end());
    return grads;
  }
};

}  // namespace

torch::Tensor routed_experts(const torch::Tensor& x, const torch::Tensor& token,
                             const torch::Tensor& weight, const std::vector<int64_t>& counts,
                             const std::vector<FeedForward>& experts) {
  TORCH_CHECK(x.dim() == 2 && token.dim() == 1 && weight.sizes() == token.sizes(),
              "routed_experts: x [N, H], token and weight [M]");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), "routed_experts: weight dtype ",
              weight.scalar_type(), " differs from x's ", x.scalar_type());
  const torch::Tensor tokens = token.to(torch::kLong).contiguous();
  TORCH_CHECK(tokens.numel() == 0 ||
                  (tokens.min().item<int64_t>() >= 0 && tokens.max().item<int64_t>() < x.size(0)),
              "routed_experts: a token outside [0, ", x.size(0), ")");
  variable_list weights;
  weights.reserve(3 * experts.size());
  for (const auto& ex : experts) {
    weights.push_back(ex->gate_proj->weight);
    weights.push_back(ex->up_proj->weight);
    weights.push_back(ex->down_proj->weight);
  }
  return RoutedSwiGLU::apply(x.contiguous(), weight.contiguous(), tokens, counts,
                             static_cast<int64_t>(product_settings().precision),
                             at::TensorList(weights));  // one input per weight
}

}  // namespace minimind
