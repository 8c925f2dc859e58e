#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/bf16.h"

namespace flotilla {
namespace {

TEST(Bf16, ExactValuesRoundTrip) {
  for (float f : {0.0f, -0.0f, 1.0f, -2.5f, 0.15625f, 65536.0f, 1.0f / 1024}) {
    EXPECT_EQ(Bf16ToFloat(FloatToBf16(f)), f) << f;
  }
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Bf16ToFloat(0xc000), -2.0f);
}

TEST(Bf16, RoundsToNearestEven) {
  // 1 + 2^-8 lies exactly between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(FloatToBf16(1.0f + 1.0f / 256), 0x3f80);
  // 1 + 3 * 2^-8 lies between 1 + 2^-7 and 1 + 2^-6: ties go to even (1 + 2^-6).
  EXPECT_EQ(FloatToBf16(1.0f + 3.0f / 256), 0x3f82);
  // Just above the tie rounds up.
  EXPECT_EQ(FloatToBf16(1.0f + 1.0f / 256 + 1.0f / 65536), 0x3f81);
}

TEST(Bf16, SpecialValues) {
  EXPECT_TRUE(std::isinf(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::infinity()))));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload sits only in the low 16 bits must not become infinity.
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::bit_cast<float>(0x7f800001u)))));
}

}  // namespace
}  // namespace flotilla
