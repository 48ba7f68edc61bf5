#include "minimind/util/matmul.h"

#include <ATen/Parallel.h>
#include <c10/util/intrusive_ptr.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <vector>

#include "minimind/error.h"
#include "minimind/util/blas_check.h"
#include "minimind/util/blas_tasks.h"
#include "minimind/util/cpu_clones.h"
#include "minimind/util/matmul_peak.h"
#include "minimind/util/step_part.h"
#include "minimind/util/stopwatch.h"

namespace minimind {

// A loop the compiler vectorises: ATen 1.13 converts one element at a time, which cost more
// than the bf16 products saved.
MINIMIND_CPU_CLONES void round_to_bf16(const float* __restrict src, uint16_t* __restrict dst,
                                       int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_bits(src[i]);
}

namespace {

// ProductLog's tallies: one at a time, kept here so that a kernel never sees a freed log.
struct ProductTallies {
  std::mutex mutex;
  std::map<ProductShape, ProductTally> tallies;
};
ProductTallies g_product_tallies;
std::atomic<bool> g_logging_products{false};

// Runs one product a kernel computes, run() -> its status, counted and timed when a
// ProductLog lives.
template <typename Run>
dnnl_status_t logged_product(Precision precision, char ta, char tb, int64_t m, int64_t n, int64_t k,
                             Run&& run) {
  if (!g_logging_products.load(std::memory_order_relaxed)) return run();
  const Stopwatch clock;
  const dnnl_status_t status = run();
  const double took = clock.seconds();
  const ProductShape shape{current_step_part(), precision, ta, tb, m, n, k};
  const std::lock_guard<std::mutex> lock(g_product_tallies.mutex);
  ProductTally& t = g_product_tallies.tallies[shape];
  ++t.count, t.seconds += took;
  return status;
}

// A 2-D operand as a row-major GEMM sees it: 'N' (rows at stride ld) or 'T' (the
// transpose of a row-major [cols, rows] matrix with row stride ld).
struct Layout {
  char trans;
  int64_t ld;
};

// t itself when one of its strides is 1 (and the other leaves room), else a contiguous copy.
torch::Tensor gemm_operand(const torch::Tensor& t, Layout& layout) {
  const int64_t r = t.size(0), c = t.size(1);
  if (r > 1 && c > 1) {
    if (t.stride(1) == 1 && t.stride(0) >= c) {
      layout = {'N', t.stride(0)};
      return t;
    }
    if (t.stride(0) == 1 && t.stride(1) >= r) {
      layout = {'T', t.stride(1)};
      return t;
    }
  }
  layout = {'N', std::max<int64_t>(c, 1)};  // a row or a column: its elements packed
  return t.contiguous();
}

// Element offset of row i (trans 'N': row i of op(A); 'T': column i of the stored matrix).
int64_t row_offset(const Layout& l, int64_t i) {
  return l.trans == 'N' ? i * l.ld : i;
}
int64_t col_offset(const Layout& l, int64_t j) {
  return l.trans == 'N' ? j : j * l.ld;
}

// Runs part(m0, m1, n0, n1) over a split of the [M, N] output among the cores OpenBLAS has
// (one part each; serial inside a task, where OpenBLAS has one). Rows are split, or columns
// when there are too few rows to share.
void split_output(int64_t M, int64_t N,
                  const std::function<void(int64_t, int64_t, int64_t, int64_t)>& part) {
  const int64_t threads = std::max(1, blas_threads());
  constexpr int64_t kMinPart = 32;  // rows (columns) per part below which a split costs more
  const bool by_rows = M >= kMinPart * threads || M >= N;
  const int64_t extent = by_rows ? M : N;
  const int64_t parts = std::min<int64_t>(threads, std::max<int64_t>(1, extent / kMinPart));
  if (parts <= 1) {
    at::internal::lazy_init_num_threads();  // oneDNN's OpenMP threads: torch's count
    part(0, M, 0, N);
    return;
  }
  run_blas_tasks(parts, [&](int64_t p) {
    at::internal::lazy_init_num_threads();  // a helper thread: torch's one thread, not all cores
    const int64_t lo = extent * p / parts, hi = extent * (p + 1) / parts;
    by_rows ? part(lo, hi, 0, N) : part(0, M, lo, hi);
  });
}

void sgemm_onednn(const Layout& la, const float* A, const Layout& lb, const float* B, float* C,
                  int64_t ldc, int64_t M, int64_t N, int64_t K) {
  split_output(M, N, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    const dnnl_status_t status =
        logged_product(Precision::fp32, la.trans, lb.trans, m1 - m0, n1 - n0, K, [&] {
          return dnnl_sgemm(la.trans, lb.trans, m1 - m0, n1 - n0, K, 1.0f, A + row_offset(la, m0),
                            la.ld, B + col_offset(lb, n0), lb.ld, 0.0f, C + m0 * ldc + n0, ldc);
        });
    TORCH_CHECK(status == dnnl_success, "dnnl_sgemm failed with status ", static_cast<int>(status));
  });
}

// ---- bf16: oneDNN's bf16 GEMM, row-major like dnnl_sgemm (bf16 inputs, fp32 sums and
// output). oneDNN 2.6 exports it (DNNL_API, for its own tests) but leaves it out of its
// public header, hence the declaration here; it is the gemm:jit kernel oneDNN's matmul
// primitive runs when every dimension is given at run time, which is what this file used
// before: that primitive made each call build memory objects and argument maps (about 20
// mallocs a product, contended between the shard threads' one arena), which cost a layer
// of 64 small experts more than its products.
extern "C" dnnl_status_t dnnl_gemm_bf16bf16f32(char transa, char transb, dnnl_dim_t M, dnnl_dim_t N,
                                               dnnl_dim_t K, float alpha, const uint16_t* A,
                                               dnnl_dim_t lda, const uint16_t* B, dnnl_dim_t ldb,
                                               float beta, float* C, dnnl_dim_t ldc);

// c [M, N] (unit column stride, row stride ldc) = a @ b, a and b bfloat16.
void gemm_bf16(const torch::Tensor& a, const torch::Tensor& b, torch::Tensor& c, int64_t ldc) {
  Layout la{}, lb{};
  const torch::Tensor ao = gemm_operand(a, la), bo = gemm_operand(b, lb);
  gemm_bf16_rows(la.trans, lb.trans, a.size(0), b.size(1), a.size(1),
                 static_cast<const uint16_t*>(ao.data_ptr()), la.ld,
                 static_cast<const uint16_t*>(bo.data_ptr()), lb.ld, c.data_ptr<float>(), ldc);
}

// A bf16 operand as fp32 values [rows, cols] packed (row stride cols), for the fallback.
std::vector<float> widened(const uint16_t* x, int64_t rows, int64_t cols, int64_t ld) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const uint32_t bits = static_cast<uint32_t>(x[i * ld + j]) << 16;
      std::memcpy(&out[static_cast<size_t>(i * cols + j)], &bits, sizeof(float));
    }
  return out;
}

