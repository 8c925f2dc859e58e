// The FP8 side of the tensor-core attention kernel (attention.cu, template
// flag KV8): how a 64-key tile of an FP8 layer (PagedKvLayer::k8, layout in
// ops.h) reaches shared memory and becomes the bf16 tile the mma code reads.
//
// Per pipeline stage the ring holds the tile's e4m3 codes (K then V, [64
// keys][64 dims], 4 KB each) and its bf16 scales (K then V, 64 each), copied
// with 16-byte cp.async: a thread copies chunk c8 (16 codes) of keys k8row
// and k8row + 32 of K and of V; threads 0..15 copy the scales, 8 keys each.
// Before a tile is used, the CTA converts its codes exactly into one
// swizzled bf16 tile (every e4m3 value is a bf16 value) and its scales
// into f32 (0 for keys outside the rows' range, so a stale scale never
// reaches P V); the kernel multiplies each score by its key's K scale and each
// probability by its key's V scale in registers, after the softmax sum.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace flotilla::kernels::cuda::fp8_tile {

constexpr int kD = 64;
constexpr int kTile = 64;
constexpr int kCodeBytes = kTile * kD;                               // K or V codes of a tile
constexpr int kScaleBytes = kTile * 2;                               // K or V bf16 scales of a tile
constexpr int kStageBytes = 2 * kCodeBytes + 2 * kScaleBytes;        // 8448
constexpr int kConvertedBytes = 2 * kTile * kD * 2 + 2 * kTile * 4;  // bf16 K, V + f32 scales

// Two e4m3 codes (low byte first) as a bf16 pair, exactly, in integer and
// bf16 ops at full rate (the f16/f32 conversion instructions run at a
// quarter of it and made the FP8 decode slower than bf16): each code's sign
// goes to bit 15 and its exponent and mantissa to bits 4..14, which is the
// value times 2^-120 (e4m3's exponent bias is 7, bf16's 127), subnormal
// codes included; one exact multiply by 2^120 restores it.
__device__ __forceinline__ uint32_t CodesToBf16x2(uint16_t codes) {
  const uint32_t spread = __byte_perm(static_cast<uint32_t>(codes), 0u, 0x4140);
  const uint32_t bits = ((spread & 0x00800080u) << 8) | ((spread & 0x007f007fu) << 4);
  __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(&bits);
  v = __hmul2(v, __float2bfloat162_rn(0x1p120f));
  return *reinterpret_cast<uint32_t*>(&v);
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
