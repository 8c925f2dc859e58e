// CUDA: the KV write of an FP8 layer (PagedKvLayer with k8 set; layout in
// ops.h, scale rule in kernels/cpu/kv_fp8.h). The QKV kernels write a step's
// new K and V in bf16 into token-major staging; LaunchKvQuantize moves them
// into the cache as e4m3 codes with one bf16 scale per (position, kv head).
// Pure CUDA runtime: no Abseil, gRPC or protobuf; bf16 as uint16_t.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/ops.h"

namespace flotilla::kernels::cuda {

// k, v bf16 [tokens, kv_heads, head_dim] (staging); slots int32 [tokens]
// (device; block * block_size + offset, or -1 / out of range: not stored).
// head_dim 64 (one warp per (token, kv head), two values per lane). The codes
// are the hardware's (cvt.rn.satfinite.e4m3x2.f32), bit-identical to
// kernels::cpu::FloatToE4m3.
cudaError_t LaunchKvQuantize(const uint16_t* k, const uint16_t* v, const int32_t* slots, int tokens,
                             const PagedKvLayer& cache, cudaStream_t stream);

// Fills every block of an FP8 layer with finite pseudo-random codes and
// scales in [scale_lo, 2 * scale_lo) (a fresh arena that padded rows read).
cudaError_t LaunchFillKvFp8(const PagedKvLayer& cache, uint64_t seed, float scale_lo,
                            cudaStream_t stream);

}  // namespace flotilla::kernels::cuda
