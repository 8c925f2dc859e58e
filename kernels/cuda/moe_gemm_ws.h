// CUDA: the MoE grouped GEMMs' warp-specialized, persistent form for tiles of
// 64 and 128 rows (prefill and large batches). Internal to kernels/cuda:
// LaunchMoeGemm (moe_gemm.cu) calls it when MoeTuning::gemm_warp_specialized
// says so and the shapes allow it (MoeGemmWsSupports).
//
// One CTA per SM loops over (row tile, 192 features) units. A producer warp
// brings each stage of the reduction (64 values: the activation tile, kBM
// rows x 128 bytes, and the weights' 192 rows x 32 bytes of MXFP4 blocks) into
// a ring of shared-memory stages with two tensor-map (TMA) copies, and each
// tile's block scales with cp.async; three consumer warpgroups each decode 64
// of the features into f16 A fragments and multiply them against the
// activation stage with wgmma, one stage's wgmmas in flight while the next
// stage decodes. The decode, scaling and epilogue are those of the
// CTA-per-tile wgmma kernels (moe_gemm_parts.cuh): the results are the same
// up to the order of the float atomics.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/moe.h"

namespace flotilla::kernels::cuda {

namespace moe_gemm {
struct GemmArgs;
}

// Whether the warp-specialized kernels take these weights: a projection's
// scale rows (n x k / 32 bytes, and every 192-row tile's) start on 16 bytes.
bool MoeGemmWsSupports(const MoeDeviceWeights& w);

// Bytes of the gathered activations gate_up reads: f16 [pairs, Padded64(H)].
size_t MoeGemmWsGatherBytes(const MoeDeviceWeights& w, int pairs);

// One projection of `num_experts` experts over the big tiles of `args`
// (rows_per_tile rows: 64 or
// 128) and the small ones listed in small_expert / small_row0 / num_small
// (at most half as many rows), `max_units` bounding (big + small tiles) on
// the host. `act` is the activation matrix in routing order, f16 [act_rows,
// kp] (gate_up: the gathered x, GatherRows; down: h).
cudaError_t LaunchMoeGemmWs(bool down, const moe_gemm::GemmArgs& args, int num_experts,
                            int rows_per_tile, const int32_t* small_expert,
                            const int32_t* small_row0, const int32_t* num_small, int max_tiles,
                            const uint16_t* act, int act_rows, cudaStream_t stream);

// dst[i, :] = x[pair_of[i] / top_k, :] for the routed pairs i < *num_valid
// (the routing's total, at most `pairs`), f16 in the GEMMs' permuted order
// (as PermuteRows), zeros past k.
cudaError_t LaunchGatherRows(const uint16_t* x, const int32_t* pair_of, const int32_t* num_valid,
                             int pairs, int top_k, int k, int kp, uint16_t* dst,
                             cudaStream_t stream);

}  // namespace flotilla::kernels::cuda
