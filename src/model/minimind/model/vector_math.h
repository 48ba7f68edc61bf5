// Small pieces of arithmetic written so that the loops calling them vectorise: e^x (libm's
// expf is one value per call) and reductions over a row in kLanes partial results (a single
// running sum or maximum is a chain of dependent operations that does not vectorise). For the
// bf16 experts' SwiGLU, the bf16 attention's softmax and bf16 training's loss. Internal to the
// model library.
#pragma once

#include <cstdint>
#include <cstring>

#include "minimind/util/cpu_clones.h"

namespace minimind {

// Compiled as its callers must be (util/cpu_clones.h): no contraction to FMA, no traps.
MINIMIND_NO_FMA_BEGIN
MINIMIND_NO_TRAPS_BEGIN
// The reductions' partial results: one AVX-512 register of floats. The lanes are combined in
// a fixed order, so a row's result does not depend on the machine.
constexpr int64_t kLanes = 16;

// kLanes floats as one value (GCC's vector extension: one AVX-512 register, two AVX2 ones or
// four SSE ones, by the clone being compiled), for loops that carry several rows' partial
// results at once: written as scalar lanes, GCC kept such loops' partial results in memory.
// Each operation is elementwise IEEE arithmetic, so a row's numbers are those of the scalar
// helpers here bit for bit. Always inlined: no call passes a Lanes (src/CMakeLists.txt).
typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float))));
typedef int32_t LaneInts __attribute__((vector_size(kLanes * sizeof(int32_t))));
__attribute__((always_inline)) inline Lanes load_lanes(const float* p) {
  Lanes v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
__attribute__((always_inline)) inline void store_lanes(float* p, const Lanes& v) {
  std::memcpy(p, &v, sizeof v);
}
__attribute__((always_inline)) inline Lanes all_lanes(float x) {
  return Lanes{} + x;
}

// max(x[0..n)), -inf for n = 0; NaNs are passed over. Any order of comparisons gives the same
// maximum, so this equals a running maximum bit for bit. The partial maxima are one Lanes
// value: written as 16 scalar lanes, the loop compiled to 16 scalar maxima per 16 floats
// (a third of the loss's row loop in a bf16 step).
__attribute__((always_inline)) inline float max_lanes(const float* x, int64_t n) {
  Lanes lanes = all_lanes(-__builtin_inff());
  int64_t j0 = 0;
  for (; j0 + kLanes <= n; j0 += kLanes) {
    const Lanes v = load_lanes(x + j0);
    lanes = v > lanes ? v : lanes;
  }
  float mx = -__builtin_inff();
  for (int64_t j = j0; j < n; ++j) mx = x[j] > mx ? x[j] : mx;
  for (int64_t l = 0; l < kLanes; ++l) mx = lanes[l] > mx ? lanes[l] : mx;
  return mx;
}

// 2^n for an integral n in float range, from its exponent bits.
inline float pow2_integral(float n) {
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return scale;
}
__attribute__((always_inline)) inline Lanes pow2_integral(const Lanes& n) {
  return __builtin_bit_cast(Lanes, (__builtin_convertvector(n, LaneInts) + 127) << 23);
}

// e^x for x in [-87, 88] (clamped there), to about 2 ulp: x = n ln 2 + r with |r| <= ln 2 /
// 2, e^r by Cephes' expf polynomial, 2^n from its exponent bits. F is float, or Lanes for
// each lane: the same operations in the same order.
template <typename F>
__attribute__((always_inline)) inline F exp_clamped_of(F x) {
  const F lo = F{} + -87.0f, hi = F{} + 88.0f;
  x = x < lo ? lo : x;  // selects (and no floor), so that the loops vectorise
  x = x > hi ? hi : x;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const F n = (x * 1.44269504088896341f + kRound) - kRound;
  const F r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // ln 2 in two parts
  F p = F{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  return p * pow2_integral(n);
}
inline float exp_clamped(float x) {
  return exp_clamped_of(x);
}
__attribute__((always_inline)) inline Lanes exp_clamped(const Lanes& x) {
  return exp_clamped_of(x);
}

// sum(x[j] * y[j]) over j < n in kLanes partial sums, then the tail, then the lanes in order.
// Y is float, or uint16_t for bf16 bits (widened exactly). The callers must be compiled under
// the same pragmas as this file's region (no FMA, no traps): GCC inlines only across equal
// optimisation options, and out of line the loop does not vectorise.
inline float widen(float y) {
  return y;
}
inline float widen(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
template <typename Y>
__attribute__((always_inline)) inline float dot_lanes(const float* x, const Y* y, int64_t n) {
  float lanes[kLanes] = {};
  int64_t j0 = 0;
  for (; j0 + kLanes <= n; j0 += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] += x[j0 + l] * widen(y[j0 + l]);
  float sum = 0;
  for (int64_t j = j0; j < n; ++j) sum += x[j] * widen(y[j]);
  for (float l : lanes) sum += l;
  return sum;
}

// sum(x[0..n)) in the order dot_lanes adds.
__attribute__((always_inline)) inline float sum_lanes(const float* x, int64_t n) {
  float lanes[kLanes] = {};
  int64_t j0 = 0;
  for (; j0 + kLanes <= n; j0 += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] += x[j0 + l];
  float sum = 0;
  for (int64_t j = j0; j < n; ++j) sum += x[j];
  for (float l : lanes) sum += l;
  return sum;
}
// sum(e^(x[j] - shift)) over j < n, in the order sum_lanes adds (the loss's log-softmax).
__attribute__((always_inline)) inline float sum_exp_lanes(const float* x, int64_t n, float shift) {
  float lanes[kLanes] = {};
  int64_t j0 = 0;
  for (; j0 + kLanes <= n; j0 += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] += exp_clamped(x[j0 + l] - shift);
  float sum = 0;
  for (int64_t j = j0; j < n; ++j) sum += exp_clamped(x[j] - shift);
  for (float l : lanes) sum += l;
  return sum;
}
// sum_exp_lanes, also leaving e^(x[j] - shift) in x[j] (the loss's softmax, in one pass).
__attribute__((always_inline)) inline float exp_sum_lanes(float* x, int64_t n, float shift) {
  float lanes[kLanes] = {};
  int64_t j0 = 0;
  for (; j0 + kLanes <= n; j0 += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) {
      x[j0 + l] = exp_clamped(x[j0 + l] - shift);
      lanes[l] += x[j0 + l];
    }
  float sum = 0;
  for (int64_t j = j0; j < n; ++j) {
    x[j] = exp_clamped(x[j] - shift);
    sum += x[j];
  }
  for (float l : lanes) sum += l;
  return sum;
}
MINIMIND_NO_TRAPS_END
MINIMIND_NO_FMA_END

}  // namespace minimind
