#include <algorithm>

#include "kernels/cuda/expert_count.h"

namespace flotilla::kernels::cuda {
namespace {

__global__ void CountExpertRowsKernel(const int32_t* ids, int64_t n, int32_t bound,
                                      uint32_t* counts) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t id = ids[i];
    if (id >= 0 && id < bound) atomicAdd(&counts[id], 1u);
  }
}

}  // namespace

cudaError_t LaunchCountExpertRows(const int32_t* ids, int64_t n, int32_t bound, uint32_t* counts,
                                  cudaStream_t stream) {
  if (n < 0 || bound < 0 || (n > 0 && (ids == nullptr || counts == nullptr))) {
    return cudaErrorInvalidValue;
  }
  if (n == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 64);
  CountExpertRowsKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(ids, n, bound,
                                                                                counts);
  return cudaGetLastError();
}

}  // namespace flotilla::kernels::cuda
