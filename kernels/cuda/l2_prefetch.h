// CUDA: ask L2 for a range of global memory ahead of the kernel that reads
// it, so a weight-streaming projection finds its weights on chip. Pure CUDA
// runtime.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace flotilla::kernels::cuda {

// Starts bulk L2 prefetches (cp.async.bulk.prefetch.L2) of [p, p + bytes)
// from a few small blocks and returns: the copies complete in the memory
// system after the kernel ends, and nothing waits for them. `p` must be
// 16-byte aligned; a tail of under 16 bytes is left out. A hint only: reads
// of the range are correct whether or not the lines arrived. Launch it on a
// stream beside the work it should overlap (the engine forks one off its
// step stream), never in front of a kernel on the same stream. bytes 0:
// nothing is launched.
cudaError_t LaunchL2Prefetch(const void* p, size_t bytes, cudaStream_t stream);

}  // namespace flotilla::kernels::cuda
