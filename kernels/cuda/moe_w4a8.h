// CUDA: the MoE layer's decode sizes (1-4 tokens) on FP8 warpgroup MMA with
// activations kept exact (kernels/moe_notes.md, "W4A8 on wgmma: built and
// measured"). Same math as LaunchMoeLayer (moe.h). Benchmarks and tests use
// it; the engine does not (1-5% faster than the f16 decode on an H200, for a
// second copy of the experts).
//
// Weights: MoeW4a8Weights, re-laid once from the checkpoint layout
// (RelayMoeW4a8). Per projection, slabs of 64 weight rows x a share of the
// reduction (parts), block-major: for each 32-value block, each row's 16
// bytes as 4 words, word q holding values 4q..4q+3 (magnitudes at bits
// 4j..4j+2, signs at 8j+7) and 16+4q..16+4q+3 (magnitudes at 16+4j..,
// signs at 8j+3), then one byte per (block, row): the block's scale
// relative to the row's largest, k = s - S + 14 in 0..14 (15: the block is
// zero, or more than 2^14 below the row's largest and flushed to zero). A
// word then decodes into two e4m3 registers of wgmma's A fragment with two
// byte permutes through a per-k lookup of the 8 magnitudes times 2^(k - 8).
// The row's 2^(S - 133) multiplies once, after the sums.
//
// Activations: a token's x and an expert's h enter the tensor cores as e4m3
// parts under one power-of-two scale per 32-value block (the block's
// largest scaled into (224, 448]): x as a high and a low part (exact for
// bf16 values down to ~2^-10 of their block's largest), h as three (about
// 12 bits), each part a column of wgmma's N. Each block's wgmma writes
// registers of its own, which are added into f32 sums times the block's
// scales (FP8 MMA also keeps fewer bits than f32 across blocks).
//
// One call: a prep kernel (routing, the tokens' x parts, counters zeroed),
// then one launch of gate_up and down tiles: gate_up's parts meet in the
// last one to finish a row tile, which runs bias + SwiGLU and writes h's
// parts (a row tile's 32 features are one block of down's reduction); down
// tiles wait for their expert's h, then add into `out` with atomics.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/moe.h"

namespace flotilla::kernels::cuda {

// Most tokens one call takes.
constexpr int kMoeW4a8MaxTokens = 4;
// Weight rows per slab (one warpgroup's wgmma M), and the most experts (the
// routing keeps a counter per expert in shared memory).
constexpr int kMoeW4a8TileRows = 64;
constexpr int kMoeW4a8MaxExperts = 1024;

struct MoeW4a8Projection {
  int rows = 0;       // output rows (R)
  int row_tiles = 0;  // ceil(R / 64)
  int blocks = 0;     // 32-value blocks of the reduction (K / 32)
  int parts = 0;      // the reduction's split; blocks % parts == 0
  size_t slab_bytes = 0;
  uint8_t* slabs = nullptr;        // [E][row_tiles][parts] slabs
  uint8_t* row_exp = nullptr;      // [E][row_tiles * 64] S (0: the row is zero)
  const uint16_t* bias = nullptr;  // [E][R] bf16, the checkpoint's (not owned)
};

struct MoeW4a8Weights {
  int num_experts = 0;
  int hidden = 0;
  int intermediate = 0;
  MoeW4a8Projection gate_up;  // R = 2I, K = H
  MoeW4a8Projection down;     // R = H, K = I
  // Blocks flushed to zero at the re-layout (more than 2^14 below their
  // row's largest block).
  long long flushed_blocks = 0;
};

// Allocates `out` and re-lays every expert of `w` into it (synchronous on
// `stream`; `w` must stay allocated: the biases are borrowed). Returns
// cudaErrorInvalidValue for shapes it does not take.
cudaError_t RelayMoeW4a8(const MoeDeviceWeights& w, MoeW4a8Weights* out, cudaStream_t stream);
void FreeMoeW4a8(MoeW4a8Weights* w);

size_t MoeW4a8WorkspaceBytes(const MoeW4a8Weights& w, int tokens, int top_k);

// As LaunchMoeLayer (moe.h), for 1..kMoeW4a8MaxTokens tokens (not
// deterministic: a token's pairs meet in float atomics). The prep kernel
// waits for the stream's earlier work when `pdl` (programmatic launch).
cudaError_t LaunchMoeW4a8Layer(const MoeW4a8Weights& w, const uint16_t* x, const int32_t* topk_ids,
                               const float* topk_weights, int tokens, int top_k, float limit,
                               float alpha, float* out, void* workspace, size_t workspace_bytes,
                               int32_t* invalid_ids, cudaStream_t stream, bool pdl = true);

}  // namespace flotilla::kernels::cuda
