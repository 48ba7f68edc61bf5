// vector_math.h's Lanes (16 floats as two 8-float halves) against its scalar helpers, lane by
// lane and bit for bit: the attention's softmax and the loss's row loops rely on a row's
// numbers being the scalar ones, whichever half a lane is in and whichever clone runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "minimind/model/vector_math.h"

namespace minimind {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// A ramp across e^x's clamps, with zero, a denormal and both infinities among it; a multiple
// of kLanes long.
std::vector<float> ramp() {
  std::vector<float> v = {-kInf, kInf, 0.0f, -0.0f, 1e-40f, -87.0f, 88.0f, -86.99f, 87.99f};
  for (float x = -100.0f; x < 100.0f; x += 0.37f) v.push_back(x);
  while (v.size() % kLanes != 0) v.push_back(static_cast<float>(v.size()) / 7.0f);
  return v;
}

TEST(VectorMath, LanesArithmeticAndExpEqualTheScalarHelpersLaneByLane) {
  const std::vector<float> v = ramp();
  for (size_t j0 = 0; j0 < v.size(); j0 += kLanes) {
    const Lanes x = load_lanes(v.data() + j0);
    Lanes y = exp_clamped(x * 0.5f - 1.0f) / 3.0f + x;
    y += all_lanes(2.0f) * x;
    float out[kLanes];
    store_lanes(out, y);
    for (int64_t l = 0; l < kLanes; ++l) {
      const float s = v[j0 + l];
      const float want = (exp_clamped(s * 0.5f - 1.0f) / 3.0f + s) + 2.0f * s;
      SCOPED_TRACE(testing::Message() << "x = " << s << ", lane " << l);
      EXPECT_EQ(bits_of(out[l]), bits_of(want));
      EXPECT_EQ(bits_of(y[l]), bits_of(want));  // operator[] reads the same lane
    }
  }
}

TEST(VectorMath, GreaterOfAndMaxLanesKeepARunningMaximumPassingOverNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // The largest value in lane 9 (the second half), NaNs in both halves, a tail of 5.
  std::vector<float> v(2 * kLanes + 5);
  for (size_t j = 0; j < v.size(); ++j) v[j] = std::sin(static_cast<float>(j));
  v[kLanes + 9] = 7.5f, v[3] = nan, v[kLanes + 12] = nan, v[2 * kLanes + 2] = -kInf;
  float running = -kInf;
  for (size_t j = 0; j < v.size(); ++j) running = v[j] > running ? v[j] : running;
  EXPECT_EQ(max_lanes(v.data(), static_cast<int64_t>(v.size())), running);
  EXPECT_EQ(max_lanes(v.data(), 0), -kInf);
  EXPECT_EQ(max_lanes(v.data(), 3), std::max(std::max(v[0], v[1]), v[2]));  // the tail alone

  const Lanes a = load_lanes(v.data()), b = load_lanes(v.data() + kLanes);
  const Lanes m = greater_of(a, b);
  for (int64_t l = 0; l < kLanes; ++l) {
    const float want = a[l] > b[l] ? a[l] : b[l];
    EXPECT_EQ(bits_of(m[l]), bits_of(want)) << "lane " << l;
  }
}

TEST(VectorMath, FirstLanesKeepsTheLanesBelowTheCountAndZeroesTheRest) {
  float x[kLanes];
  for (int64_t l = 0; l < kLanes; ++l) x[l] = static_cast<float>(l) + 1.0f;
  for (int32_t count = -3; count <= kLanes + 3; ++count) {
    const Lanes kept = first_lanes(load_lanes(x), count);
    for (int64_t l = 0; l < kLanes; ++l)
      EXPECT_EQ(kept[l], l < count ? x[l] : 0.0f) << "count " << count << ", lane " << l;
  }
}

}  // namespace
}  // namespace minimind
