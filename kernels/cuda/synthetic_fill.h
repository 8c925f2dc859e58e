// CUDA: the synthetic checkpoint's values generated on the device, bit for bit
// the bytes `flotilla make-checkpoint` writes (the rules of
// common/synthetic_fill.h, shared with the host generator). Used to build a
// full-size model on the GPU with no checkpoint and no host copy.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/synthetic_fill.h"

namespace flotilla::kernels::cuda {

// Writes elements [first, first + count) of the tensor whose stream starts at
// `state0` to `out`: kNormal as bf16 (element_bytes 2) or f32 (4), kBytes and
// kScales as bytes (element_bytes 1). cudaErrorInvalidValue for any other
// element size or a null `out` with count > 0.
cudaError_t LaunchSyntheticFill(void* out, const SyntheticFill& fill, uint64_t state0,
                                int element_bytes, uint64_t first, uint64_t count,
                                cudaStream_t stream);

}  // namespace flotilla::kernels::cuda
