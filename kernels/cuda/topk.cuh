// Device helper shared by the router kernels (ops.cu, linear.cu, router.cu): one warp
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
// beats a number. TopKKey: a value as an unsigned key that ranks so: larger
// values give larger keys, -0 the key of +0, and NaN 0, below every number
// (-inf included).
__device__ __forceinline__ uint32_t TopKKey(float v) {
  if (v != v) return 0u;
  uint32_t u = __float_as_uint(v);
  if ((u << 1) == 0) u = 0;  // -0 ranks as +0
  return (u & 0x80000000u) != 0 ? ~u : u | 0x80000000u;
}

// The value of a key (key 0, NaN's, as -inf).
__device__ __forceinline__ float TopKKeyValue(uint32_t key) {
  if (key == 0) return -INFINITY;
  return __uint_as_float((key & 0x80000000u) != 0 ? key & 0x7FFFFFFFu : ~key);
}

// The k largest of a row of `experts` values and the softmax over those k
// only, by the calling warp, from the values each lane holds: v[i] is the
// row's value lane + 32 i (-inf past the end). Lane 0 writes ids[0, k) and
// weights[0, k). Each choice is one warp max of the lanes' best keys and one
// warp min of the tied lanes' indices (redux.sync), rather than a butterfly
// of value and index shuffles.
__device__ inline void WarpTopKSoftmaxHeld(const float (&v)[kTopKMaxPerLane], int experts, int k,
                                           int32_t* ids, float* weights) {
  const int lane = threadIdx.x & 31;
  uint32_t key[kTopKMaxPerLane];
  unsigned open = 0;  // entries of this lane still to rank
#pragma unroll
  for (int i = 0; i < kTopKMaxPerLane; ++i) {
    key[i] = TopKKey(v[i]);
    if (lane + 32 * i < experts) open |= 1u << i;
  }
  float top_v[kTopKMaxK] = {};
  int top_i[kTopKMaxK] = {};
#pragma unroll
  for (int s = 0; s < kTopKMaxK; ++s) {
    if (s >= k) break;
    uint32_t bk = 0;
    int bi = 0;
#pragma unroll
    for (int i = 0; i < kTopKMaxPerLane; ++i) {
      if ((open & (1u << i)) != 0 && key[i] > bk) {  // strict: the lower index keeps a tie
        bk = key[i];
        bi = i;
      }
    }
    const uint32_t best = __reduce_max_sync(0xffffffffu, bk);
    int id = 0;  // only NaNs left: keep a valid id
    if (best != 0) {
      id = static_cast<int>(__reduce_min_sync(
          0xffffffffu, bk == best ? static_cast<uint32_t>(lane + 32 * bi) : 0xffffffffu));
    }
    if ((id & 31) == lane) open &= ~(1u << (id >> 5));
    top_v[s] = TopKKeyValue(best);
    top_i[s] = id;
  }
  // The softmax: every slot's exponent and quotient at once (those past k
  // are dropped), the sum in slot order.
  if (lane == 0) {
    const float mx = top_v[0];
    float ex[kTopKMaxK];
#pragma unroll
    for (int s = 0; s < kTopKMaxK; ++s) ex[s] = expf(top_v[s] - mx);
    float sum = 0.0f;
#pragma unroll
    for (int s = 0; s < kTopKMaxK; ++s) {
      if (s < k) sum += ex[s];
    }
#pragma unroll
    for (int s = 0; s < kTopKMaxK; ++s) {
      if (s < k) {
        ids[s] = top_i[s];
        weights[s] = ex[s] / sum;
      }
    }
  }
}

// WarpTopKSoftmaxHeld over row[0, experts) in global memory, read through L2
// (it may have been written by another CTA of the same grid).
__device__ inline void WarpTopKSoftmax(const float* row, int experts, int k, int32_t* ids,
                                       float* weights) {
  const int lane = threadIdx.x & 31;
  float v[kTopKMaxPerLane];
#pragma unroll
  for (int i = 0; i < kTopKMaxPerLane; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < experts ? __ldcg(row + e) : -INFINITY;
  }
  WarpTopKSoftmaxHeld(v, experts, k, ids, weights);
}

}  // namespace flotilla::kernels::cuda
