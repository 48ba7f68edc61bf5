// The one home of the model's matrix products below autograd: which library runs them
// (OpenBLAS through ATen, or oneDNN), in which precision, on how many cores.
//
// fp32 products run on the library the compute plan chose (compute_plan.h; run.matmul "auto"
// decides from the CPU's instruction sets, never from a timing: auto_matmul). bf16 products round
// both inputs to bfloat16 and run on oneDNN's matmul with an fp32 destination: every sum
// accumulates in fp32, and the result is fp32 (PyTorch's autocast rounds it to bf16 as well;
// docs/precision.md).
//
// Cores: OpenBLAS splits its own products over the cores it has. For oneDNN this file splits
// a product's output rows (or columns) over the same cores (run_blas_tasks), each part on one
// thread, because torch's OpenMP pool, which oneDNN would use, has one thread by the tool's
// thread policy (compute_plan.h). Inside a task (an expert, a shard) a product runs on its
// task's core.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "minimind/choices.h"
#include "minimind/util/matmul_peak.h"
#include "minimind/util/products.h"
#include "minimind/util/step_part.h"

namespace minimind {

// Throws ConfigError (naming run.precision, the CPU and what emulation costs) when `cpu`
// has no bf16 instructions, unless `bf16_emulation`.
void check_bf16_cpu(const CpuFeatures& cpu, bool bf16_emulation);

// What run.matmul auto means on a CPU: oneDNN where it has AVX2 (every AVX-512 CPU has),
// OpenBLAS on an older one. A rule on what does not change between runs, never a timing: a
// start-up probe of both libraries picked by a few percent of noise on a busy machine, so
// two runs of one config computed different bits. The rule follows the bench presets' steps
// (on an AVX-512 CPU oneDNN 9-20 % faster than OpenBLAS's own AVX-512 kernels, about 2x its
// Haswell ones; on an AVX2 CPU as fast on four presets, 9-20 % faster on moe-e64k16;
// docs/performance.md, "Which library").
MatmulBackend auto_matmul(const CpuFeatures& cpu);

// c [M, N] = a [M, K] @ b [K, N] as `products` say (for float32 tensors; float64 ones take
// ATen's product). a and b may be transposed views; c must have unit column stride. bf16
// inputs may be passed already rounded (dtype bfloat16).
void matmul_into(torch::Tensor c, const torch::Tensor& a, const torch::Tensor& b,
                 const Products& products);
torch::Tensor matmul(const torch::Tensor& a, const torch::Tensor& b, const Products& products);

// c [M, N] (row stride ldc) = op(a) [M, K] @ op(b) [K, N] in bf16 with fp32 sums and output,
// on raw arrays of bfloat16 bits: trans 'N' (op(x)'s rows at stride ld) or 'T' (op(x) is
// the transpose of a row-major matrix with row stride ld). For buffers a task owns (an
// expert's products), without a tensor per operand; split over the cores as matmul_into is.
void gemm_bf16_rows(char ta, char tb, int64_t M, int64_t N, int64_t K, const uint16_t* a,
                    int64_t lda, const uint16_t* b, int64_t ldb, float* c, int64_t ldc);

// gemm_bf16_rows in fp32 on oneDNN's sgemm: for fp32 training's nodes whose products leave
// ATen (run.matmul onednn), on buffers a task owns.
void gemm_f32_rows(char ta, char tb, int64_t M, int64_t N, int64_t K, const float* a, int64_t lda,
                   const float* b, int64_t ldb, float* c, int64_t ldc);

// The two above by their operands' type, for nodes written once for both precisions.
inline void gemm_rows(char ta, char tb, int64_t M, int64_t N, int64_t K, const uint16_t* a,
                      int64_t lda, const uint16_t* b, int64_t ldb, float* c, int64_t ldc) {
  gemm_bf16_rows(ta, tb, M, N, K, a, lda, b, ldb, c, ldc);
}
inline void gemm_rows(char ta, char tb, int64_t M, int64_t N, int64_t K, const float* a,
                      int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc) {
  gemm_f32_rows(ta, tb, M, N, K, a, lda, b, ldb, c, ldc);
}

// c [n, M, N] = a [n, M, K] @ b [n, K, N], the n products spread over the cores.
torch::Tensor batched_matmul(const torch::Tensor& a, const torch::Tensor& b,
                             const Products& products);

// x rounded to bfloat16 (as is if it already is). A parameter's copy is kept until the
// parameter changes (its version counter moves: an optimizer step) or is freed, so a step
// rounds each weight once.
torch::Tensor to_bf16(const torch::Tensor& x, bool parameter = false);
// Hands to_bf16 the copy of x that an op rounded as it wrote x (bf16 training's RMSNorm):
// to_bf16 of x, or of a contiguous reshape of it, then returns that copy while x is
// unchanged. copy must equal x rounded element by element.
void remember_bf16(const torch::Tensor& x, const torch::Tensor& copy);
// The parameters [r_i, C] float32 stacked along their rows and rounded to bfloat16:
// [sum r_i, C], kept until one of them changes or is freed (an expert's gate and up
// weights, for one product over both).
torch::Tensor to_bf16_cat(const std::vector<torch::Tensor>& parameters);

// x as the operands of products in `precision` (bf16 or fp32 on oneDNN), for nodes written
// once for both: to_bf16(x, parameter) in bf16, x itself (contiguous) in fp32. The _cat form:
// to_bf16_cat's kept copy in bf16, in fp32 the parameters stacked anew (no copy is kept: a
// parameter's own floats change in place at each optimizer step).
torch::Tensor to_operand(const torch::Tensor& x, Precision precision, bool parameter = false);
torch::Tensor to_operand_cat(const std::vector<torch::Tensor>& parameters, Precision precision);

// For an optimizer that updates a parameter p through its pointer: where the rounded copy
// that to_bf16 or to_bf16_cat keeps of p holds p's numel() values, so that the update writes
// them (bf16_bits of each new value) as it writes p, instead of the next step rounding p
// again; nullptr when there is no such copy or something besides the cache holds it (a graph
// that saved it, which must keep its numbers). Once written, bf16_copy_written(p) makes the
// copy current for p's new version.
uint16_t* bf16_copy_rows(const torch::Tensor& p);
void bf16_copy_written(const torch::Tensor& p);

// x rounded to the nearest bfloat16, ties to even, NaN to the quiet NaN: c10::BFloat16's
// rounding bit for bit, inline so that the loops calling it vectorise.
inline uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : rounded);
}

