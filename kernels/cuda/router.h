// CUDA: the router of a few tokens as one thread-block cluster (router.cu),
// the form LaunchNormLinearTopK (ops.h) takes when it fits. Pure CUDA runtime.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace flotilla::kernels::cuda {

struct MoeRouteTargets;  // kernels/cuda/moe.h

// LaunchNormLinearTopK's work (the post-attention RMSNorm of the f32 residual
// x [tokens, in], the projection onto `experts` logits with bias, the top-k
// and its softmax, optionally the MoE's routing and f16 x) in one launch of a
// single cluster of CTAs, each holding a slice of the router's rows in shared
// memory: its weights are copied before the launch waits for the previous
// kernel, the slices' logits meet in the first CTA's shared memory (no
// global atomics, no grid-wide ticket) and that CTA ranks them. The logits
// are summed in the order of LaunchNormLinearTopK's deterministic mode, so
// the chosen experts and weights are those bits; global logits and the
// ranking counter are not touched. tokens <= kNormLinearMaxTokens,
// in % 32 == 0.
// cudaErrorNotSupported (nothing launched) when the shape or the device does
// not allow it: in > 4096, more rows than 16 per CTA of the largest cluster
// the device runs, or more shared memory than a CTA may have; the caller then
// launches the grid-wide form.
cudaError_t LaunchRouterCluster(const float* x, const uint16_t* norm_weight, float eps,
                                const uint16_t* w, const uint16_t* bias, int tokens, int in,
                                int experts, uint16_t* t_out, int k, int32_t* ids, float* weights,
                                const MoeRouteTargets* route, cudaStream_t stream);

}  // namespace flotilla::kernels::cuda
