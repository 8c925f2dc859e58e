// bfloat16 <-> float conversion shared by the loader, the CPU kernels and tests.
// Header-only and free of Abseil so kernels can include it; callable from CUDA
// device code too, so a device generator rounds exactly as the host does.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/host_device.h"

namespace flotilla {

FLOTILLA_HOST_DEVICE inline uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

FLOTILLA_HOST_DEVICE inline float FloatFromBits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

FLOTILLA_HOST_DEVICE inline float Bf16ToFloat(uint16_t bits) {
  return FloatFromBits(static_cast<uint32_t>(bits) << 16);
}

// Round to nearest even, as PyTorch does; NaN stays a quiet NaN.
FLOTILLA_HOST_DEVICE inline uint16_t FloatToBf16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace flotilla