// oneDNN 2.6 has its bf16 GEMM for AVX-512 CPUs only (elsewhere it returns unimplemented).
bool bf16_gemm_runs() {
  static const bool runs = [] {
    const uint16_t one = 0x3f80;  // 1.0 in bfloat16
    float c = 0;
    return dnnl_gemm_bf16bf16f32('N', 'N', 1, 1, 1, 1.0f, &one, 1, &one, 1, 0.0f, &c, 1) ==
               dnnl_success &&
           c == 1.0f;
  }();
  return runs;
}
std::atomic<bool> g_force_bf16_fallback{false};

// x [...] float32 -> bfloat16 of the same shape (contiguous), split over the cores.
torch::Tensor round_tensor_to_bf16(const torch::Tensor& x) {
  const torch::Tensor src = x.contiguous();
  torch::Tensor out = torch::empty(src.sizes(), src.options().dtype(torch::kBFloat16));
  const int64_t n = src.numel();
  const float* s = src.data_ptr<float>();
  auto* d = static_cast<uint16_t*>(out.data_ptr());
  constexpr int64_t kMinPart = int64_t{1} << 16;  // elements: smaller parts are not worth a thread
  const int64_t parts =
      std::min<int64_t>(std::max(1, blas_threads()), std::max<int64_t>(1, n / kMinPart));
  run_blas_tasks(parts, [&](int64_t p) {
    const int64_t lo = n * p / parts, hi = n * (p + 1) / parts;
    round_to_bf16(s + lo, d + lo, hi - lo);
  });
  return out;
}

}  // namespace

