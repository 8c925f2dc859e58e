// MXFP8 activations (Microscaling blocks of e4m3 values), the rule of the
// FP8-activation MoE: each block of 32 consecutive values of a row shares
// one power-of-two scale 2^e, e the smallest integer with amax / 2^e <= 448
// (e4m3's largest value), so no value of the block saturates (the OCP
// spec's e = floor(log2 amax) - 8 clips blocks whose largest significand is
// above 1.75 by up to 12.5%); each value is stored as e4m3(x / 2^e),
// rounded to nearest even (kv_fp8.h's FloatToE4m3), and read back as
// e4m3 * 2^e, exact in f32. A block of zeros keeps scale 1. Header-only,
// free of Abseil.
//
// Why this form: every MXFP4 weight value (e2m1) is exact in e4m3, so an
// expert's dot product can run on FP8 tensor cores with both scales powers
// of two (their product is an exponent add); the activations are what loses
// precision: 3 mantissa bits, a relative error of at most 2^-4 per value
// (less for values far below the block's largest, which keep subnormal
// steps of 2^-9 of the scale).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/kv_fp8.h"

namespace flotilla::kernels::cpu {

constexpr int kMxfp8Block = 32;
// The exponent e of a block's scale 2^e given its largest magnitude (0 for
// a block of zeros, or one holding a NaN or infinity, which saturate).
inline int Mxfp8ScaleExponent(float amax) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return 0;
  int exponent = 0;
  std::frexp(amax, &exponent);  // amax = f x 2^exponent, f in [0.5, 1)
  // amax / 2^(exponent - 9) is in [256, 512): one more when above 448.
  const int e = std::ldexp(amax, 9 - exponent) > kE4m3Max ? exponent - 8 : exponent - 9;
  // The scale is an e8m0 byte: 2^-127 .. 2^127 (values under 2^-136 are 0
  // in e4m3 then).
  return std::clamp(e, -127, 127);
}

// n values (one block or the shorter last one) become what MXFP8 gives back.
inline void RoundTripMxfp8Block(float* x, int64_t n) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  const int e = Mxfp8ScaleExponent(amax);
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::ldexp(E4m3ToFloat(FloatToE4m3(std::ldexp(x[i], -e))), e);
  }
}

// rows x cols values (row-major), each row's blocks of 32 from its start.
inline void RoundTripMxfp8Rows(float* x, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * cols;
    for (int64_t c = 0; c < cols; c += kMxfp8Block) {
      RoundTripMxfp8Block(row + c, std::min<int64_t>(kMxfp8Block, cols - c));
    }
  }
}

}  // namespace flotilla::kernels::cpu
