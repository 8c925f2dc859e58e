// The MoE layer's path for a few tokens (used by LaunchMoeLayer; internal to
// kernels/cuda): both projections of an expert in one kernel, cut along the
// intermediate dimension.
//
// CTA (touched expert i, slice s) owns intermediate features [s F, (s + 1) F)
// of expert active[i]: it runs the gate_up rows of those features for all
// the expert's tokens (bias and the clamped SwiGLU fused; h stays in shared
// memory as f16 high and low parts), then the down projection's columns of
// the same features for every output row, adding its partial sums, times the
// router weight, into the f32 output with atomics (slice 0 adds the bias).
// No CTA waits for another: the gate_up -> down dependency of one expert is
// inside a CTA, so there is no grid-wide handoff between the projections and
// their one-wave ramps and tails (the two-kernel path's cost at 1-8 tokens).
// Weight tiles stream through shared memory with 16-byte cp.async copies,
// the next tile's copies in flight while one is computed.
// Decode and mma as the decode kernels (fp4.cuh, mma.sync m16n8k16, f32
// sums). Not deterministic (the atomics' order varies); LaunchMoeLayer keeps
// the two-kernel path for deterministic calls.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace flotilla::kernels::cuda {

// The most routed (token, expert) pairs per call the slice path takes (its
// h slice lives in shared memory for all of an expert's tokens).
constexpr int kMoeSliceMaxPairs = 32;

struct MoeSliceArgs {
  const uint8_t* gate_up_blocks;  // [E, 2I, H/32, 16]
  const uint8_t* gate_up_scales;  // [E, 2I, H/32]
  const uint16_t* gate_up_bias;   // [E, 2I] bf16
  const uint8_t* down_blocks;     // [E, H, I/32, 16]
  const uint8_t* down_scales;     // [E, H, I/32]
  const uint16_t* down_bias;      // [E, H] bf16
  int hidden;                     // H
  int intermediate;               // I
  const uint4* xh;                // [T, H] f16 in the decode kernels' permuted order
  const int32_t* offset;          // routing (LaunchMoeRoute): [E + 1]
  const int32_t* pair_of;         // [P]
  const int32_t* active;          // [E]
  const int32_t* num_active;      // [1]
  int top_k;
  float limit, alpha;
  const float* topk_weights;  // [T, top_k]
  float* out;                 // [T, H] f32, added into
};

// The slice width F for a call of `pairs` routed pairs: `features` (32, 64
// or 96) when given, else by pairs (wider slices, fewer output atomics, once
// more experts fill the grid); the widest of those that divides I. 0 when the
// slice path does not take the call.
int MoeSliceFeatures(int pairs, int intermediate, int features);

// Launches the slice kernel for up to `slots` touched experts with slice
// width MoeSliceFeatures(pairs, I, features); `buffers`: weight tiles in
// flight per CTA (1 or 2); `warps` per CTA (4 or 8); `pdl`: programmatic
// dependent launch (the routing and x come from the kernel before).
cudaError_t LaunchMoeSlices(const MoeSliceArgs& args, int slots, int pairs, int features,
                            int buffers, int warps, bool pdl, cudaStream_t stream);

}  // namespace flotilla::kernels::cuda
