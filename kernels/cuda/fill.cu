#include <cuda_bf16.h>

#include "kernels/cuda/fill.h"

namespace flotilla::kernels::cuda {
namespace {

// splitmix64: a cheap, well-mixed hash of the element index.
__device__ __forceinline__ float UniformSym(uint64_t seed, uint64_t i) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (i + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

__global__ void FillBf16Kernel(uint16_t* p, size_t n, uint64_t seed, float scale, float offset) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    __nv_bfloat16 b = __float2bfloat16(offset + scale * UniformSym(seed, i));
    p[i] = *reinterpret_cast<uint16_t*>(&b);
  }
}

__global__ void FillF32Kernel(float* p, size_t n, uint64_t seed, float scale, float offset) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    p[i] = offset + scale * UniformSym(seed, i);
  }
}

unsigned GridFor(size_t n) {
  size_t blocks = (n + 255) / 256;
  return static_cast<unsigned>(blocks < 65536 ? (blocks == 0 ? 1 : blocks) : 65536);
}

template <typename T>
cudaError_t LaunchFill(void (*kernel)(T*, size_t, uint64_t, float, float), T* p, size_t n,
                       uint64_t seed, float scale, float offset, cudaStream_t stream) {
  if (p == nullptr && n != 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  kernel<<<GridFor(n), 256, 0, stream>>>(p, n, seed, scale, offset);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchFillBf16(uint16_t* p, size_t n, uint64_t seed, float scale, float offset,
                           cudaStream_t stream) {
  return LaunchFill(FillBf16Kernel, p, n, seed, scale, offset, stream);
}

cudaError_t LaunchFillF32(float* p, size_t n, uint64_t seed, float scale, float offset,
                          cudaStream_t stream) {
  return LaunchFill(FillF32Kernel, p, n, seed, scale, offset, stream);
}

}  // namespace flotilla::kernels::cuda