void check_bf16_cpu(const CpuFeatures& cpu, bool bf16_emulation) {
  if (!cpu.bf16() && !bf16_emulation) {
    std::ostringstream msg;
    msg << "config error: run.precision is bf16, but this CPU ("
        << (cpu.model.empty() ? "unknown model" : cpu.model) << "; " << cpu.flags()
        << ") has no bf16 instructions (avx512_bf16 or amx_bf16): oneDNN would emulate them, "
           "and bf16 products would run slower than fp32 ones instead of about twice as fast";
    throw ConfigError(msg.str(),
                      "train in fp32 (run.precision: fp32), or set run.bf16_emulation: true to "
                      "run bf16 anyway (to check numerics, not for speed)");
  }
}

MatmulBackend auto_matmul(const CpuFeatures& cpu) {
  return cpu.avx2 || cpu.avx512f ? MatmulBackend::onednn : MatmulBackend::openblas;
}

bool bf16_gemm_native() {
  return bf16_gemm_runs() && !g_force_bf16_fallback.load();
}

void force_bf16_gemm_fallback(bool on) {
  g_force_bf16_fallback = on;
}

namespace {

// Rounded copies of parameters (one, or several stacked along their rows), each kept with
// the parameters' version counters: valid until one of them moves (an optimizer step) or a
// parameter is freed. Keyed by the first parameter and the number of them.
class Bf16Copies {
 public:
  torch::Tensor get(const std::vector<torch::Tensor>& parts) {
    const Key key{parts[0].unsafeGetTensorImpl(), parts.size()};
    const std::vector<int64_t> versions = versions_of(parts);
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      auto it = copies_.find(key);
      if (it != copies_.end() && current(it->second, parts, versions)) return it->second.copy;
    }
    Copy c{{}, versions, rounded(parts)};
    for (const auto& p : parts) c.sources.emplace_back(p.getIntrusivePtr());
    const torch::Tensor copy = c.copy;
    const std::lock_guard<std::mutex> lock(mutex_);
    sweep();
    copies_[key] = std::move(c);
    int64_t offset = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      parts_[parts[i].unsafeGetTensorImpl()] = {key, i, offset};
      offset += parts[i].numel();
    }
    return copy;
  }

  // p's values in the copy made from it, if only this map holds the copy.
  uint16_t* rows_of(const torch::Tensor& p) {
    const std::lock_guard<std::mutex> lock(mutex_);
    const Part* part = nullptr;
    Copy* c = copy_of(p, part);
    if (c == nullptr || c->copy.use_count() != 1) return nullptr;
    return static_cast<uint16_t*>(c->copy.data_ptr()) + part->offset;
  }
  void written(const torch::Tensor& p) {
    const std::lock_guard<std::mutex> lock(mutex_);
    const Part* part = nullptr;
    if (Copy* c = copy_of(p, part)) c->versions[part->index] = static_cast<int64_t>(p._version());
  }

 private:
  using Key = std::pair<const c10::TensorImpl*, size_t>;
  struct Copy {
    std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> sources;
    std::vector<int64_t> versions;
    torch::Tensor copy;
  };
  // Where a parameter's values sit: its copy, its place among the copy's parts, and the
  // offset of its first value.
  struct Part {
    Key key;
    size_t index;
    int64_t offset;
  };

  // The live copy made from p (p still the part it was made from) and p's place in it, or
  // nullptr.
  Copy* copy_of(const torch::Tensor& p, const Part*& part) {
    const auto found = parts_.find(p.unsafeGetTensorImpl());
    if (found == parts_.end()) return nullptr;
    part = &found->second;
    const auto it = copies_.find(part->key);
    if (it == copies_.end() || it->second.sources.size() <= part->index ||
        it->second.sources[part->index].lock().get() != p.unsafeGetTensorImpl() ||
        !p.is_contiguous() || p.scalar_type() != torch::kFloat32)
      return nullptr;
    return &it->second;
  }

  static std::vector<int64_t> versions_of(const std::vector<torch::Tensor>& parts) {
    std::vector<int64_t> v;
    for (const auto& p : parts) v.push_back(static_cast<int64_t>(p._version()));
    return v;
  }
  static bool current(const Copy& c, const std::vector<torch::Tensor>& parts,
                      const std::vector<int64_t>& versions) {
    if (c.versions != versions) return false;
    for (size_t i = 0; i < parts.size(); ++i)
      if (c.sources[i].lock().get() != parts[i].unsafeGetTensorImpl()) return false;
    return true;
  }
  // The parts rounded: one keeps its shape, several [r_i, C] stack to [sum r_i, C].
  static torch::Tensor rounded(const std::vector<torch::Tensor>& parts) {
    // A normal tensor even when the first to ask is an evaluation (inference mode): the
    // next training step saves the copy for its backward.
    const c10::InferenceMode normal_tensors(false);
    const torch::NoGradGuard no_grad;
    if (parts.size() == 1) return round_tensor_to_bf16(parts[0]);
    const int64_t cols = parts[0].size(1);
    int64_t rows = 0;
    for (const auto& p : parts) {
      TORCH_CHECK(p.dim() == 2 && p.size(1) == cols && p.scalar_type() == torch::kFloat32,
                  "to_bf16_cat: float32 [*, ", cols, "] parameters expected, got ", p.sizes());
      rows += p.size(0);
    }
    torch::Tensor out = torch::empty({rows, cols}, torch::dtype(torch::kBFloat16));
    auto* d = static_cast<uint16_t*>(out.data_ptr());
    for (const auto& p : parts) {
      const torch::Tensor src = p.contiguous();
      round_to_bf16(src.data_ptr<float>(), d, src.numel());
      d += src.numel();
    }
    return out;
  }
  // Drops the copies of freed parameters once the map has doubled since the last sweep (a
  // sweep per new copy was quadratic in the number of parameters: 768 with E = 64).
  void sweep() {
    if (copies_.size() < 2 * swept_size_) return;
    for (auto it = copies_.begin(); it != copies_.end();)
      it = it->second.sources[0].expired() ? copies_.erase(it) : std::next(it);
    for (auto it = parts_.begin(); it != parts_.end();)
      it = copies_.count(it->second.key) ? std::next(it) : parts_.erase(it);
    swept_size_ = std::max<size_t>(copies_.size(), 16);
  }

  std::mutex mutex_;
  std::map<Key, Copy> copies_;
  std::map<const c10::TensorImpl*, Part> parts_;
  size_t swept_size_ = 0;
};