// x as a product's operand of element type E: bf16 bits (rounded) or float (as is), for
// nodes written once for both precisions. Always inlined: GCC does not inline a plain inline
// function into the loops compiled under other options (util/cpu_clones.h), and a call per
// element took the fp32 attention from 32 to 51 ms a step.
template <typename E>
__attribute__((always_inline)) inline E as_operand(float x) {
  if constexpr (std::is_same_v<E, float>)
    return x;
  else
    return bf16_bits(x);
}

// The precision of products on E operands, and the dtype of a tensor holding them.
template <typename E>
constexpr Precision operand_precision =
    std::is_same_v<E, float> ? Precision::fp32 : Precision::bf16;
template <typename E>
constexpr c10::ScalarType operand_dtype =
    std::is_same_v<E, float> ? torch::kFloat32 : torch::kBFloat16;

// dst[i] = bf16_bits(src[i]), i < n, on the calling thread: for a task's own buffers.
void round_to_bf16(const float* src, uint16_t* dst, int64_t n);

// Whether bf16 products run on oneDNN's bf16 GEMM, which oneDNN 2.6 has for AVX-512 CPUs
// only. Without it (a CPU without AVX-512, under run.bf16_emulation) a bf16 product is an
// fp32 GEMM of the rounded inputs: the same numbers up to the order of fp32 sums.
// force_bf16_gemm_fallback(true) takes that route on any CPU (for tests).
bool bf16_gemm_native();
void force_bf16_gemm_fallback(bool on);

// ---- The products some work ran, by shape: minimind-bench --breakdown times each again
// alone to show how far a step's products are from their own speed. Only the oneDNN
// products above are seen (fp32 on OpenBLAS runs inside ATen).

// One product as a core ran it: the part of the step it ran in (util/step_part.h), its
// kernel's precision, and op(a) [m, k] @ op(b) [k, n] with trans ta, tb as gemm_rows takes
// them. A product split over the cores is one shape per core's part.
struct ProductShape {
  StepPart part = StepPart::step;
  Precision precision = Precision::fp32;
  char ta = 'N', tb = 'N';
  int64_t m = 0, n = 0, k = 0;
  double flops() const { return 2.0 * double(m) * double(n) * double(k); }
  auto key() const { return std::tie(part, precision, ta, tb, m, n, k); }
  bool operator<(const ProductShape& o) const { return key() < o.key(); }
  bool operator==(const ProductShape& o) const { return key() == o.key(); }
};

// A shape's products as a ProductLog saw them: how many ran, and the seconds they took in
// the kernel, each call timed on its core and the times added.
struct ProductTally {
  int64_t count = 0;
  double seconds = 0;
};

// While one lives, every product the kernels run is counted and timed by shape, from any
// thread. One at a time.
class ProductLog {
 public:
  ProductLog();
  ~ProductLog();
  ProductLog(const ProductLog&) = delete;
  ProductLog& operator=(const ProductLog&) = delete;
  std::map<ProductShape, ProductTally> tallies() const;
  std::map<ProductShape, int64_t> counts() const;  // the tallies' counts
};

// Seconds one product of `shape` takes alone on the calling thread's core, its operands
// packed and in cache (the best of a few runs after a first): what its kernel can do.
double time_product_alone(const ProductShape& shape);

}  // namespace minimind
