// Token masks of structured outputs applied to logit rows on the device, so
// that a constrained row keeps the device sampler (see sampling.h).
#include <cmath>

#include "kernels/cuda/sampling.h"

namespace flotilla::kernels::cuda {
namespace {

constexpr int kThreads = 256;
// Blocks per masked row: a grid-stride loop covers the vocabulary (201,088
// tokens are ~12 passes of 64 x 256 threads), so the grid depends only on
// the capacity and a captured graph serves any count.
constexpr int kBlocksPerRow = 64;

// One thread per token: a warp reads one mask word (a broadcast) and writes
// -inf only where a bit is clear, so allowed logits are never touched.
__global__ void MaskKernel(float* __restrict__ logits, int vocab, const int32_t* __restrict__ rows,
                           const uint32_t* __restrict__ masks, const int32_t* __restrict__ count) {
  const int entry = blockIdx.y;
  if (entry >= *count) return;
  const int words = (vocab + 31) / 32;
  const uint32_t* mask = masks + static_cast<size_t>(entry) * words;
  float* row = logits + static_cast<size_t>(rows[entry]) * vocab;
  for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < vocab; t += gridDim.x * blockDim.x) {
    if (!((mask[t >> 5] >> (t & 31)) & 1u)) row[t] = -INFINITY;
  }
}

}  // namespace

cudaError_t LaunchMaskLogits(float* logits, int vocab, const int32_t* rows, const uint32_t* masks,
                             const int32_t* count, int capacity, cudaStream_t stream) {
  if (capacity <= 0 || vocab <= 0) return cudaSuccess;
  const dim3 grid(kBlocksPerRow, capacity);
  MaskKernel<<<grid, kThreads, 0, stream>>>(logits, vocab, rows, masks, count);
  return cudaGetLastError();
}

}  // namespace flotilla::kernels::cuda
