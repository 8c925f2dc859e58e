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

// MaskKernel once the host has written the masks: thread 0 of each block
// waits (acquire, system scope) until *ready, host memory, holds the step's
// number rows[capacity + 1]; past `timeout_ns` it raises *late and the block
// leaves its rows unmasked (the host then fails the step). The masks are
// host memory too and are read past any cache (they change every step).
__global__ void MaskWhenReadyKernel(float* __restrict__ logits, int vocab,
                                    const int32_t* __restrict__ rows, const uint32_t* masks,
                                    int capacity, const int32_t* ready, uint64_t timeout_ns,
                                    int32_t* late) {
  const int entry = blockIdx.y;
  const int32_t count = rows[capacity];
  if (entry >= count) return;
  __shared__ int ok;
  if (threadIdx.x == 0) {
    const int32_t want = rows[capacity + 1];
    uint64_t start = 0, now = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    ok = 1;
    for (;;) {
      int32_t seen;
      asm volatile("ld.acquire.sys.global.s32 %0, [%1];" : "=r"(seen) : "l"(ready) : "memory");
      if (seen == want) break;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
      if (now - start > timeout_ns) {
        atomicExch(late, 1);
        ok = 0;
        break;
      }
      __nanosleep(500);
    }
  }
  __syncthreads();
  if (!ok) return;
  const int words = (vocab + 31) / 32;
  const uint32_t* mask = masks + static_cast<size_t>(entry) * words;
  float* row = logits + static_cast<size_t>(rows[entry]) * vocab;
  for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < vocab; t += gridDim.x * blockDim.x) {
    if (!((__ldcv(mask + (t >> 5)) >> (t & 31)) & 1u)) row[t] = -INFINITY;
  }
}

}  // namespace

cudaError_t LaunchMaskLogitsWhenReady(float* logits, int vocab, const int32_t* rows,
                                      const uint32_t* host_masks, int capacity,
                                      const int32_t* ready, uint64_t timeout_ns, int32_t* late,
                                      cudaStream_t stream) {
  if (capacity <= 0 || vocab <= 0) return cudaSuccess;
  if (rows == nullptr || host_masks == nullptr || ready == nullptr || late == nullptr) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(kBlocksPerRow, capacity);
  MaskWhenReadyKernel<<<grid, kThreads, 0, stream>>>(logits, vocab, rows, host_masks, capacity,
                                                     ready, timeout_ns, late);
  return cudaGetLastError();
}

cudaError_t LaunchMaskLogits(float* logits, int vocab, const int32_t* rows, const uint32_t* masks,
                             const int32_t* count, int capacity, cudaStream_t stream) {
  if (capacity <= 0 || vocab <= 0) return cudaSuccess;
  const dim3 grid(kBlocksPerRow, capacity);
  MaskKernel<<<grid, kThreads, 0, stream>>>(logits, vocab, rows, masks, count);
  return cudaGetLastError();
}

cudaError_t LoadMaskKernels() {
  cudaFuncAttributes a;
  for (cudaError_t err :
       {cudaFuncGetAttributes(&a, MaskKernel), cudaFuncGetAttributes(&a, MaskWhenReadyKernel)}) {
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace flotilla::kernels::cuda
