// The FP8 side of the tensor-core attention kernel (attention.cu, template
// flag KV8): how a 64-key tile of an FP8 layer (PagedKvLayer::k8, layout in
// ops.h) reaches shared memory and becomes the bf16 tile the mma code reads.
//
// Per pipeline stage the ring holds the tile's e4m3 codes (K then V, [64
// keys][64 dims], 4 KB each, the four 16-code chunks of a key swizzled:
// CodeOffset) and its bf16 scales (K then V, 64 each), copied with 16-byte
// cp.async: a thread copies chunk c8 (16 codes) of keys k8row and k8row + 32
// of K and of V; threads 0..15 copy the scales, 8 keys each.
//
// Decode CTAs (one 16-row tile per warp) turn the codes straight into mma
// fragments: each lane loads a key's 16 codes (K) or, by ldmatrix on byte
// pairs, two keys' codes of two dimensions (V, paired by key with one byte
// permute), and CodesToF16x2x2 converts them to f16 operands (f16 mma; Q in
// f16, in the order of dimensions the codes come in). Prefill CTAs convert the codes
// exactly into one swizzled bf16 tile (every e4m3 value is a bf16 value)
// before each tile's mma. Either way the kernel multiplies each score by its
// key's K scale and each probability by its key's V scale in registers,
// after the softmax sum, and a key outside the rows' range gets V scale 0, so
// a stale scale never reaches P V.
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
