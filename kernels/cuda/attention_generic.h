// CUDA: a plain, head-dim-generic attention over the paged cache with the
// exact semantics of LaunchAttention (attention.h). One CTA per (query token,
// q head); no tensor cores, no KV split. It serves head dims the fast kernels
// do not take (the tiny test models use 16 and 32) and is a second reference.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/cuda/attention.h"

namespace flotilla::kernels::cuda {

// head_dim in {16, 32, 64, 128}.
cudaError_t LaunchAttentionGeneric(const uint16_t* q, const PagedKvLayer& cache,
                                   const AttentionBatch& batch, int q_heads, const float* sinks,
                                   int window, float scale, uint16_t* out, cudaStream_t stream);

}  // namespace flotilla::kernels::cuda