Bf16Copies& bf16_copies() {
  static Bf16Copies copies;
  return copies;
}

}  // namespace

void gemm_bf16_rows(char ta, char tb, int64_t M, int64_t N, int64_t K, const uint16_t* a,
                    int64_t lda, const uint16_t* b, int64_t ldb, float* c, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (!bf16_gemm_native()) {  // the fp32 GEMM of the rounded inputs
    const int64_t a_rows = ta == 'N' ? M : K, a_cols = ta == 'N' ? K : M;
    const int64_t b_rows = tb == 'N' ? K : N, b_cols = tb == 'N' ? N : K;
    const std::vector<float> af = widened(a, a_rows, a_cols, lda),
                             bf = widened(b, b_rows, b_cols, ldb);
    sgemm_onednn({ta, a_cols}, af.data(), {tb, b_cols}, bf.data(), c, ldc, M, N, K);
    return;
  }
  const Layout la{ta, lda}, lb{tb, ldb};
  split_output(M, N, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    const dnnl_status_t status = logged_product(Precision::bf16, ta, tb, m1 - m0, n1 - n0, K, [&] {
      return dnnl_gemm_bf16bf16f32(ta, tb, m1 - m0, n1 - n0, K, 1.0f, a + row_offset(la, m0), lda,
                                   b + col_offset(lb, n0), ldb, 0.0f, c + m0 * ldc + n0, ldc);
    });
    TORCH_CHECK(status == dnnl_success, "dnnl_gemm_bf16bf16f32 failed with status ",
                static_cast<int>(status));
  });
}

void gemm_f32_rows(char ta, char tb, int64_t M, int64_t N, int64_t K, const float* a, int64_t lda,
                   const float* b, int64_t ldb, float* c, int64_t ldc) {
  if (M == 0 || N == 0) return;
  sgemm_onednn({ta, lda}, a, {tb, ldb}, b, c, ldc, M, N, K);
}

