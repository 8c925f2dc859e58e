// Token masks of structured outputs applied to logit rows on the device, so
// that a constrained row keeps the device sampler (see sampling.h).
#include <cmath>

#include "kernels/cuda/sampling.h"

namespace flotilla::kernels::cuda {
namespace {

constexpr int kThreads = 256;
// Each masked row is cut into kSlicesPerRow slices of whole mask words (a
// slice of an o200k row: ~99 words, 3,142 tokens); a fixed grid of kBlocks
// blocks takes (row, slice) units in turn. The grid depends on nothing the
// step changes, so a captured graph serves any count, and a step with few
// masked rows launches few blocks whatever the capacity (one block per row
// and slice of the capacity cost ~0.1 ms at a capacity of 1,024 rows).
constexpr int kSlicesPerRow = 64;
constexpr int kBlocks = 264;

// The unit's slice of mask words [first, last) of a row of `words`.
__device__ void SliceOf(int slice, int words, int* first, int* last) {
  const int per_slice = (words + kSlicesPerRow - 1) / kSlicesPerRow;
  *first = min(words, slice * per_slice);
  *last = min(words, *first + per_slice);
}

// Sets the refused logits of tokens [first * 32, last * 32) of `row` to
// -inf. The block reads the slice's words kThreads at a time (a warp's 32
// neighbouring words in one request) into shared memory and its threads test
// their tokens' bits there, so allowed logits are never touched. `volatile`
// reads past any cache (host masks change every step).
template <bool kVolatile>
__device__ void MaskSlice(float* __restrict__ row, int vocab, const uint32_t* mask, int first,
                          int last) {
  __shared__ uint32_t staged[kThreads];
  for (int w0 = first; w0 < last; w0 += kThreads) {
    const int n = min(kThreads, last - w0);
    if (threadIdx.x < n) {
      staged[threadIdx.x] = kVolatile ? __ldcv(mask + w0 + threadIdx.x) : mask[w0 + threadIdx.x];
    }
    __syncthreads();
    const int t0 = w0 * 32, t1 = min(vocab, (w0 + n) * 32);
    for (int t = t0 + threadIdx.x; t < t1; t += kThreads) {
      if (!((staged[(t - t0) >> 5] >> (t & 31)) & 1u)) row[t] = -INFINITY;
    }
    __syncthreads();
  }
}

// This block's share of the (row, slice) units [0, units): unit u, taken
// by block u % gridDim.x, is slice u % kSlicesPerRow of masked entry
// u / kSlicesPerRow, whose logits are row rows[entry] and whose mask words
// start at masks + entry * words.
template <bool kVolatile>
__device__ void MaskUnits(float* __restrict__ logits, int vocab, const int32_t* __restrict__ rows,
                          const uint32_t* masks, int units) {
  const int words = (vocab + 31) / 32;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const int entry = u / kSlicesPerRow;
    int first = 0, last = 0;
    SliceOf(u % kSlicesPerRow, words, &first, &last);
    MaskSlice<kVolatile>(logits + static_cast<size_t>(rows[entry]) * vocab, vocab,
                         masks + static_cast<size_t>(entry) * words, first, last);
  }
}

__global__ void MaskKernel(float* __restrict__ logits, int vocab, const int32_t* __restrict__ rows,
                           const uint32_t* __restrict__ masks, const int32_t* __restrict__ count) {
  MaskUnits<false>(logits, vocab, rows, masks, *count * kSlicesPerRow);
}

// MaskKernel once the host has written the masks: thread 0 of each block
// with work waits (acquire, system scope) until *ready, host memory, holds
// the step's number rows[capacity + 1]; past `timeout_ns` it raises *late
// and the block masks nothing (the host then fails the step). The masks are
// host memory too.
__global__ void MaskWhenReadyKernel(float* __restrict__ logits, int vocab,
                                    const int32_t* __restrict__ rows, const uint32_t* masks,
                                    int capacity, const int32_t* ready, uint64_t timeout_ns,
                                    int32_t* late) {
  const int units = rows[capacity] * kSlicesPerRow;
  if (static_cast<int>(blockIdx.x) >= units) return;
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
  MaskUnits<true>(logits, vocab, rows, masks, units);
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
  MaskWhenReadyKernel<<<kBlocks, kThreads, 0, stream>>>(logits, vocab, rows, host_masks, capacity,
                                                        ready, timeout_ns, late);
  return cudaGetLastError();
}

cudaError_t LaunchMaskLogits(float* logits, int vocab, const int32_t* rows, const uint32_t* masks,
                             const int32_t* count, int capacity, cudaStream_t stream) {
  if (capacity <= 0 || vocab <= 0) return cudaSuccess;
  MaskKernel<<<kBlocks, kThreads, 0, stream>>>(logits, vocab, rows, masks, count);
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
