// The FP8 side of the tensor-core attention kernel (attention.cu, template
// flag KV8): how a 64-key tile of an FP8 layer (PagedKvLayer::k8, layout in
// ops.h) reaches shared memory and becomes the bf16 tile the mma code reads.
//
// Per pipeline stage the ring holds the tile's e4m3 codes (K then V, [64
// keys][64 dims], 4 KB each) and its bf16 scales (K then V, 64 each), copied
// with 16-byte cp.async: a thread copies chunk c8 (16 codes) of keys k8row
// and k8row + 32 of K and of V; threads 0..15 copy the scales, 8 keys each.
// Before a tile is used, the CTA converts its codes exactly into one
// swizzled bf16 tile (e4m3 -> f16 -> f32 -> bf16 loses nothing) and its scales
// into f32 (0 for keys outside the rows' range, so a stale scale never
// reaches P V); the kernel multiplies each score by its key's K scale and each
// probability by its key's V scale in registers, after the softmax sum.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace flotilla::kernels::cuda::fp8_tile {

constexpr int kD = 64;
constexpr int kTile = 64;
constexpr int kCodeBytes = kTile * kD;                   // K or V codes of a tile
constexpr int kScaleBytes = kTile * 2;                   // K or V bf16 scales of a tile
constexpr int kStageBytes = 2 * kCodeBytes + 2 * kScaleBytes;  // 8448
constexpr int kConvertedBytes = 2 * kTile * kD * 2 + 2 * kTile * 4;  // bf16 K, V + f32 scales

// Two e4m3 codes (low byte first) as a bf16 pair, exactly.
__device__ __forceinline__ uint32_t CodesToBf16x2(uint16_t codes) {
  const __half2 h(__nv_cvt_fp8x2_to_halfraw2(codes, __NV_E4M3));
  const float2 f = __half22float2(h);
  __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
  return *reinterpret_cast<uint32_t*>(&b);
}

// Sixteen codes as two 16-byte chunks of bf16.
__device__ __forceinline__ void CodesToBf16x16(uint4 w, uint4* lo, uint4* hi) {
  lo->x = CodesToBf16x2(static_cast<uint16_t>(w.x));
  lo->y = CodesToBf16x2(static_cast<uint16_t>(w.x >> 16));
  lo->z = CodesToBf16x2(static_cast<uint16_t>(w.y));
  lo->w = CodesToBf16x2(static_cast<uint16_t>(w.y >> 16));
  hi->x = CodesToBf16x2(static_cast<uint16_t>(w.z));
  hi->y = CodesToBf16x2(static_cast<uint16_t>(w.z >> 16));
  hi->z = CodesToBf16x2(static_cast<uint16_t>(w.w));
  hi->w = CodesToBf16x2(static_cast<uint16_t>(w.w >> 16));
}

}  // namespace flotilla::kernels::cuda::fp8_tile
