// CUDA: element-wise dtype conversion between bf16 and f32 (CPU reference in
// kernels/cpu/convert.h). Launchers are asynchronous on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace flotilla::kernels::cuda {

cudaError_t LaunchBf16ToF32(const uint16_t* in, float* out, size_t n, cudaStream_t stream);
cudaError_t LaunchF32ToBf16(const float* in, uint16_t* out, size_t n, cudaStream_t stream);

}  // namespace flotilla::kernels::cuda
