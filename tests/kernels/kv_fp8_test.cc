// The FP8 KV format (kernels/cpu/kv_fp8.h): e4m3 decoding of every code, the
// encoder against an independent nearest-code search (ties to the even code,
// saturation at +-448, subnormals, NaN), and the per-head scale rule's
// round-trip error bound.
#include "kernels/cpu/kv_fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace flotilla::kernels::cpu {
namespace {

bool IsNanCode(int c) { return (c & 0x7f) == 0x7f; }

TEST(E4m3, DecodesTheFormat) {
  EXPECT_EQ(E4m3ToFloat(0x00), 0.0f);
  EXPECT_EQ(E4m3ToFloat(0x38), 1.0f);    // exponent 7 = bias
  EXPECT_EQ(E4m3ToFloat(0x7e), 448.0f);  // largest finite
  EXPECT_EQ(E4m3ToFloat(0xfe), -448.0f);
  EXPECT_EQ(E4m3ToFloat(0x08), 1.0f / 64);   // smallest normal, 2^-6
  EXPECT_EQ(E4m3ToFloat(0x01), 1.0f / 512);  // smallest subnormal, 2^-9
  EXPECT_EQ(E4m3ToFloat(0x07), 7.0f / 512);
  EXPECT_EQ(E4m3ToFloat(0x3c), 1.5f);
  EXPECT_TRUE(std::isnan(E4m3ToFloat(0x7f)));
  EXPECT_TRUE(std::isnan(E4m3ToFloat(0xff)));
}

TEST(E4m3, EveryFiniteCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    if (IsNanCode(c) || c == 0x80) continue;  // -0 encodes as 0x80 too, checked below
    EXPECT_EQ(FloatToE4m3(E4m3ToFloat(static_cast<uint8_t>(c))), c) << "code " << c;
  }
  EXPECT_EQ(FloatToE4m3(-0.0f), 0x80);
}

TEST(E4m3, SaturatesAndKeepsNan) {
  EXPECT_EQ(FloatToE4m3(448.0f), 0x7e);
  EXPECT_EQ(FloatToE4m3(463.0f), 0x7e);
  EXPECT_EQ(FloatToE4m3(1e30f), 0x7e);
  EXPECT_EQ(FloatToE4m3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(FloatToE4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(FloatToE4m3(-1000.0f), 0xfe);
  EXPECT_TRUE(IsNanCode(FloatToE4m3(std::numeric_limits<float>::quiet_NaN())));
}

TEST(E4m3, TiesGoToTheEvenCode) {
  EXPECT_EQ(FloatToE4m3(1.0625f), 0x38);     // between 1 (0x38) and 1.125 (0x39)
  EXPECT_EQ(FloatToE4m3(1.1875f), 0x3a);     // between 1.125 (0x39) and 1.25 (0x3a)
  EXPECT_EQ(FloatToE4m3(1.5f / 512), 0x02);  // subnormal tie 1.5 * 2^-9
  EXPECT_EQ(FloatToE4m3(2.5f / 512), 0x02);
  EXPECT_EQ(FloatToE4m3(0.5f / 512), 0x00);
  EXPECT_EQ(FloatToE4m3(7.5f / 512), 0x08);  // rounds up into the smallest normal
  EXPECT_EQ(FloatToE4m3(15.5f), 0x58);       // 15 (0x57) / 16 (0x58): into the next binade
}

// The nearest finite code by search, ties to the even code, saturating.
uint8_t NearestCode(float x) {
  int best = -1;
  double best_err = 0;
  for (int c = 0; c < 256; ++c) {
    if (IsNanCode(c) || (c & 0x80) != (std::signbit(x) ? 0x80 : 0)) continue;
    const double err = std::fabs(static_cast<double>(E4m3ToFloat(static_cast<uint8_t>(c))) - x);
    if (best < 0 || err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  return static_cast<uint8_t>(best);
}

TEST(E4m3, EncodesToTheNearestCode) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exponent(-14.0f, 10.0f);
  for (int i = 0; i < 20000; ++i) {
    const float x = (i % 2 == 0 ? 1.0f : -1.0f) * std::exp2(exponent(rng));
    ASSERT_EQ(FloatToE4m3(x), NearestCode(x)) << "x = " << x;
  }
}

TEST(KvFp8Scale, IsAmaxOver448InBf16) {
  EXPECT_EQ(KvFp8Scale(0.0f), kBf16One);
  EXPECT_EQ(Bf16ToFloat(KvFp8Scale(448.0f)), 1.0f);
  EXPECT_EQ(Bf16ToFloat(KvFp8Scale(3.5f)), 3.5f / 448.0f);  // 2^-7: exact in bf16
}

// Each value comes back within half an e4m3 step of its magnitude (2^-4
// relative) or, below the normal range, half a subnormal step of the scale.
TEST(KvFp8RoundTrip, StaysWithinHalfAStep) {
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.0f, 2.0f);
  for (int head = 0; head < 200; ++head) {
    std::vector<float> x(64);
    for (float& v : x) v = n(rng) * (head % 7 == 0 ? 100.0f : 1.0f);
    std::vector<float> y = x;
    RoundTripKvHead(y.data(), 64);
    const float scale = Bf16ToFloat(KvFp8Scale(KvHeadAmax(x.data(), 64)));
    for (int i = 0; i < 64; ++i) {
      const float b = Bf16ToFloat(FloatToBf16(x[i]));
      EXPECT_LE(std::fabs(y[i] - b), std::fabs(b) / 16 + scale / 1024 + 1e-30f)
          << "head " << head << " value " << x[i];
    }
  }
  std::vector<float> zeros(64, 0.0f);
  RoundTripKvHead(zeros.data(), 64);
  for (float v : zeros) EXPECT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace flotilla::kernels::cpu
