// CUDA: the MoE grouped GEMMs' wgmma tiles fed by tensor-map (TMA) copies,
// for tiles that carry no low parts of h (prefill and large batches).
// Internal to kernels/cuda: LaunchMoeGemm (moe_gemm.cu) calls it when
// MoeTuning::gemm_tma says so and the shapes allow it (MoeGemmTmaSupports).
//
// A CTA computes one (row tile, 128 features) tile as the CTA-per-tile wgmma
// kernel does (the same decode, scaling, wgmma and epilogue:
// moe_gemm_parts.cuh), but its stages (the activation tile, kBM rows x 128
// bytes, 128-byte swizzled by the copy, and the weights' 128 rows x 32 bytes
// of MXFP4 blocks) arrive as two tensor-map boxes that one thread issues,
// completing on an mbarrier per stage, instead of a cp.async per 16 bytes from
// every thread. gate_up reads x gathered in routing order (moe_gemm.cu's PermuteRowsKernel),
// so its activation tile is a box of contiguous rows, like down's h. Its
// wgmmas cover only the rows a tile holds (widths 32, 64, 96, 128 or 160), and a
// projection's remainder launch may overlap its big tiles' last wave
// (`overlapping` below).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/moe.h"

namespace flotilla::kernels::cuda {

namespace moe_gemm {
struct GemmArgs;
}

// Whether the TMA kernels take these weights: the block and scale arrays and
// every tile's scale rows (n x k / 32 bytes per expert, 128 rows per tile)
// start on 16 bytes, and the driver's tensor-map encoder is there; else
// LaunchMoeGemm feeds the tiles by cp.async.
bool MoeGemmTmaSupports(const MoeDeviceWeights& w);

// Bytes of the gathered activations gate_up reads: f16 [pairs, Padded64(H)].
size_t MoeGemmTmaGatherBytes(const MoeDeviceWeights& w, int pairs);

// One projection of `num_experts` experts over the tiles of `args` (`rows`
// rows each: 32, 64, 80, 128 or 160), `max_tiles` bounding their number on
// the host.
// `act` is the activation matrix in routing order, f16 [act_rows, kp]
// (gate_up: the gathered x; down: h). `overlapping`: the launch before it in
// the stream is this launcher's too, for the same projection (other tiles
// of the same inputs); this one may start while that one's last CTAs run,
// and ends only after it.
cudaError_t LaunchMoeGemmTma(bool down, const moe_gemm::GemmArgs& args, int num_experts, int rows,
                             int max_tiles, const uint16_t* act, int act_rows, cudaStream_t stream,
                             bool overlapping = false);

}  // namespace flotilla::kernels::cuda
