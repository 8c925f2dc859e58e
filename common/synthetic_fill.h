// The values of the synthetic checkpoint (`flotilla make-checkpoint`), element
// by element. One definition shared by the checkpoint writer, the in-memory
// generator of a rank's shard (worker/model/synthetic_tensors.h) and the CUDA
// generator (kernels/cuda/synthetic_fill.h), so all three give the same bytes.
//
// Every tensor has its own SplitMix64 stream whose state starts at `state0`
// (worker/model/synthetic_tensors.h SyntheticTensorSeed: a hash of the seed and
// the tensor name). Draw k of a stream depends only on (state0, k), so any
// range of elements can be generated on its own, in parallel, on either side.
// Header-only and free of Abseil: CUDA kernels include it.
#pragma once

#include <cstdint>

#include "common/bf16.h"
#include "common/host_device.h"

namespace flotilla {

enum class SyntheticFillKind : uint8_t {
  kNormal,  // one draw per element: mean + stddev * SyntheticNormal(draw), stored bf16 or f32
  kBytes,   // one draw per 8 bytes, little-endian (MXFP4 blocks: random nibbles)
  kScales,  // one draw per byte: scale_base - 1 + draw % 3 (MXFP4 scale exponents)
};

// kNormal tensors may take rows [0, rows) of a [*, cols] matrix from another
// tensor's stream: row r draws what row (a * r + b) % rows of the stream
// starting at `state0` draws (a permutation when gcd(a, rows) = 1). Rows past
// `rows` keep their own stream. rows = 0: no map.
struct SyntheticRowMap {
  uint64_t state0 = 0;
  uint64_t rows = 0;
  uint64_t cols = 1;
  uint64_t a = 1;
  uint64_t b = 0;
};

struct SyntheticFill {
  SyntheticFillKind kind = SyntheticFillKind::kNormal;
  float mean = 0;
  float stddev = 1;
  int scale_base = 127;
  SyntheticRowMap row_map;  // kNormal only
};

inline constexpr uint64_t kSplitMix64Increment = 0x9e3779b97f4a7c15ull;

FLOTILLA_HOST_DEVICE inline uint64_t SplitMix64Finalize(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Draw `k` (counting from 0) of the stream whose state starts at `state0`: what
// the (k+1)-th call of a sequential SplitMix64 (state += increment; finalize)
// returns.
FLOTILLA_HOST_DEVICE inline uint64_t SyntheticDraw(uint64_t state0, uint64_t k) {
  return SplitMix64Finalize(state0 + (k + 1) * kSplitMix64Increment);
}

// IEEE single-precision add and multiply, each rounded on its own: the device
// never fuses them into an FMA (host code using these is compiled without
// floating-point contraction; see worker/model/CMakeLists.txt).
FLOTILLA_HOST_DEVICE inline float SyntheticAdd(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

FLOTILLA_HOST_DEVICE inline float SyntheticMul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// Approximately standard normal: the centred sum of the four 16-bit uniforms
// of one draw, scaled to unit variance (U(0,1) has variance 1/12; four: 1/3).
FLOTILLA_HOST_DEVICE inline float SyntheticNormal(uint64_t draw) {
  float sum = 0;
  for (int i = 0; i < 4; ++i) {
    const float uniform = static_cast<float>((draw >> (16 * i)) & 0xffff);
    sum = SyntheticAdd(sum, SyntheticAdd(uniform, 0.5f));
  }
  return SyntheticMul(SyntheticAdd(SyntheticMul(sum, 1.0f / 65536.0f), -2.0f), 1.7320508f);
}

// Element `i` of a kNormal tensor as a float: f32 tensors store it as is,
// bf16 tensors store FloatToBf16 of it.
FLOTILLA_HOST_DEVICE inline float SyntheticNormalElement(const SyntheticFill& fill, uint64_t state0,
                                                         uint64_t i) {
  const SyntheticRowMap& map = fill.row_map;
  if (map.rows != 0 && i / map.cols < map.rows) {
    state0 = map.state0;
    i = (map.a * (i / map.cols) + map.b) % map.rows * map.cols + i % map.cols;
  }
  return SyntheticAdd(fill.mean,
                      SyntheticMul(fill.stddev, SyntheticNormal(SyntheticDraw(state0, i))));
}

// Byte `i` of a kBytes or kScales tensor.
FLOTILLA_HOST_DEVICE inline uint8_t SyntheticByte(const SyntheticFill& fill, uint64_t state0,
                                                  uint64_t i) {
  if (fill.kind == SyntheticFillKind::kBytes) {
    return static_cast<uint8_t>(SyntheticDraw(state0, i / 8) >> (8 * (i % 8)));
  }
  return static_cast<uint8_t>(fill.scale_base + static_cast<int>(SyntheticDraw(state0, i) % 3) - 1);
}

}  // namespace flotilla
