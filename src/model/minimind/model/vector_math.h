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
// The reductions' partial results: 16 floats, one AVX-512 register or two AVX2 ones. The
// lanes are combined in a fixed order, so a row's result does not depend on the machine.
constexpr int64_t kLanes = 16;

// 8 floats as one value (GCC's vector extension: one AVX2 register, two SSE ones).
typedef float Half __attribute__((vector_size(8 * sizeof(float))));
typedef int32_t HalfInts __attribute__((vector_size(8 * sizeof(int32_t))));

// kLanes floats as one value, for loops that carry several rows' partial results at once
// (written as scalar lanes, GCC kept such loops' partial results in memory). Two halves and
// not one 16-float vector: GCC 12 compiles a comparison or a select of a 64-byte vector for
// an AVX2 CPU one lane at a time, in scalar code with spills (the attention's softmax ran at
// about 6 ns per element in the AVX2 clone); 32-byte halves are AVX2's own registers, and
// the AVX-512 clone runs them as 256-bit operations. Each operation is elementwise IEEE
// arithmetic, so a row's numbers are those of the scalar helpers here bit for bit. Always
// inlined: no call passes a Lanes (src/CMakeLists.txt).
struct Lanes {
  Half lo, hi;  // lanes 0-7, 8-15
  float operator[](int64_t l) const { return l < 8 ? lo[l] : hi[l - 8]; }
};
#define MINIMIND_LANES_OPERATOR(op)                                                         \
  __attribute__((always_inline)) inline Lanes operator op(const Lanes& a, const Lanes& b) { \
    return {a.lo op b.lo, a.hi op b.hi};                                                    \
  }                                                                                         \
  __attribute__((always_inline)) inline Lanes operator op(const Lanes& a, float b) {        \
    return {a.lo op b, a.hi op b};                                                          \
  }
MINIMIND_LANES_OPERATOR(+)
MINIMIND_LANES_OPERATOR(-)
MINIMIND_LANES_OPERATOR(*)
MINIMIND_LANES_OPERATOR(/)
#undef MINIMIND_LANES_OPERATOR
__attribute__((always_inline)) inline Lanes& operator+=(Lanes& a, const Lanes& b) {
  return a = a + b;
}
__attribute__((always_inline)) inline Lanes load_lanes(const float* p) {
  Lanes v;
  std::memcpy(&v.lo, p, sizeof v.lo);  // half by half: a copy of the whole went through memory
  std::memcpy(&v.hi, p + 8, sizeof v.hi);
  return v;
}
__attribute__((always_inline)) inline void store_lanes(float* p, const Lanes& v) {
  std::memcpy(p, &v.lo, sizeof v.lo);
  std::memcpy(p + 8, &v.hi, sizeof v.hi);
}
__attribute__((always_inline)) inline Lanes all_lanes(float x) {
  return {Half{} + x, Half{} + x};
}
// a > b ? a : b in each lane (a running maximum's step: NaNs in a are passed over).
__attribute__((always_inline)) inline Lanes greater_of(const Lanes& a, const Lanes& b) {
  return {a.lo > b.lo ? a.lo : b.lo, a.hi > b.hi ? a.hi : b.hi};
}
// x in lanes [0, count), 0 in the others (count may be below 0 or above kLanes).
__attribute__((always_inline)) inline Lanes first_lanes(const Lanes& x, int32_t count) {
  const HalfInts iota = {0, 1, 2, 3, 4, 5, 6, 7};
  return {iota < count ? x.lo : Half{}, iota + 8 < count ? x.hi : Half{}};
}

// max(x[0..n)), -inf for n = 0; NaNs are passed over. Any order of comparisons gives the same
// maximum, so this equals a running maximum bit for bit. The partial maxima are one Lanes
// value: written as 16 scalar lanes, the loop compiled to 16 scalar maxima per 16 floats
// (a third of the loss's row loop in a bf16 step).
__attribute__((always_inline)) inline float max_lanes(const float* x, int64_t n) {
  Lanes lanes = all_lanes(-__builtin_inff());
  int64_t j0 = 0;
  for (; j0 + kLanes <= n; j0 += kLanes) lanes = greater_of(load_lanes(x + j0), lanes);
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
__attribute__((always_inline)) inline Half pow2_integral(const Half& n) {
  return __builtin_bit_cast(Half, (__builtin_convertvector(n, HalfInts) + 127) << 23);
}

// e^x for x in [-87, 88] (clamped there), to about 2 ulp: x = n ln 2 + r with |r| <= ln 2 /
// 2, e^r by Cephes' expf polynomial, 2^n from its exponent bits. F is float, or Half for
// each of its lanes: the same operations in the same order.
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
  return {exp_clamped_of(x.lo), exp_clamped_of(x.hi)};
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