namespace {

// The last activation this thread rounded, and its copy: q, k and v (the feed-forward's gate
// and up) project the same input, which is then rounded once instead of three times (twice).
// The source is kept (detached: its storage, not its graph), so a hit is the same memory,
// the same view of it (sizes, strides, offset) or a contiguous reshape of a contiguous source
// (the same elements in the same order), and the same version: the same numbers.
struct LastRounded {
  torch::Tensor source, copy;
  int64_t version = -1;
  bool matches(const torch::Tensor& x) const {
    if (!source.defined() || source.data_ptr() != x.data_ptr() ||
        version != static_cast<int64_t>(x._version()))
      return false;
    if (source.sizes() == x.sizes() && source.strides() == x.strides()) return true;
    return source.is_contiguous() && x.is_contiguous() && source.numel() == x.numel();
  }
};
thread_local LastRounded last_rounded;

}  // namespace

torch::Tensor to_bf16(const torch::Tensor& x, bool parameter) {
  if (x.scalar_type() == torch::kBFloat16) return x;
  const StepScope part(StepPart::cast);
  TORCH_CHECK(x.scalar_type() == torch::kFloat32, "to_bf16: float32 expected, got ",
              x.scalar_type());
  if (parameter) return bf16_copies().get({x});
  if (x.is_inference()) return round_tensor_to_bf16(x);  // no version counter to check
  if (last_rounded.matches(x)) return last_rounded.copy.view(x.sizes());
  torch::Tensor copy = round_tensor_to_bf16(x);
  remember_bf16(x, copy);
  return copy;
}

void remember_bf16(const torch::Tensor& x, const torch::Tensor& copy) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && copy.scalar_type() == torch::kBFloat16 &&
                  copy.sizes() == x.sizes() && copy.is_contiguous(),
              "remember_bf16: a float32 tensor and its contiguous bfloat16 copy");
  if (x.is_inference()) return;  // no version counter to check
  last_rounded = {x.detach(), copy, static_cast<int64_t>(x._version())};
}

uint16_t* bf16_copy_rows(const torch::Tensor& p) {
  return bf16_copies().rows_of(p);
}

void bf16_copy_written(const torch::Tensor& p) {
  bf16_copies().written(p);
}

torch::Tensor to_bf16_cat(const std::vector<torch::Tensor>& parameters) {
  TORCH_CHECK(!parameters.empty() && parameters[0].dim() == 2, "to_bf16_cat: 2-D parameters");
  const StepScope part(StepPart::cast);
  return bf16_copies().get(parameters);
}

torch::Tensor to_operand(const torch::Tensor& x, Precision precision, bool parameter) {
  return precision == Precision::bf16 ? to_bf16(x, parameter) : x.contiguous();
}

torch::Tensor to_operand_cat(const std::vector<torch::Tensor>& parameters, Precision precision) {
  if (precision == Precision::bf16) return to_bf16_cat(parameters);
  const torch::NoGradGuard no_grad;
  return torch::cat(parameters, 0);
}

void matmul_into(torch::Tensor c, const torch::Tensor& a, const torch::Tensor& b,
                 const Products& products) {
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && c.dim() == 2 && a.size(1) == b.size(0) &&
                  c.size(0) == a.size(0) && c.size(1) == b.size(1),
              "matmul_into: shapes ", a.sizes(), " x ", b.sizes(), " -> ", c.sizes());
  const bool fp32 = c.scalar_type() == torch::kFloat32;
  if (!fp32 || !products.leave_aten()) {
    at::mm_out(c, a, b);  // float64 (the fp64 tests), or fp32 on OpenBLAS
    return;
  }
  TORCH_CHECK(c.stride(1) == 1 || c.size(1) == 1, "matmul_into: c needs unit column stride");
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  if (M == 0 || N == 0) return;
  if (K == 0) {
    c.zero_();
    return;
  }
  const int64_t ldc = c.size(0) == 1 ? N : c.stride(0);
  if (products.precision == Precision::bf16) {  // gemm_bf16_rows falls back to fp32 where it must
    gemm_bf16(to_bf16(a), to_bf16(b), c, ldc);
    return;
  }
  Layout la{}, lb{};
  const torch::Tensor ao = gemm_operand(a, la), bo = gemm_operand(b, lb);
  sgemm_onednn(la, ao.data_ptr<float>(), lb, bo.data_ptr<float>(), c.data_ptr<float>(), ldc, M, N,
               K);
}

