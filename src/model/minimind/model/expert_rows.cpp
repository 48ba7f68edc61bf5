#include "minimind/model/expert_rows.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>

#include "minimind/util/blas_tasks.h"
#include "minimind/util/cpu_clones.h"

namespace minimind::expert_rows {

namespace {

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

template <typename T>
MINIMIND_CPU_CLONES void add_rows_to_tokens(const T* __restrict src, const T* __restrict w,
                                            const int64_t* __restrict tok, int64_t m,
                                            T* __restrict out, int64_t H) {
  for (int64_t i = 0; i < m; ++i) {
    if (i + kPrefetchRows < m) prefetch_row(out + tok[i + kPrefetchRows] * H, H * sizeof(T));
    add_row(out + tok[i] * H, src + i * H, w ? w + i : nullptr, H);
  }
}
MINIMIND_NO_FMA_END

// Experts up to this width run side by side. Narrow experts' GEMMs split badly over the
// cores; wide ones split well, and side by side they ran slower here (two one-thread GEMMs on
// this machine's two cores share more than two threads of one GEMM do). Measured with
// scripts/bench-experts.sh on 2 cores: E = 32 (width 104) and E = 64 (width 52) ~10 %
// faster side by side, E = 16 (208) no clear difference, E = 4 (832) 10-25 % slower.
constexpr int64_t kSideBySideMaxWidth = 128;

}  // namespace

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

void add_to_tokens(const torch::Tensor& src, const torch::Tensor& w, int64_t off,
                   const int64_t* tok, torch::Tensor& out) {
  AT_DISPATCH_FLOATING_TYPES(src.scalar_type(), "add_to_tokens", [&] {
    add_rows_to_tokens<scalar_t>(src.data_ptr<scalar_t>(),
                                 w.defined() ? w.data_ptr<scalar_t>() + off : nullptr, tok,
                                 src.size(0), out.data_ptr<scalar_t>(), src.size(1));
  });
}

void add_to_tokens(const float* src, const float* w, const int64_t* tok, int64_t m, float* out,
                   int64_t H) {
  add_rows_to_tokens<float>(src, w, tok, m, out, H);
}

void* scratch_bytes(Slot slot, size_t bytes) {
  struct Buffer {
    void* data = nullptr;
    size_t bytes = 0;
    ~Buffer() { std::free(data); }
  };
  thread_local std::array<Buffer, kSlots> buffers;
  Buffer& b = buffers[slot];
  if (b.bytes < bytes) {
    std::free(b.data);
    b.data = nullptr;
    b.bytes = 0;
    const size_t rounded = (bytes + 63) / 64 * 64;  // whole cache lines, as oneDNN prefers
    b.data = std::aligned_alloc(64, rounded);
    TORCH_CHECK(b.data, "routed_experts: out of memory for ", rounded, " bytes of scratch");
    b.bytes = rounded;
  }
  return b.data;
}

torch::Tensor scratch(Slot slot, int64_t rows, int64_t cols, torch::ScalarType type) {
  void* data = scratch_bytes(slot, static_cast<size_t>(rows * cols) * c10::elementSize(type));
  return torch::from_blob(data, {rows, cols}, torch::TensorOptions().dtype(type));
}

void gather_rows(const void* src, size_t row_bytes, const int64_t* tok, int64_t m, void* dst) {
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < m; ++i) {
    if (i + kPrefetchRows < m)
      prefetch_row(s + static_cast<size_t>(tok[i + kPrefetchRows]) * row_bytes, row_bytes);
    std::memcpy(d + static_cast<size_t>(i) * row_bytes, s + static_cast<size_t>(tok[i]) * row_bytes,
                row_bytes);
  }
}

void gather_rows(const torch::Tensor& src, const int64_t* tok, torch::Tensor& dst) {
  gather_rows(src.data_ptr(), static_cast<size_t>(src.size(1)) * src.element_size(), tok,
              dst.size(0), dst.data_ptr());
}

std::vector<int64_t> expert_order(const std::vector<int64_t>& counts, bool serial) {
  std::vector<int64_t> order;
  for (int64_t e = 0; e < static_cast<int64_t>(counts.size()); ++e)
    if (counts[e] > 0) order.push_back(e);
  if (!serial)
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return counts[a] > counts[b]; });
  return order;
}

bool side_by_side(int64_t I) {
  return I <= kSideBySideMaxWidth;
}

std::vector<int64_t> row_offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> off(counts.size(), 0);
  for (size_t e = 1; e < counts.size(); ++e) off[e] = off[e - 1] + counts[e - 1];
  return off;
}

}  // namespace minimind::expert_rows
