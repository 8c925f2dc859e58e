// The FP8 side of the tensor-core attention kernel (attention.cu, template
// flag KV8): how a 64-key tile of an FP8 layer (PagedKvLayer::k8, layout in
// ops.h) reaches shared memory and becomes the f16 operands of its mma.
//
// Per pipeline stage the ring holds the tile's e4m3 codes (K then V, [64
// keys][64 dims], 4 KB each, the four 16-code chunks of a key swizzled:
// CodeOffset) and its bf16 scales (K then V, 64 each), copied with 16-byte
// cp.async: a thread copies chunk c8 (16 codes) of keys k8row and k8row + 32
// of K and of V; threads 0..15 copy the scales, 8 keys each.
//
// Every e4m3 value is an f16 value, and cvt.rn.f16x2.e4m3x2 converts a pair
// exactly (CodesToF16x2x2). Decode CTAs (one 16-row tile per warp) feed the
// mma from the codes directly: each lane loads a key's 16 codes (K) or, by
// ldmatrix on byte pairs, two keys' codes of two dimensions (V, paired by
// key with one byte permute); Q is in f16, in the order of dimensions the
// codes come in. Prefill CTAs convert a tile's codes into one swizzled f16
// tile before its mma (Q turned into f16 in place once). Either way the
// kernel multiplies each score by its key's K scale and each probability by
// its key's V scale in registers, after the softmax sum, and a key outside
// the rows' range gets V scale 0, so a stale scale never reaches P V.
#pragma once

#include <cstdint>

namespace flotilla::kernels::cuda::fp8_tile {

constexpr int kD = 64;
constexpr int kTile = 64;
constexpr int kCodeBytes = kTile * kD;                               // K or V codes of a tile
constexpr int kScaleBytes = kTile * 2;                               // K or V bf16 scales of a tile
constexpr int kStageBytes = 2 * kCodeBytes + 2 * kScaleBytes;        // 8448
constexpr int kConvertedBytes = 2 * kTile * kD * 2 + 2 * kTile * 4;  // f16 K, V + f32 scales

// Byte offset of chunk c (16 codes) of `key` in a [64 keys][64 codes] tile:
// the chunk index is XORed with bits 1..2 of the key, so that ldmatrix rows of
// 8 consecutive keys, and 16-byte loads by lanes of two neighbouring keys, hit
// distinct banks.
__device__ __forceinline__ int CodeOffset(int key, int c) {
  return key * kD + ((c ^ ((key >> 1) & 3)) << 4);
}

// The two low and the two high e4m3 codes of a word (low byte first) as f16
// pairs, exactly (every e4m3 value is an f16 value), by the conversion
// instruction: fewer instructions than placing the bits with integer
// operations, on another pipe than they use.
__device__ __forceinline__ void CodesToF16x2x2(uint32_t codes, uint32_t* lo, uint32_t* hi) {
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\n"
      "cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(*lo), "=r"(*hi)
      : "r"(codes));
}

// Sixteen codes as two 16-byte chunks of f16 (codes 0..7, 8..15).
__device__ __forceinline__ void CodesToF16x16(uint4 w, uint4* lo, uint4* hi) {
  CodesToF16x2x2(w.x, &lo->x, &lo->y);
  CodesToF16x2x2(w.y, &lo->z, &lo->w);
  CodesToF16x2x2(w.z, &hi->x, &hi->y);
  CodesToF16x2x2(w.w, &hi->z, &hi->w);
}

}  // namespace flotilla::kernels::cuda::fp8_tile
