// Device helpers of the tensor-core GEMV (linear.cu) shared with the fused
// norm + QKV + RoPE kernel (qkv.cu). Included by .cu files only.
#pragma once

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

}  // namespace flotilla::kernels::cuda
