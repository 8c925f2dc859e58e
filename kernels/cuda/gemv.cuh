// Device helpers of the tensor-core GEMVs (linear.cu) shared with the fused
// norm + QKV + RoPE kernel (qkv.cu). Included by .cu files only.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace flotilla::kernels::cuda {

// 16-byte load that bypasses L1: each weight byte is read once.
__device__ __forceinline__ uint4 LoadStream(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

// c += A (16x16, row) . B (16x8, col), bf16 in, f32 accumulate.
__device__ __forceinline__ void Mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                    uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float Bf16Bits(uint32_t b) { return __uint_as_float(b << 16); }

__device__ __forceinline__ uint32_t ToBf16Bits(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

// Two normed activations packed as an mma operand (low half first), each
// bf16(w * (x * inv)) with AddRmsNormKernel's rounding.
__device__ __forceinline__ uint32_t NormPair(float x0, float x1, uint32_t w01, float inv) {
  const float a = __fmul_rn(Bf16Bits(w01 & 0xFFFFu), __fmul_rn(x0, inv));
  const float b = __fmul_rn(Bf16Bits(w01 >> 16), __fmul_rn(x1, inv));
  return ToBf16Bits(a) | (ToBf16Bits(b) << 16);
}

}  // namespace flotilla::kernels::cuda
