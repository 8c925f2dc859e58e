// How far two logit vectors are apart, relative to their scale (engine tests).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace flotilla::testing_golden {

// max |a - b|; a size mismatch is a test failure.
inline double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    worst = std::max(worst, std::abs(double(a[i]) - b[i]));
  }
  return worst;
}

// max |a - b| / max(1, max |b|).
inline double RelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double big = 1;
  for (float v : b) big = std::max(big, std::abs(double(v)));
  return MaxAbsDiff(a, b) / big;
}

}  // namespace flotilla::testing_golden
