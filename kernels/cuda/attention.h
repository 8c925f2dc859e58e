// CUDA: gpt-oss attention with sinks and an optional sliding window over the
// paged KV cache (CPU reference: kernels/cpu/ops.h Attention; MODEL.md).
// The step writes the new keys/values into the cache first (LaunchRopeKvWrite
// in ops.h), so every key a query sees is read from the cache.
// Pure CUDA runtime: no Abseil, gRPC or protobuf; bf16 as uint16_t.
//
// Semantics for sequence b with L = seq_lens[b] cached positions (the new
// ones included) and n_b = q_start[b+1] - q_start[b] new query tokens: query
// i (0 <= i < n_b) sits at position p = L - n_b + i and sees keys j with
// max(0, p - window + 1) <= j <= p (window 0: no window); q head h uses kv
// head h / (q_heads / kv_heads); score = q.k * scale; softmax over the scores
// plus sinks[h], whose probability mass is dropped; out = sum p_j v_j.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/ops.h"

namespace flotilla::kernels::cuda {

struct AttentionBatch {
  const int32_t* block_tables = nullptr;  // device int32 [batch, max_blocks_per_seq]
  int max_blocks_per_seq = 0;
  const int32_t* seq_lens = nullptr;  // device int32 [batch]
  const int32_t* q_start = nullptr;   // device int32 [batch + 1], q_start[0] = 0
  int batch = 0;
  int total_q = 0;        // q_start[batch], known on the host
  int max_seq_len = 0;    // host upper bound of seq_lens (sizes the KV split)
  int max_q_per_seq = 0;  // host upper bound of n_b (1 for a pure decode step)
};

// Scratch for the split-KV partial results and arrival counters of
// `LaunchAttention` (0: none needed). Zero it once after allocating it (e.g.
// cudaMemset); every call leaves its counters at zero again, so one workspace
// serves any number of calls (graph replays too) of batches it is sized for.
// Calls that may overlap (other streams) need workspaces of their own.
size_t AttentionWorkspaceBytes(const AttentionBatch& batch, int q_heads, int head_dim);

// q bf16 [total_q, q_heads, head_dim]; sinks f32 [q_heads] (device);
// out bf16 [total_q, q_heads, head_dim]. Decode-shaped batches (max_q_per_seq
// small) split each sequence's KV range over blocks and reduce the partial
// softmaxes in the same kernel (the last split of a sequence and kv head to
// finish merges); prefill-shaped ones run a flash-style tensor-core kernel. Grid
// sizes depend only on the host fields, so a decode step captures into a graph.
// The decode (split-KV) path is taken when max_q_per_seq <= 4 and
// max_q_per_seq * (q_heads / kv_heads) <= 32 (up to 4 tokens per sequence for
// gpt-oss); seq_lens[b] must not exceed max_seq_len. head_dim must be 64 and
// block_size a power of two. The kernel is launched programmatically
// dependent (it waits for the previous kernel of the stream before reading).
// prefill_wgmma: prefill-shaped calls over a bf16 cache run Q K^T and P V on
// warpgroup MMA (wgmma); false keeps them on mma.sync (the FP8 cache's
// prefill always does).
cudaError_t LaunchAttention(const uint16_t* q, const PagedKvLayer& cache,
                            const AttentionBatch& batch, int q_heads, const float* sinks,
                            int window, float scale, uint16_t* out, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream, bool prefill_wgmma = true);

}  // namespace flotilla::kernels::cuda
