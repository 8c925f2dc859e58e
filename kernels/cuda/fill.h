// CUDA: deterministic pseudo-random fills, so that full-size (120b-shaped)
// models and KV caches can be built on the device without a checkpoint.
// Pure CUDA runtime; bf16 as uint16_t.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace flotilla::kernels::cuda {

// p[i] = offset + scale * u_i with u_i uniform in [-1, 1), a hash of (seed, i).
cudaError_t LaunchFillBf16(uint16_t* p, size_t n, uint64_t seed, float scale, float offset,
                           cudaStream_t stream);
cudaError_t LaunchFillF32(float* p, size_t n, uint64_t seed, float scale, float offset,
                          cudaStream_t stream);

}  // namespace flotilla::kernels::cuda
