// Device helper shared by the router kernels (ops.cu, router.cu): one warp
// ranks one row of router logits. Include only from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

namespace flotilla::kernels::cuda {

constexpr int kTopKMaxPerLane = 8;  // experts <= 256
constexpr int kTopKMaxK = 8;

// Ranking: larger value first, then lower index (torch.topk); NaN never
// beats a number.
__device__ __forceinline__ bool TopKBetter(float va, int ia, float vb, int ib) {
  return va > vb || (va == vb && ia < ib);
}

// The k largest of row[0, experts) and the softmax over those k only, by the
// calling warp; lane 0 writes ids[0, k) and weights[0, k). The row is read
// through L2 (it may have been written by another CTA of the same grid).
__device__ inline void WarpTopKSoftmax(const float* row, int experts, int k, int32_t* ids,
                                       float* weights) {
  const int lane = threadIdx.x & 31;
  float v[kTopKMaxPerLane];
#pragma unroll
  for (int i = 0; i < kTopKMaxPerLane; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < experts ? __ldcg(row + e) : -INFINITY;
  }
  unsigned taken = 0;
  float top_v[kTopKMaxK];
  int top_i[kTopKMaxK];
#pragma unroll
  for (int s = 0; s < kTopKMaxK; ++s) {
    if (s >= k) break;
    float bv = -INFINITY;
    int bi = INT_MAX;
#pragma unroll
    for (int i = 0; i < kTopKMaxPerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < experts && !(taken & (1u << i)) && TopKBetter(v[i], e, bv, bi)) {
        bv = v[i];
        bi = e;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (TopKBetter(ov, oi, bv, bi)) {
        bv = ov;
        bi = oi;
      }
    }
    if (bi == INT_MAX) bi = 0;  // only NaNs left: keep a valid id
    if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
    top_v[s] = bv;
    top_i[s] = bi;
  }
  if (lane == 0) {
    const float mx = top_v[0];
    float sum = 0.0f;
#pragma unroll
    for (int s = 0; s < kTopKMaxK; ++s) {
      if (s >= k) break;
      top_v[s] = expf(top_v[s] - mx);
      sum += top_v[s];
    }
#pragma unroll
    for (int s = 0; s < kTopKMaxK; ++s) {
      if (s >= k) break;
      ids[s] = top_i[s];
      weights[s] = top_v[s] / sum;
    }
  }
}

}  // namespace flotilla::kernels::cuda
