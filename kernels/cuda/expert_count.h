// Expert-load counters on the device: a rank counts the rows each of its
// expert slots runs, inside the step (graph-capturable, no host sync); the
// engine reads the counters back after the step on its own stream.
// CPU reference: kernels/cpu/expert_count.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace flotilla::kernels::cuda {

// counts[ids[i]] += 1 for i < n with 0 <= ids[i] < bound (atomics; padding
// rows, ids < 0, are skipped). Stream-ordered.
cudaError_t LaunchCountExpertRows(const int32_t* ids, int64_t n, int32_t bound, uint32_t* counts,
                                  cudaStream_t stream);

}  // namespace flotilla::kernels::cuda
