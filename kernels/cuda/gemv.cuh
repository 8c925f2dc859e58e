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

// At most this many tokens per BlockInverseRms call.
constexpr int kRmsMaxTokens = 8;

// x.x^2 + x.y^2 + x.z^2 + x.w^2, in that order (both inverse-RMS forms
// below add a thread's terms with this, so their sums are the same bits).
__device__ __forceinline__ float SumSquares4(float4 v) {
  return v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
}

// The block-wide end of an inverse RMS: each thread's partial sums of
// squares ss[t] meet over the warp, then over the warps in order, and
// inv[t] = 1 / sqrt(sum / hidden + eps). Ends with a barrier.
template <int kTok, int kThreads>
__device__ __forceinline__ void FinishInverseRms(const float (&ss)[kTok], int tokens, int hidden,
                                                 float eps, float (*part)[kRmsMaxTokens],
                                                 float* inv) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int t = 0; t < kTok; ++t) {
    if (t < tokens) {
      float v = ss[t];
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) part[warp][t] = v;
    }
  }
  __syncthreads();
  if (threadIdx.x < tokens) {
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < kThreads / 32; ++k) s += part[k][threadIdx.x];
    inv[threadIdx.x] = 1.0f / sqrtf(s / static_cast<float>(hidden) + eps);
  }
  __syncthreads();
}

// inv[t] = 1 / sqrt(mean(x[t]^2) + eps) for the rows t < tokens <= kTok of the
// f32 x [tokens, hidden] (hidden % 4 == 0), by all kThreads threads of the
// block: all tokens' loads of 8 / kTok steps are in flight together. part is
// shared scratch of kThreads / 32 rows. Ends with a barrier (inv is ready).
// Thread i adds the float4s i, i + kThreads, ... of each row in that order.
template <int kTok, int kThreads>
__device__ __forceinline__ void BlockInverseRms(const float* __restrict__ x, int tokens,
                                                int hidden, float eps,
                                                float (*part)[kRmsMaxTokens], float* inv) {
  static_assert(kTok >= 1 && kTok <= kRmsMaxTokens, "one n8 tile of tokens");
  const int h4 = hidden >> 2;
  constexpr int kSteps = kRmsMaxTokens / kTok;
  float ss[kTok];
#pragma unroll
  for (int t = 0; t < kTok; ++t) ss[t] = 0.0f;
  for (int i0 = threadIdx.x; i0 < h4; i0 += kSteps * kThreads) {
    float4 v[kSteps][kTok];
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
#pragma unroll
      for (int t = 0; t < kTok; ++t) {
        const int i = i0 + u * kThreads;
        v[u][t] = t < tokens && i < h4
                      ? __ldg(reinterpret_cast<const float4*>(x + static_cast<size_t>(t) * hidden) + i)
                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
#pragma unroll
      for (int t = 0; t < kTok; ++t) ss[t] += SumSquares4(v[u][t]);
    }
  }
  FinishInverseRms<kTok, kThreads>(ss, tokens, hidden, eps, part, inv);
}

// BlockInverseRms for hidden <= 4 * kVec * kThreads, leaving each thread the
// float4s it read: held[t][m] = float4 threadIdx.x + m * kThreads of row t
// (zeros past the row or for t >= tokens). The same sums, bit for bit.
template <int kTok, int kThreads, int kVec>
__device__ __forceinline__ void BlockInverseRmsHeld(const float* __restrict__ x, int tokens,
                                                    int hidden, float eps,
                                                    float (*part)[kRmsMaxTokens], float* inv,
                                                    float4 (&held)[kTok][kVec]) {
  static_assert(kTok >= 1 && kTok <= kRmsMaxTokens, "one n8 tile of tokens");
  const int h4 = hidden >> 2;
#pragma unroll
  for (int m = 0; m < kVec; ++m) {
#pragma unroll
    for (int t = 0; t < kTok; ++t) {
      const int i = threadIdx.x + m * kThreads;
      held[t][m] =
          t < tokens && i < h4
              ? __ldg(reinterpret_cast<const float4*>(x + static_cast<size_t>(t) * hidden) + i)
              : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
  float ss[kTok];
#pragma unroll
  for (int t = 0; t < kTok; ++t) {
    ss[t] = 0.0f;
#pragma unroll
    for (int m = 0; m < kVec; ++m) {
      if (threadIdx.x + m * kThreads < h4) ss[t] += SumSquares4(held[t][m]);
    }
  }
  FinishInverseRms<kTok, kThreads>(ss, tokens, hidden, eps, part, inv);
}

// The GEMV epilogue's reduction: each of the block's kWarps warps holds a
// partial 16-row x (8 * kNt)-token tile in C fragments (acc[n] for token tile
// n: c0, c1 = row g, tokens 2q, 2q+1; c2, c3 = row g + 8, same); they meet in
// red. Thread (tok = threadIdx.x / 16, r = threadIdx.x % 16) returns the sum
// for row r and token tok (0 for tok >= tokens). Starts and ends with red
// written by this call only (a barrier between), so red may alias other
// shared memory whose readers are past a barrier.
template <int kNt, int kWarps>
__device__ __forceinline__ float SumWarpTiles(float (*red)[16][16 + 1],
                                              const float (&acc)[kNt][4], int tokens) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int n = 0; n < kNt; ++n) {
    red[warp][g][n * 8 + 2 * q] = acc[n][0];
    red[warp][g][n * 8 + 2 * q + 1] = acc[n][1];
    red[warp][g + 8][n * 8 + 2 * q] = acc[n][2];
    red[warp][g + 8][n * 8 + 2 * q + 1] = acc[n][3];
  }
  __syncthreads();
  const int tok = threadIdx.x >> 4, r = threadIdx.x & 15;
  float s = 0.0f;
  if (tok < tokens && tok < kNt * 8) {
#pragma unroll
    for (int k = 0; k < kWarps; ++k) s += red[k][r][tok];
  }
  return s;
}

}  // namespace flotilla::kernels::cuda
