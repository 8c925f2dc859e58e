#include "kernels/cuda/router.h"

namespace flotilla::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;  // one expert row per warp
constexpr int kTokens = 2;             // tokens per CTA (normalised into shared memory)

__device__ __forceinline__ float Bf16(uint16_t v) { return __uint_as_float(uint32_t(v) << 16); }

__global__ void __launch_bounds__(kThreads)
    RouterLogitsKernel(const float* __restrict__ x, const uint16_t* __restrict__ norm_weight,
                       float eps, const uint16_t* __restrict__ w, const uint16_t* __restrict__ bias,
                       int tokens, int hidden, int experts, float* __restrict__ logits) {
  extern __shared__ float xs[];  // [kTokens][hidden]
  __shared__ float partial[kWarps][kTokens];
  __shared__ float inv_rms[kTokens];
  const int t0 = blockIdx.y * kTokens;
  const int nt = min(kTokens, tokens - t0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  // Sum of squares per token, then the normalised row into shared memory.
  float ss[kTokens];
#pragma unroll
  for (int j = 0; j < kTokens; ++j) {
    ss[j] = 0.0f;
    if (j < nt) {
      const float* row = x + static_cast<size_t>(t0 + j) * hidden;
      for (int i = threadIdx.x; i < hidden; i += kThreads) {
        const float v = row[i];
        xs[j * hidden + i] = v;
        ss[j] += v * v;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss[j] += __shfl_xor_sync(0xffffffffu, ss[j], o);
    if (lane == 0) partial[warp][j] = ss[j];
  }
  __syncthreads();
  if (threadIdx.x < kTokens) {
    float s = 0.0f;
    for (int k = 0; k < kWarps; ++k) s += partial[k][threadIdx.x];
    inv_rms[threadIdx.x] = rsqrtf(s / hidden + eps);
  }
  __syncthreads();
  for (int j = 0; j < nt; ++j) {
    const float r = inv_rms[j];
    for (int i = threadIdx.x; i < hidden; i += kThreads) {
      xs[j * hidden + i] = xs[j * hidden + i] * r * Bf16(norm_weight[i]);
    }
  }
  __syncthreads();

  const int e = blockIdx.x * kWarps + warp;
  if (e >= experts) return;
  const uint16_t* wr = w + static_cast<size_t>(e) * hidden;
  float acc[kTokens] = {};
  for (int i = lane * 8; i < hidden; i += 32 * 8) {
    const uint4 packed = *reinterpret_cast<const uint4*>(wr + i);
    const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float w0 = __uint_as_float(words[q] << 16);
      const float w1 = __uint_as_float(words[q] & 0xffff0000u);
#pragma unroll
      for (int j = 0; j < kTokens; ++j) {
        acc[j] += w0 * xs[j * hidden + i + 2 * q] + w1 * xs[j * hidden + i + 2 * q + 1];
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kTokens; ++j) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], o);
  }
  if (lane == 0) {
    const float b = bias != nullptr ? Bf16(bias[e]) : 0.0f;
    for (int j = 0; j < nt; ++j) logits[static_cast<size_t>(t0 + j) * experts + e] = acc[j] + b;
  }
}

}  // namespace

cudaError_t LaunchRouterLogitsF32(const float* x, const uint16_t* norm_weight, float eps,
                                  const uint16_t* w, const uint16_t* bias, int tokens, int hidden,
                                  int experts, float* logits, cudaStream_t stream) {
  if (x == nullptr || norm_weight == nullptr || w == nullptr || logits == nullptr || tokens < 0 ||
      hidden <= 0 || hidden % 8 != 0 || hidden > 8192 || experts <= 0) {
    return cudaErrorInvalidValue;
  }
  if (tokens == 0) return cudaSuccess;
  const size_t smem = sizeof(float) * kTokens * hidden;
  if (smem > 48 * 1024) {
    cudaError_t err = cudaFuncSetAttribute(RouterLogitsKernel,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  const dim3 grid((experts + kWarps - 1) / kWarps, (tokens + kTokens - 1) / kTokens);
  RouterLogitsKernel<<<grid, kThreads, smem, stream>>>(x, norm_weight, eps, w, bias, tokens,
                                                       hidden, experts, logits);
  return cudaGetLastError();
}

}  // namespace flotilla::kernels::cuda
