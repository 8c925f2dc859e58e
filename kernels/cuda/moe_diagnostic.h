// Benchmarks only: the MoE layer with its decode kernels' copies and math
// timed apart (moe_cuda_bench --variant copy-only / math-only, and the
// w4a8-* variants for moe_w4a8.h). All give wrong results; engines use
// LaunchMoeLayer (moe.h) and LaunchMoeW4a8Layer, which have neither.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_w4a8.h"

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

// LaunchMoeW4a8Layer (limit 7, alpha 1.702) with parts left out, bits of:
enum MoeW4a8Skip : unsigned {
  kW4a8SkipMath = 1,    // the tiles copy their weights and skip the wgmmas
  kW4a8SkipCopies = 2,  // they skip the copies and multiply whatever shared memory holds
  kW4a8SkipWait = 4,    // down tiles start without waiting for their expert's h
  kW4a8PrepOnly = 8,    // the prep kernel (routing, x's parts) alone
};
cudaError_t LaunchMoeW4a8LayerDiagnostic(const MoeW4a8Weights& w, const uint16_t* x,
                                         const int32_t* topk_ids, const float* topk_weights,
                                         int tokens, int top_k, float* out, void* workspace,
                                         size_t workspace_bytes, cudaStream_t stream,
                                         unsigned skip);

}  // namespace flotilla::kernels::cuda
