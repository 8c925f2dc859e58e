// CUDA: a second stream for launchers that run two independent chains of
// kernels side by side within one call (the MoE GEMMs' big tiles beside the
// experts' remainder tiles). Internal to kernels/cuda.
#pragma once

#include <cuda_runtime_api.h>

namespace flotilla::kernels::cuda {

// The calling thread's side stream on the current device (non-blocking, at
// the device's greatest stream priority, so that its grids' CTAs take the
// SMs that free up before those of grids of default-priority streams;
// created on first use, destroyed when the thread exits) and its fork and
// join events. Unavailable (cudaErrorNotReady) while `stream` is being
// captured into a graph before the side stream exists, so that no stream or
// event is created inside a capture.
struct SideStream {
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
};
cudaError_t CurrentSideStream(cudaStream_t stream, SideStream* out);

// The side stream waits for the work enqueued on `stream` so far.
cudaError_t ForkToSide(cudaStream_t stream, const SideStream& side);
// `stream` waits for the work enqueued on the side stream so far.
cudaError_t JoinFromSide(cudaStream_t stream, const SideStream& side);

}  // namespace flotilla::kernels::cuda
