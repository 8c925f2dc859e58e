// Benchmarks only: the MoE layer with its decode kernels' copies and math
// timed apart (moe_cuda_bench --variant copy-only / math-only). Both give
// wrong results; engines use LaunchMoeLayer (moe.h), which has neither.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/moe.h"

namespace flotilla::kernels::cuda {

enum class MoeDiagnostic {
  kNone,      // LaunchMoeLayer itself
  kCopyOnly,  // the projections copy their weight tiles and skip the math
  kMathOnly,  // they skip the copies and decode whatever shared memory holds
};

// LaunchMoeLayer on the decode kernels (never the grouped GEMMs, nor the
// CUDA-core baseline's kernels, which have no such split) with `diagnostic`.
cudaError_t LaunchMoeLayerDiagnostic(const MoeDeviceWeights& w, const uint16_t* x,
                                     const int32_t* topk_ids, const float* topk_weights, int tokens,
                                     int top_k, float limit, float alpha, float* out,
                                     void* workspace, size_t workspace_bytes, cudaStream_t stream,
                                     const MoeTuning& tuning, MoeDiagnostic diagnostic);

}  // namespace flotilla::kernels::cuda
