// FP8 KV cache (--kv-cache-dtype fp8): the e4m3 format and the scale rule
// both engines store full-attention K and V with. Header-only, free of
// Abseil, callable from CUDA device code, so the CPU engine and the CUDA
// kernels quantize by exactly the same rule (kernels/README.md, "FP8 KV").
//
// One scale per (position, kv head): the head's head_dim values x (already
// rounded to bf16, as the bf16 cache stores them) are stored as
//   scale = bf16(amax / 448)   (amax = max |x|; 1 when amax is 0)
//   q     = e4m3(x / scale)    (round to nearest even, saturating at +-448)
// and read back as e4m3(q) * scale, which f32 holds exactly (4 significant
// bits times 8). Quantization is dynamic: no calibration.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/bf16.h"
#include "common/host_device.h"

namespace flotilla::kernels::cpu {

constexpr float kE4m3Max = 448.0f;
constexpr uint16_t kBf16One = 0x3f80;

// e4m3 (1 sign, 4 exponent bits of bias 7, 3 mantissa bits; no infinity,
// 0x7f / 0xff are NaN) to f32.
FLOTILLA_HOST_DEVICE inline float E4m3ToFloat(uint8_t q) {
  const int e = (q >> 3) & 0xf, m = q & 7;
  const float sign = (q & 0x80) != 0 ? -1.0f : 1.0f;
  if (e == 0xf && m == 7) return NAN;
  if (e == 0) return sign * static_cast<float>(m) * (1.0f / 512.0f);  // m * 2^-9
  return sign * ldexpf(1.0f + static_cast<float>(m) * 0.125f, e - 7);
}

// f32 to e4m3, rounding to nearest even and saturating to +-448 (infinities
// too); NaN becomes 0x7f with the sign. The host twin of the device's
// cvt.rn.satfinite.e4m3x2.f32 (__nv_cvt_float2_to_fp8x2 with __NV_SATFINITE).
inline uint8_t FloatToE4m3(float f) {
  const uint32_t u = FloatBits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7f;
  const float af = FloatFromBits(a);
  if (af >= kE4m3Max) return sign | 0x7e;
  const int e = static_cast<int>(a >> 23) - 127;
  if (e >= -6) {
    // Normal: keep 3 of the 23 mantissa bits, ties to even; a carry moves
    // into the exponent (af < 448 rounds to 448 = 0x7e at most).
    const uint32_t m = a & 0x7fffffu;
    const uint32_t keep = m >> 20, rest = m & 0xfffffu;
    const uint32_t up = rest > 0x80000u || (rest == 0x80000u && (keep & 1u) != 0) ? 1u : 0u;
    return sign | static_cast<uint8_t>((static_cast<uint32_t>(e + 7) << 3 | keep) + up);
  }
  // Subnormal: k * 2^-9, k = af * 2^9 (exact) rounded to even; k = 8 is the
  // smallest normal, whose code is 0x08.
  return sign | static_cast<uint8_t>(std::nearbyint(af * 512.0f));
}

// The bf16 scale of a head whose largest magnitude is amax.
FLOTILLA_HOST_DEVICE inline uint16_t KvFp8Scale(float amax) {
  const uint16_t s = FloatToBf16(amax / kE4m3Max);
  return s == 0 ? kBf16One : s;
}

// The largest magnitude of n values once rounded to bf16.
inline float KvHeadAmax(const float* x, int64_t n) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(Bf16ToFloat(FloatToBf16(x[i]))));
  return amax;
}

// Stores n values of one (position, kv head) as e4m3 codes and their scale.
inline void QuantizeKvHead(const float* x, int64_t n, uint8_t* q, uint16_t* scale) {
  *scale = KvFp8Scale(KvHeadAmax(x, n));
  const float s = Bf16ToFloat(*scale);
  for (int64_t i = 0; i < n; ++i) q[i] = FloatToE4m3(Bf16ToFloat(FloatToBf16(x[i])) / s);
}

// x (one position's kv head) becomes what an FP8 cache gives back for it.
inline void RoundTripKvHead(float* x, int64_t n) {
  const float s = Bf16ToFloat(KvFp8Scale(KvHeadAmax(x, n)));
  for (int64_t i = 0; i < n; ++i) {
    x[i] = E4m3ToFloat(FloatToE4m3(Bf16ToFloat(FloatToBf16(x[i])) / s)) * s;
  }
}

}  // namespace flotilla::kernels::cpu