torch::Tensor matmul(const torch::Tensor& a, const torch::Tensor& b, const Products& products) {
  const auto type = a.scalar_type() == torch::kBFloat16 ? torch::kFloat32 : a.scalar_type();
  torch::Tensor c = torch::empty({a.size(0), b.size(1)}, a.options().dtype(type));
  matmul_into(c, a, b, products);
  return c;
}

torch::Tensor batched_matmul(const torch::Tensor& a, const torch::Tensor& b,
                             const Products& products) {
  TORCH_CHECK(a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0) && a.size(2) == b.size(1),
              "batched_matmul: shapes ", a.sizes(), " x ", b.sizes());
  const auto type = a.scalar_type() == torch::kBFloat16 ? torch::kFloat32 : a.scalar_type();
  if (type != torch::kFloat32 || !products.leave_aten()) return torch::bmm(a, b);
  const int64_t n = a.size(0);
  const bool bf16 = products.precision == Precision::bf16;
  const torch::Tensor ab = bf16 ? to_bf16(a) : a;
  const torch::Tensor bb = bf16 ? to_bf16(b) : b;
  torch::Tensor c = torch::empty({n, a.size(1), b.size(2)}, a.options().dtype(type));
  run_blas_tasks(n, [&](int64_t i) { matmul_into(c[i], ab[i], bb[i], products); });
  return c;
}

ProductLog::ProductLog() {
  TORCH_CHECK(!g_logging_products.exchange(true), "ProductLog: one at a time");
  const std::lock_guard<std::mutex> lock(g_product_tallies.mutex);
  g_product_tallies.tallies.clear();
}

ProductLog::~ProductLog() {
  g_logging_products = false;
}

std::map<ProductShape, ProductTally> ProductLog::tallies() const {
  const std::lock_guard<std::mutex> lock(g_product_tallies.mutex);
  return g_product_tallies.tallies;
}

std::map<ProductShape, int64_t> ProductLog::counts() const {
  std::map<ProductShape, int64_t> counts;
  for (const auto& [shape, t] : tallies()) counts[shape] = t.count;
  return counts;
}

double time_product_alone(const ProductShape& s) {
  if (s.m == 0 || s.n == 0 || s.k == 0) return 0;
  const OneBlasThread one_thread;  // split_output keeps the product on this core
  // op(a) [m, k] and op(b) [k, n] stored packed: row-major [m, k] for 'N', [k, m] for 'T'.
  const int64_t lda = s.ta == 'N' ? s.k : s.m, ldb = s.tb == 'N' ? s.n : s.k;
  std::vector<float> c(static_cast<size_t>(s.m * s.n));
  std::function<void()> product;
  std::vector<uint16_t> a16, b16;
  std::vector<float> a32, b32;
  if (s.precision == Precision::bf16) {  // values whose products stay normal numbers
    a16.assign(static_cast<size_t>(s.m * s.k), bf16_bits(0.5f));
    b16.assign(static_cast<size_t>(s.k * s.n), bf16_bits(0.25f));
    product = [&] {
      gemm_bf16_rows(s.ta, s.tb, s.m, s.n, s.k, a16.data(), lda, b16.data(), ldb, c.data(), s.n);
    };
  } else {
    a32.assign(static_cast<size_t>(s.m * s.k), 0.5f);
    b32.assign(static_cast<size_t>(s.k * s.n), 0.25f);
    product = [&] {
      gemm_f32_rows(s.ta, s.tb, s.m, s.n, s.k, a32.data(), lda, b32.data(), ldb, c.data(), s.n);
    };
  }
  // The best of five runs after a first; of one for a product of more than 20 ms (the real
  // sizes' products, whose time hardly varies, and which would take minutes).
  const double first = best_seconds(product, 1);
  return std::min(first, best_seconds(product, first > 0.02 ? 1 : 5));
}

}  // namespace minimind
