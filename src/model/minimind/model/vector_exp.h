// e^x written so that the loops calling it vectorise (libm's expf is one value per call):
// the bf16 experts' SwiGLU and the bf16 attention's softmax. Internal to the model library.
#pragma once

#include <cstdint>
#include <cstring>

#include "minimind/util/cpu_clones.h"

namespace minimind {

// Compiled as its callers must be (util/cpu_clones.h): no contraction to FMA, no traps.
MINIMIND_NO_FMA_BEGIN
MINIMIND_NO_TRAPS_BEGIN
// e^x for x in [-87, 88] (clamped there), to about 2 ulp: x = n ln 2 + r with |r| <= ln 2 /
// 2, e^r by Cephes' expf polynomial, 2^n from its exponent bits.
inline float exp_clamped(float x) {
  x = x < -87.0f ? -87.0f : x;  // selects (and no floor), so that the loops vectorise
  x = x > 88.0f ? 88.0f : x;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // ln 2 in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}
MINIMIND_NO_TRAPS_END
MINIMIND_NO_FMA_END

}  // namespace minimind
