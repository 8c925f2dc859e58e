// Arbitrary device data for the CUDA benchmarks: a cheap per-element hash of
// the index and a seed (not the synthetic checkpoint's values, which are
// common/synthetic_fill.h's).
#pragma once

#include <cstddef>
#include <cstdint>

// The hash of element `i` under `seed`.
__device__ __forceinline__ uint32_t BenchHash(size_t i, uint32_t seed) {
  uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  return h;
}
