#include "kernels/cuda/router.h"

#include "kernels/cuda/topk.cuh"

#include <cuda_bf16.h>

#include <climits>
#include <cmath>

namespace flotilla::kernels::cuda {
namespace {

constexpr int kTokens = 2;             // tokens per CTA (normalised into shared memory)

__device__ __forceinline__ float Bf16(uint16_t v) { return __uint_as_float(uint32_t(v) << 16); }

constexpr int kFusedThreads = 128;
constexpr int kFusedWarps = kFusedThreads / 32;  // one expert row per warp

__global__ void __launch_bounds__(kFusedThreads)
    RouterTopKFusedKernel(const float* __restrict__ x, const uint16_t* __restrict__ norm_weight,
                          float eps, const uint16_t* __restrict__ w,
                          const uint16_t* __restrict__ bias, int tokens, int hidden, int experts,
                          int k, float* logits, int* counters, int32_t* __restrict__ ids,
                          float* __restrict__ weights, uint16_t* __restrict__ normed_out) {
  extern __shared__ float xs[];  // [kTokens][hidden]
  __shared__ float partial[kFusedWarps][kTokens];
  __shared__ float inv_rms[kTokens];
  __shared__ int last;
  const int t0 = blockIdx.y * kTokens;
  const int nt = min(kTokens, tokens - t0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  // Launched programmatically dependent: pull this warp's weight row towards
  // L2 while the kernel before drains, then wait for its results (x).
  {
    const int e = blockIdx.x * kFusedWarps + warp;
    if (e < experts) {
      const char* wr = reinterpret_cast<const char*>(w + static_cast<size_t>(e) * hidden);
      for (int off = lane * 128; off < hidden * 2; off += 32 * 128) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(wr + off));
      }
    }
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");

  float ss[kTokens];
#pragma unroll
  for (int j = 0; j < kTokens; ++j) {
    ss[j] = 0.0f;
    if (j < nt) {
      const float4* row = reinterpret_cast<const float4*>(x + static_cast<size_t>(t0 + j) * hidden);
      for (int i = threadIdx.x; i < hidden / 4; i += kFusedThreads) {
        const float4 v = row[i];
        reinterpret_cast<float4*>(xs + j * hidden)[i] = v;
        ss[j] += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss[j] += __shfl_xor_sync(0xffffffffu, ss[j], o);
    if (lane == 0) partial[warp][j] = ss[j];
  }
  __syncthreads();
  if (threadIdx.x < kTokens) {
    float s = 0.0f;
    for (int q = 0; q < kFusedWarps; ++q) s += partial[q][threadIdx.x];
    inv_rms[threadIdx.x] = 1.0f / sqrtf(s / static_cast<float>(hidden) + eps);
  }
  __syncthreads();
  const bool write_normed = normed_out != nullptr && blockIdx.x == 0;
  for (int j = 0; j < nt; ++j) {
    const float r = inv_rms[j];
    for (int i = threadIdx.x; i < hidden; i += kFusedThreads) {
      const float v = __fmul_rn(Bf16(norm_weight[i]), __fmul_rn(xs[j * hidden + i], r));
      xs[j * hidden + i] = v;
      if (write_normed) {
        const __nv_bfloat16 b = __float2bfloat16(v);
        normed_out[static_cast<size_t>(t0 + j) * hidden + i] = *reinterpret_cast<const uint16_t*>(&b);
      }
    }
  }
  __syncthreads();

  const int e = blockIdx.x * kFusedWarps + warp;
  if (e < experts) {
    const uint16_t* wr = w + static_cast<size_t>(e) * hidden;
    float acc[kTokens] = {};
    // Four 16-byte loads in flight per lane.
    for (int base = lane * 8; base < hidden; base += 4 * 32 * 8) {
      uint4 packed[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int i = base + u * 32 * 8;
        packed[u] = i < hidden ? __ldg(reinterpret_cast<const uint4*>(wr + i)) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int i = base + u * 32 * 8;
        if (i >= hidden) break;
        const uint32_t words[4] = {packed[u].x, packed[u].y, packed[u].z, packed[u].w};
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
  if (counters == nullptr) return;  // logits only (LaunchRouterLogitsF32)
  // The last CTA of this token group ranks its tokens.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(&counters[blockIdx.y], 1) == static_cast<int>(gridDim.x) - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (warp < nt) {
    const int t = t0 + warp;
    WarpTopKSoftmax(logits + static_cast<size_t>(t) * experts, experts, k, ids + static_cast<size_t>(t) * k,
            weights + static_cast<size_t>(t) * k);
  }
  if (threadIdx.x == 0) counters[blockIdx.y] = 0;
}
}  // namespace

namespace {

// One launch of the router kernel; counters == nullptr: logits only.
cudaError_t LaunchRouter(const float* x, const uint16_t* norm_weight, float eps, const uint16_t* w,
                         const uint16_t* bias, int tokens, int hidden, int experts, int k,
                         int32_t* ids, float* weights, float* logits, int* counters,
                         uint16_t* normed_out, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  const size_t smem = sizeof(float) * kTokens * hidden;
  if (smem > 48 * 1024) {
    cudaError_t err = cudaFuncSetAttribute(RouterTopKFusedKernel,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3((experts + kFusedWarps - 1) / kFusedWarps, (tokens + kTokens - 1) / kTokens);
  cfg.blockDim = dim3(kFusedThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, RouterTopKFusedKernel, x, norm_weight, eps, w, bias, tokens,
                            hidden, experts, k, logits, counters, ids, weights, normed_out);
}

}  // namespace

cudaError_t LaunchRouterLogitsF32(const float* x, const uint16_t* norm_weight, float eps,
                                  const uint16_t* w, const uint16_t* bias, int tokens, int hidden,
                                  int experts, float* logits, cudaStream_t stream) {
  if (x == nullptr || norm_weight == nullptr || w == nullptr || logits == nullptr || tokens < 0 ||
      hidden <= 0 || hidden % 8 != 0 || hidden > 8192 || experts <= 0) {
    return cudaErrorInvalidValue;
  }
  return LaunchRouter(x, norm_weight, eps, w, bias, tokens, hidden, experts, 0, nullptr, nullptr,
                      logits, nullptr, nullptr, stream);
}

int RouterCounters(int tokens) { return (tokens + kTokens - 1) / kTokens; }

cudaError_t LaunchRouterTopKF32(const float* x, const uint16_t* norm_weight, float eps,
                                const uint16_t* w, const uint16_t* bias, int tokens, int hidden,
                                int experts, int k, int32_t* ids, float* weights, float* logits,
                                int* counters, uint16_t* normed_out, cudaStream_t stream) {
  static_assert(kTokens <= kFusedWarps, "one ranking warp per token of a group");
  if (x == nullptr || norm_weight == nullptr || w == nullptr || ids == nullptr ||
      weights == nullptr || logits == nullptr || counters == nullptr || tokens < 0 ||
      hidden <= 0 || hidden % 8 != 0 || hidden > 8192 || experts <= 0 ||
      experts > 32 * kTopKMaxPerLane || k <= 0 || k > kTopKMaxK || k > experts) {
    return cudaErrorInvalidValue;
  }
  return LaunchRouter(x, norm_weight, eps, w, bias, tokens, hidden, experts, k, ids, weights,
                      logits, counters, normed_out, stream);
}

}  // namespace flotilla::kernels::cuda
