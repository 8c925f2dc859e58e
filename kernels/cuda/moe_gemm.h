// CUDA: the MoE layer's two projections as grouped GEMMs on the tensor cores,
// for steps where experts receive many rows (prefill, large batches). Internal
// to kernels/cuda: LaunchMoeLayer (moe.cu) routes, then calls this when
// MoeTuning says so.
//
// Each CTA computes one tile of kBM rows (an expert's pairs, in the routing
// order) x 128 output features of that expert over the whole reduction:
// activations (f16) and the raw MXFP4 bytes stream into a 3- or 4-stage
// shared-memory ring (cp.async); each lane turns 32-bit words of FP4 nibbles
// into f16 pairs with byte permutes (fp4.cuh: fp4 * 2^-14), times the block
// scale as one f16x2 multiply (2^(s - 113 - c), c the row's shift, restored
// in the epilogue), and feeds, as register operand A, wgmma m64nNk16 (N =
// the tile's 32, 64, 80, 128 or 160 rows, or fewer when the tile holds fewer)
// against the activation stage, or with wgmma
// off mma.sync m16n8k16 (f32 accumulation both). The reduction runs in a permuted order
// within each 64-group so that those words map straight onto the fragments;
// the activations are stored in that order. A weight byte is decoded once per
// CTA, however many rows the tile holds.
//   gate_up: bias + clamped SwiGLU in the epilogue -> h f16 [pairs, I] in
//            routing order (so the down tiles read contiguous rows);
//   down:    bias, times the router weight, added into out with atomics.
// x in f16 (exact in its normal range) and h in f16 are the roundings beyond
// the decode kernels'; tests/kernels/moe_cuda_test.cc (GemmPathAtEverySize)
// bounds them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/moe.h"

namespace flotilla::kernels::cuda {

// The routing LaunchMoeRoute produces (device arrays).
struct MoeGemmRoute {
  const int32_t* count = nullptr;   // [E]
  const int32_t* offset = nullptr;  // [E + 1]
  const int32_t* pair_of = nullptr;  // [pairs], grouped by expert
};

// Passes over an expert's weights per expert that tiles of 160 rows
// (ExpertTileRows: 160 where they need fewer passes, else 128) save against
// tiles of 128, for experts of Poisson(rows_per_expert) rows: an expert of
// 129-160 rows takes one pass instead of a 128-row tile and a remainder.
double MoeGemmPassesSavedBy160Rows(double rows_per_expert);

// Whether a step of `pairs` routed pairs over `num_experts` experts takes
// 160-row tiles: when they save at least 0.15 passes per expert. Below that
// the 160-row kernel (128 registers, a few spilled) costs 2-3% more than
// the 128-row one for the same tiles (H200, 120b layer, 3,072 / 6,144
// tokens, kernels/README.md).
bool MoeGemmPrefers160Rows(int64_t pairs, int num_experts);

// Scratch the GEMM path needs beyond the routing: h, the permuted
// activations and the tile map.
size_t MoeGemmWorkspaceBytes(const MoeDeviceWeights& w, int tokens, int top_k);

// How LaunchMoeGemm runs a step (MoeTuning's GEMM fields, resolved for it).
struct MoeGemmOptions {
  // The tile height, 32, 64, 128 or 160 (the tensor-map kernels only; 128
  // otherwise): smaller tiles waste less tensor-core work on experts' last,
  // partly filled tiles; larger ones read each activation tile fewer times
  // and decode an expert's weights fewer times.
  int rows_per_tile = 128;
  // An expert's last tile, when at most half filled, as tiles of half the
  // height (32 rows without wgmma; 80-row tiles at 128- and 160-row tiling on
  // the tensor-map kernels).
  bool remainder_tiles = true;
  // Warpgroup MMA (the decoded weights as register operand A, the activation
  // stage as B) instead of mma.sync.
  bool wgmma = true;
  // `out` is f32 [tokens x top_k, H] instead of [tokens, H]: each routed
  // pair's weighted output in its own row (written by one CTA, into a zeroed
  // buffer), for a sum in a fixed order after.
  bool out_per_pair = false;
  // 32-row down tiles also multiply h's f16 low parts (h to ~22 bits, as the
  // decode kernels keep it); without, h is f16 alone (11 bits).
  bool h_low_part = true;
  // With wgmma, steps whose h carries no low parts run on the tensor-map-fed
  // kernels (moe_gemm_tma.h).
  bool tma = true;
  // Those kernels' big tiles and the experts' remainder tiles (which read and
  // write other rows of h) as two chains on two streams (side_stream.h), so
  // neither launch waits for the other's CTAs to find room on the SMs.
  bool two_streams = true;
};

// Both projections for `tokens` x `top_k` routed pairs, added into `out`
// (f32 [tokens, H], or per pair: MoeGemmOptions). `workspace` holds
// MoeGemmWorkspaceBytes bytes, 16-byte aligned.
cudaError_t LaunchMoeGemm(const MoeDeviceWeights& w, const uint16_t* x, const float* topk_weights,
                          int tokens, int top_k, float limit, float alpha, MoeGemmRoute route,
                          float* out, void* workspace, const MoeGemmOptions& options,
                          cudaStream_t stream);

}  // namespace flotilla::kernels::cuda
