// What the routed-experts nodes (routed_experts.cpp, the plain one, and
// routed_experts_fused.cpp for bf16 and fp32 training on oneDNN) share: moving token rows to their
// experts and back, per-thread scratch buffers, and the order and placement of the experts' tasks.
// Internal to the model library.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace minimind::expert_rows {

// The rows of each token, in the order the plain form adds them (ascending assignment):
// rows[start[n] .. start[n + 1]) for token n.
struct TokenRows {
  std::vector<int64_t> start, rows;
};
// token: [M] int64 contiguous, each in [0, N).
TokenRows rows_of_tokens(const torch::Tensor& token, int64_t N);

// [N, H]: out[n] = 0 + src[i0] * w[i0] + src[i1] * w[i1] + ... over token n's rows in order
// (index_add of the rows, each times w rounded first when w is defined, into zeros), split
// among the cores. src: [M, H] contiguous.
torch::Tensor sum_per_token(const torch::Tensor& src, const torch::Tensor& w, const TokenRows& r,
                            int64_t N);

// out [N, H] += the rows of src [m, H] (times w[off ..] if w is defined) at the tokens tok
// [m]. Called for the experts in ascending order on zeroed `out`, this is sum_per_token's
// sum, bit for bit, while each expert's rows are still in cache. (w whole and an offset: a
// narrow view of a tensor that requires grad costs an autograd record, per expert.)
void add_to_tokens(const torch::Tensor& src, const torch::Tensor& w, int64_t off,
                   const int64_t* tok, torch::Tensor& out);
// The same on float arrays: out[tok[i]] += src[i] (* w[i] when w is not null).
void add_to_tokens(const float* src, const float* w, const int64_t* tok, int64_t m, float* out,
                   int64_t H);

// Asks the cache for the row of `bytes` at p, a few rows before a loop over scattered token
// rows reads it: the rows sit in no order the hardware's prefetcher can follow, and a step
// of the fine-grained experts moves each token's row k times (gather, scatter, gradients).
inline void prefetch_row(const void* p, size_t bytes) {
  const auto* c = static_cast<const char*>(p);
  for (size_t at = 0; at < bytes; at += 64) __builtin_prefetch(c + at);
}
// How many rows ahead the loops ask for.
constexpr int64_t kPrefetchRows = 4;

// A buffer this thread keeps for its next experts (an expert's gathered rows and
// temporaries: ATen's allocations for them were a large part of a small expert's time).
// One per slot, 64-byte aligned; valid until the thread's next use of the slot.
enum Slot { kRows, kGradRows, kWeightedRows, kOut, kTemp, kRounded, kGa, kDgu, kSlots };
void* scratch_bytes(Slot slot, size_t bytes);
template <typename T>
T* scratch_of(Slot slot, int64_t elements) {
  return static_cast<T*>(scratch_bytes(slot, static_cast<size_t>(elements) * sizeof(T)));
}
// The buffer as a [rows, cols] tensor of `type`.
torch::Tensor scratch(Slot slot, int64_t rows, int64_t cols, torch::ScalarType type);

// dst [m, C] = the rows tok[0 .. m) of src [*, C] (both contiguous): index_select without
// its allocation. The byte form copies rows of row_bytes each.
void gather_rows(const torch::Tensor& src, const int64_t* tok, torch::Tensor& dst);
void gather_rows(const void* src, size_t row_bytes, const int64_t* tok, int64_t m, void* dst);

// The experts with rows in the order run_blas_tasks takes them: ascending when the tasks
// run one after another (each then adds its rows into the tokens in the plain form's order),
// else most rows first, so the long tasks start early and the short ones fill in at the end.
std::vector<int64_t> expert_order(const std::vector<int64_t>& counts, bool serial);

// Whether experts of width I run side by side, one core each (run_blas_tasks), or one after
// another with each product split over the cores.
bool side_by_side(int64_t I);

// Each expert's first row.
std::vector<int64_t> row_offsets(const std::vector<int64_t>& counts);

}  // namespace minimind::expert_rows
