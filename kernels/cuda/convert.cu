#include <cuda_bf16.h>

#include "kernels/cuda/convert.h"

namespace flotilla::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void Bf16ToF32Kernel(const __nv_bfloat16* in, float* out, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    out[i] = __bfloat162float(in[i]);
  }
}

__global__ void F32ToBf16Kernel(const float* in, __nv_bfloat16* out, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    out[i] = __float2bfloat16_rn(in[i]);
  }
}

int Blocks(size_t n) {
  size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 ? (b == 0 ? 1 : b) : 65535);
}

}  // namespace

cudaError_t LaunchBf16ToF32(const uint16_t* in, float* out, size_t n, cudaStream_t stream) {
  Bf16ToF32Kernel<<<Blocks(n), kThreads, 0, stream>>>(
      reinterpret_cast<const __nv_bfloat16*>(in), out, n);
  return cudaGetLastError();
}

cudaError_t LaunchF32ToBf16(const float* in, uint16_t* out, size_t n, cudaStream_t stream) {
  F32ToBf16Kernel<<<Blocks(n), kThreads, 0, stream>>>(
      in, reinterpret_cast<__nv_bfloat16*>(out), n);
  return cudaGetLastError();
}

}  // namespace flotilla::kernels::cuda
