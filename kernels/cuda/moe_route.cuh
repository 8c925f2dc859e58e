// The MoE layer's routing as block-wide device code, shared by the layer's
// own routing kernel (moe.cu) and the router's kernel (linear.cu), whose
// last block can write it for a few tokens so the layer skips a launch
// (MoeRouteTargets, LaunchMoeLayer's `routed`).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/moe.h"
#include "kernels/cuda/ptx.cuh"

namespace flotilla::kernels::cuda {

// Groups the pairs ids[0, pairs) by expert into `r`: counts, offsets, the
// touched experts in ascending order and their number, pair_of (order within
// an expert unspecified), the fused launch's counters zeroed and the ids
// outside [0, r.experts) counted (those pairs are skipped). Called by every
// thread of the block; kMaxExperts >= r.experts and blockDim.x >= r.experts,
// a multiple of 32.
template <int kMaxExperts>
__device__ __forceinline__ void BuildMoeRouting(const int32_t* ids, int pairs,
                                                const MoeRouteTargets& r) {
  __shared__ int32_t s_count[kMaxExperts];
  __shared__ int32_t s_cursor[kMaxExperts];
  __shared__ int32_t s_warp[32];
  __shared__ int32_t s_total[2];
  __shared__ int32_t s_invalid;
  const int E = r.experts, e = threadIdx.x;
  if (e < E) s_count[e] = 0;
  if (threadIdx.x == 0) s_invalid = 0;
  __syncthreads();
  // Both passes call visit(p, id) for every pair, reading the ids kIdsAhead
  // per thread at a time with their loads issued together: one block walks
  // all the pairs, so a load per iteration put every id's latency in a row
  // (a 2048-token prefill's 8192 pairs took ~15 us on an H200).
  constexpr int kIdsAhead = 8;
  const int stride = static_cast<int>(blockDim.x);
  auto for_each_pair = [&](auto&& visit) {
    for (int p0 = threadIdx.x; p0 < pairs; p0 += kIdsAhead * stride) {
      int id[kIdsAhead];
#pragma unroll
      for (int u = 0; u < kIdsAhead; ++u) {
        const int p = p0 + u * stride;
        id[u] = p < pairs ? ids[p] : 0;
      }
#pragma unroll
      for (int u = 0; u < kIdsAhead; ++u) {
        if (p0 + u * stride < pairs) visit(p0 + u * stride, id[u]);
      }
    }
  };
  for_each_pair([&](int, int id) {
    if (id >= 0 && id < E) {
      atomicAdd(&s_count[id], 1);
    } else {
      atomicAdd(&s_invalid, 1);
    }
  });
  __syncthreads();
  const int n = e < E ? s_count[e] : 0;
  const int off = ptx::BlockExclusiveScan(n, s_warp, &s_total[0]);
  const int act = ptx::BlockExclusiveScan(n > 0 ? 1 : 0, s_warp, &s_total[1]);
  if (e < E) {
    s_cursor[e] = off;
    r.offset[e] = off;
    r.count[e] = n;
    r.done[e] = 0;
    if (n > 0) r.active[act] = e;
  }
  if (threadIdx.x == 0) {
    r.offset[E] = s_total[0];
    *r.num_active = s_total[1];
    if (r.invalid != nullptr) *r.invalid = s_invalid;
  }
  __syncthreads();
  for_each_pair([&](int p, int id) {
    if (id >= 0 && id < E) r.pair_of[atomicAdd(&s_cursor[id], 1)] = p;
  });
}

// BuildMoeRouting's result for a few pairs whose ids sit in shared memory
// (s_ids[0, pairs), pairs <= kMaxPairs), without atomics or scans: thread e
// counts its expert's pairs and those of lower experts over the ids, and
// pair p's slot is the pairs of lower experts plus its expert's pairs before
// p, so within an expert the pairs keep their order. Called by every thread
// of the block; blockDim.x >= max(r.experts, pairs).
template <int kMaxPairs>
__device__ __forceinline__ void BuildMoeRoutingFew(const int32_t* s_ids, int pairs,
                                                   const MoeRouteTargets& r) {
  __shared__ bool s_first[kMaxPairs];  // the first pair of its (valid) expert
  const int E = r.experts, t = threadIdx.x;
  auto valid = [E](int32_t id) { return id >= 0 && id < E; };
  if (t < pairs) {
    const int32_t id = s_ids[t];
    bool first = valid(id);
    for (int q = 0; q < t; ++q) first = first && s_ids[q] != id;
    s_first[t] = first;
  }
  __syncthreads();
  if (t < E) {
    int n = 0, below = 0, experts_below = 0;
    for (int p = 0; p < pairs; ++p) {
      const int32_t id = s_ids[p];
      n += id == t;
      if (valid(id) && id < t) {
        ++below;
        experts_below += s_first[p];
      }
    }
    r.count[t] = n;
    r.offset[t] = below;
    r.done[t] = 0;
    if (n > 0) r.active[experts_below] = t;
  }
  if (t < pairs) {
    const int32_t id = s_ids[t];
    if (valid(id)) {
      int slot = 0;
      for (int p = 0; p < pairs; ++p) {
        const int32_t other = s_ids[p];
        slot += valid(other) && (other < id || (other == id && p < t));
      }
      r.pair_of[slot] = t;
    }
  }
  if (t == 0) {
    int total = 0, active = 0;
    for (int p = 0; p < pairs; ++p) {
      total += valid(s_ids[p]);
      active += s_first[p];
    }
    r.offset[E] = total;
    *r.num_active = active;
    if (r.invalid != nullptr) *r.invalid = pairs - total;
  }
}

// Eight bf16 values v0..v7 (in order, two per word) as the decode kernels'
// f16 activations: [v0, v4, v1, v5, v2, v6, v3, v7] (exact for |v| < 65504).
__device__ __forceinline__ uint4 Bf16x8ToMoeHalves(uint4 v) {
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
  float f[8];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    f[2 * k] = __uint_as_float(u[k] << 16);
    f[2 * k + 1] = __uint_as_float(u[k] & 0xFFFF0000u);
  }
  auto pair = [](float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  };
  return make_uint4(pair(f[0], f[4]), pair(f[1], f[5]), pair(f[2], f[6]), pair(f[3], f[7]));
}

}  // namespace flotilla::kernels::cuda
