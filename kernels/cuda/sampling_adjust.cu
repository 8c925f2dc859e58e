// Logit penalties and bias as sparse in-place changes around a draw, and the
// raw log-probability of a token drawn from changed logits (see sampling.h).
#include "kernels/cuda/sampling.h"

namespace flotilla::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 128;

int BlocksFor(int capacity) {
  const int blocks = (capacity + kThreads - 1) / kThreads;
  return blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks);
}

// The CPU sampler's AdjustLogit, with the same float operations.
__device__ __forceinline__ float Adjust(float logit, float repetition, float add) {
  if (repetition != 1.0f) logit = logit > 0.0f ? __fdiv_rn(logit, repetition) : __fmul_rn(logit, repetition);
  return __fadd_rn(logit, add);
}

__global__ void AdjustKernel(float* __restrict__ logits, int vocab,
                             const LogitAdjustmentEntry* __restrict__ entries,
                             const int32_t* __restrict__ count, float* __restrict__ saved) {
  const int n = *count;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const LogitAdjustmentEntry e = entries[i];
    float* logit = logits + static_cast<size_t>(e.row) * vocab + e.token;
    saved[i] = *logit;
    *logit = Adjust(*logit, e.repetition, e.add);
  }
}

__global__ void RestoreKernel(float* __restrict__ logits, int vocab,
                              const LogitAdjustmentEntry* __restrict__ entries,
                              const int32_t* __restrict__ count, const float* __restrict__ saved) {
  const int n = *count;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const LogitAdjustmentEntry e = entries[i];
    logits[static_cast<size_t>(e.row) * vocab + e.token] = saved[i];
  }
}

__global__ void ReferenceLogprobKernel(const float* __restrict__ logits, int rows, int vocab,
                                       const int32_t* __restrict__ tokens,
                                       const int32_t* __restrict__ ref_tokens,
                                       const float* __restrict__ ref_logprobs,
                                       float* __restrict__ logprobs) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* row = logits + static_cast<size_t>(r) * vocab;
  const float log_normaliser = row[ref_tokens[r]] - ref_logprobs[r];
  logprobs[r] = row[tokens[r]] - log_normaliser;
}

}  // namespace

cudaError_t LaunchAdjustLogits(float* logits, int vocab, const LogitAdjustmentEntry* entries,
                               const int32_t* count, int capacity, float* saved,
                               cudaStream_t stream) {
  if (capacity <= 0) return cudaSuccess;
  AdjustKernel<<<BlocksFor(capacity), kThreads, 0, stream>>>(logits, vocab, entries, count, saved);
  return cudaGetLastError();
}

cudaError_t LaunchRestoreLogits(float* logits, int vocab, const LogitAdjustmentEntry* entries,
                                const int32_t* count, int capacity, const float* saved,
                                cudaStream_t stream) {
  if (capacity <= 0) return cudaSuccess;
  RestoreKernel<<<BlocksFor(capacity), kThreads, 0, stream>>>(logits, vocab, entries, count, saved);
  return cudaGetLastError();
}

cudaError_t LaunchLogprobsFromReference(const float* logits, int rows, int vocab,
                                        const int32_t* tokens, const int32_t* ref_tokens,
                                        const float* ref_logprobs, float* logprobs,
                                        cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  ReferenceLogprobKernel<<<(rows + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
      logits, rows, vocab, tokens, ref_tokens, ref_logprobs, logprobs);
  return cudaGetLastError();
}

cudaError_t LoadAdjustKernels() {
  cudaFuncAttributes a;
  for (cudaError_t err :
       {cudaFuncGetAttributes(&a, AdjustKernel), cudaFuncGetAttributes(&a, RestoreKernel),
        cudaFuncGetAttributes(&a, ReferenceLogprobKernel)}) {
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace flotilla::kernels::cuda
