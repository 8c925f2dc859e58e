// CUDA: the dense ops of one gpt-oss step (MODEL.md "One layer, exactly"), the
// CPU references being the functions of kernels/cpu/ops.h of the same name.
// Pure CUDA runtime: no Abseil, gRPC or protobuf. bf16 values are passed as
// uint16_t (the bit pattern of __nv_bfloat16). Every launcher takes its sizes
// as host arguments and its per-token data from device memory, so a decode
// step can be captured once into a CUDA graph and replayed with new data.
// All launchers return cudaErrorInvalidValue for bad arguments, else the launch status.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace flotilla::kernels::cuda {

// out[t, :] = table[ids[t], :] as f32 (the residual stream is kept in f32).
// ids outside [0, vocab) give a zero row and are counted into *invalid_ids
// (device int32, may be nullptr).
cudaError_t LaunchEmbedding(const uint16_t* table, int vocab, int hidden, const int32_t* ids,
                            int tokens, float* out, int32_t* invalid_ids, cudaStream_t stream);

// Fused residual add + RMSNorm: if `add` is not null, x[t, :] += add[t, :]
// first (x is updated in place); then
// out[t, :] = bf16(x[t, :] / sqrt(mean(x[t, :]^2) + eps) * weight), math in f32.
cudaError_t LaunchAddRmsNorm(float* x, const float* add, const uint16_t* weight, int tokens,
                             int hidden, float eps, uint16_t* out, cudaStream_t stream);

// x[i] += add[i] for i < count (f32): a partial result joined from other
// ranks (the tensor-parallel O projection, the expert-parallel MoE output).
cudaError_t LaunchAddInPlace(float* x, const float* add, size_t count, cudaStream_t stream);

// Same for the rows listed in `rows` [count] only (the positions whose logits
// are wanted): out[i, :] = rmsnorm(x[rows[i], :]) * weight.
cudaError_t LaunchRmsNormRows(const float* x, const int32_t* rows, int count, const uint16_t* weight,
                              int hidden, float eps, uint16_t* out, cudaStream_t stream);

// cuBLASLt handle and workspace for the large-batch path of LaunchLinear;
// create one per stream owner. Opaque to callers.
struct LinearContext;
cudaError_t CreateLinearContext(LinearContext** ctx);
void DestroyLinearContext(LinearContext* ctx);
// Whether the large-batch path found cuBLASLt (opened at run time); without it
// large batches run the small-batch kernel over 16-token slices.
bool LinearUsesCublasLt(const LinearContext* ctx);
// Keeps an f32 copy of the bf16 bias [n] (converted on `stream`) for the
// cuBLASLt path of LaunchLinear, which otherwise converts the bias into
// staging before every large-batch call. For biases that stay in place and
// unchanged while the context lives (a model's projection biases).
cudaError_t CacheLinearBias(LinearContext* ctx, const uint16_t* bias, int n, cudaStream_t stream);
// Deterministic projections through this context: an accumulating GEMV keeps
// its whole input in one block per row tile, where it otherwise splits it
// over up to 3 blocks per SM whose sums meet in float atomics (in whatever
// order they finish). Off by default.
void SetLinearDeterministic(LinearContext* ctx, bool deterministic);

// y[t, o] (=|+=) sum_i x[t, i] * w[o, i] + bias[o]
//   x bf16 [tokens, in], w bf16 [out, in] (the checkpoint's row-major layout),
//   bias bf16 [out] or nullptr, y f32 [tokens, out]; accumulate: add into y
//   (used to add the O projection into the residual stream).
// Small batches (tokens <= 16) stream w once at full bandwidth on CUDA cores;
// larger ones run on tensor cores (cuBLASLt) with f32 accumulation. The choice
// depends on `tokens` only, so a captured graph keeps its path.
// in must be a multiple of 8.
cudaError_t LaunchLinear(LinearContext* ctx, const uint16_t* x, const uint16_t* w,
                         const uint16_t* bias, int tokens, int in, int out, bool accumulate,
                         float* y, cudaStream_t stream);

// A tensor-parallel projection of a few tokens with its all-reduce in the
// same launch: the GEMV above (this rank's share of `in`, bias on every rank
// that passes one), whose blocks send their rows to the TP peers of `lines`
// as flagged lines as soon as they have them and add the group's sum to
// `residual` (f32 [tokens, out], 8-byte aligned):
//   LaunchLinear(x, w, bias, tokens, in, out, false, part);
//   LaunchEpAllReduce(lines, part, tokens * out, stream, residual);
// with the same bits, minus one launch and the wait for the slowest block.
// Peers may run either form. Its blocks wait for the peers' blocks of the
// same index, so every rank must have its GPU to itself (a rank's waiting
// blocks must not hold the slots its peers' blocks need:
// TensorParallel::DeviceLines offers lines only then). LinearTpSumFits says whether the shape and
// the exchange (CUDA IPC with flagged-line buffers of at least tokens * out values, TP > 1) allow
// it; otherwise the launch returns cudaErrorInvalidValue.
struct EpLaunch;
constexpr int kLinearTpSumMaxTokens = 8;
bool LinearTpSumFits(const EpLaunch& lines, int tokens, int in, int out);
cudaError_t LaunchLinearTpSum(const uint16_t* x, const uint16_t* w, const uint16_t* bias,
                              int tokens, int in, int out, float* residual, const EpLaunch& lines,
                              cudaStream_t stream);

// Paged KV cache of one layer on the GPU: K and V each
// bf16 [num_blocks, kv_heads, block_size, head_dim]; position p of a sequence
// lives in block block_table[p / block_size] at slot p % block_size.
//
// FP8 layers (k8 set; k and v unused): K and V each hold, per block, at
// k8 + block * fp8_block_bytes, the e4m3 codes [kv_heads, block_size,
// head_dim] followed by one bf16 scale per (kv head, slot) [kv_heads,
// block_size]; value = e4m3 * scale (the rule of kernels/cpu/kv_fp8.h).
// fp8_block_bytes >= kv_heads * block_size * (head_dim + 2), a multiple of 16.
// The kernels that write the cache take bf16 layers only: an FP8 layer is
// written by LaunchKvQuantize (kv_quant.h) from bf16 staging.
struct PagedKvLayer {
  uint16_t* k = nullptr;
  uint16_t* v = nullptr;
  int num_blocks = 0;
  int block_size = 0;  // a power of two, 16..128
  int kv_heads = 0;
  int head_dim = 0;  // 64
  uint8_t* k8 = nullptr;
  uint8_t* v8 = nullptr;
  long long fp8_block_bytes = 0;
  bool fp8() const { return k8 != nullptr; }
};

// Row order of a fused QKV projection [(q_heads + 2 kv_heads) * head_dim, H]
// (and of its bias and output) within each q or k head.
//   kCheckpoint: the checkpoint's order, row j = dimension j.
//   kRopePairs: the two halves of each rotated pair next to each other:
//     row 2i = dimension i, row 2i + 1 = dimension i + head_dim / 2
//     (i < head_dim / 2), so a 16-row tile holds whole pairs. v rows keep the
//     checkpoint's order.
enum class QkvRowOrder { kCheckpoint, kRopePairs };

// The kRopePairs row of checkpoint row `row` of the fused QKV projection.
inline int QkvRopePairsRow(int row, int q_heads, int kv_heads, int head_dim) {
  if (row >= (q_heads + kv_heads) * head_dim) return row;  // v
  const int base = row - row % head_dim, j = row % head_dim, half = head_dim / 2;
  return base + (j < half ? 2 * j : 2 * (j - half) + 1);
}

// RoPE (YaRN inv_freq and scaling precomputed, MODEL.md) fused with the KV
// cache write. qkv f32 [tokens, (q_heads + 2 kv_heads) * head_dim], bias
// already added, laid out q heads | k heads | v heads, each head's rows in
// `order`. For each token: q_out bf16 [tokens, q_heads, head_dim] = rope(q)
// (in the checkpoint's dimension order); the cache slot
// slots[t] (= block * block_size + offset, or -1: do not store) receives
// rope(k) and v. positions int32 [tokens]; inv_freq f32 [head_dim / 2] on device.
cudaError_t LaunchRopeKvWrite(const float* qkv, const int32_t* positions, const int32_t* slots,
                              int tokens, int q_heads, const float* inv_freq, float scaling,
                              const PagedKvLayer& cache, uint16_t* q_out, cudaStream_t stream,
                              QkvRowOrder order = QkvRowOrder::kCheckpoint);

// At most kNormLinearMaxTokens tokens: LaunchAddRmsNorm(x, nullptr,
// norm_weight, tokens, in, eps, t_out) then LaunchLinear(t_out, w, bias, ...)
// in one launch: every block of the GEMV normalises the f32 residual x
// [tokens, in] itself (x is read only) and the normalised rows also go to
// t_out (bf16 [tokens, in], or nullptr), as AddRmsNorm rounds them up to the
// summation order of the sum of squares. in % 32 == 0.
constexpr int kNormLinearMaxTokens = 8;
cudaError_t LaunchNormLinear(const float* x, const uint16_t* norm_weight, float eps,
                             const uint16_t* w, const uint16_t* bias, int tokens, int in, int out,
                             bool accumulate, float* y, uint16_t* t_out, cudaStream_t stream,
                             bool deterministic = false);

// The router of a few tokens in one launch: LaunchNormLinear(x, norm_weight,
// eps, w, bias, tokens, in, experts, accumulate = true, logits, t_out) then
// LaunchRouterTopK(logits, tokens, experts, k, ids, weights, clear = true):
// the grid's last block ranks the rows once every block's sums are in.
// `logits` must be zero and is left zero; `done` is a device counter that
// must be zero and is left zero (one per stream of launches). deterministic
// (and LaunchNormLinear's): one block per row tile, no split input whose
// sums meet in float atomics.
// With `route` (experts <= kNormLinearTopKRouteMaxExperts): the last block
// also groups the chosen pairs by expert into the MoE layer's workspace and
// the blocks that write t_out write x's f16 copy too (kernels/cuda/moe.h
// MoeRouteTargets), so the layer is launched `routed`, one launch fewer.
// one_cluster (experts <= kNormLinearTopKRouteMaxExperts): the whole router
// as a single cluster of CTAs where the device and shape allow it
// (LaunchRouterCluster, kernels/cuda/router.h: deterministic whatever
// `deterministic`, the same bits as that mode; logits and done untouched),
// else the grid above.
struct MoeRouteTargets;  // kernels/cuda/moe.h
constexpr int kNormLinearTopKRouteMaxExperts = 256;
cudaError_t LaunchNormLinearTopK(const float* x, const uint16_t* norm_weight, float eps,
                                 const uint16_t* w, const uint16_t* bias, int tokens, int in,
                                 int experts, float* logits, uint16_t* t_out, int k, int32_t* ids,
                                 float* weights, unsigned* done, cudaStream_t stream,
                                 bool deterministic = false, const MoeRouteTargets* route = nullptr,
                                 bool one_cluster = true);

// How LaunchNormQkvRope starts streaming its weights before it waits for the
// previous kernel (programmatic dependent launch), passed with each call (an
// engine keeps its own: CudaEngineOptions::qkv_tuning); benchmarks compare.
struct NormQkvRopeTuning {
  // Each block asks L2 for its whole 16-row weight tile.
  bool l2_prefetch = true;
  // Each warp loads its first 4 slices of weights into registers (as the
  // LaunchLinear GEMV does).
  bool early_loads = true;
  // The next kernel may launch only once the projection is done (before the
  // epilogue) rather than at once, so its waiting blocks take no SM slots
  // earlier. (120b step on an H200, batch 1: 3.16 ms with both on, 3.26 with
  // the L2 prefetch alone, 3.30 with neither.)
  bool late_dependents = true;
  // Each warp also copies its next slices of weights (up to 7 of its ~11 at
  // 120b) into shared memory (cp.async) before it waits, so after the wait
  // the projection reads no global memory; taken where the block's shared
  // memory stays within 72 KB (three blocks per SM), i.e. up to 2 tokens at
  // 120b. (120b step on an H200, batch 1: 2.629-2.633 ms without, 2.556-2.558
  // with; batch 2 3.291-3.297 / 3.249-3.272.)
  bool stage_weights = true;
};

// Few tokens: the input RMSNorm, the QKV projection, RoPE and the KV cache
// write in one launch, equal to
//   LaunchAddRmsNorm(x, nullptr, norm_weight, tokens, hidden, eps, t)
//   LaunchLinear(t, wqkv, bqkv, tokens, hidden, (q_heads + 2 kv_heads) * head_dim)
//   LaunchRopeKvWrite(..., QkvRowOrder::kRopePairs)
// up to the summation order of the sum of squares (the normed activations are
// rounded to bf16 exactly as LaunchAddRmsNorm rounds them). x f32 [tokens, hidden]
// (read only); norm_weight bf16 [hidden]; wqkv bf16 and bqkv bf16 (or nullptr)
// in QkvRowOrder::kRopePairs; the rest as LaunchRopeKvWrite. Needs
// NormQkvRopeSupported(tokens, hidden, head_dim).
constexpr int kNormQkvRopeMaxTokens = 8;
bool NormQkvRopeSupported(int tokens, int hidden, int head_dim);
cudaError_t LaunchNormQkvRope(const float* x, const uint16_t* norm_weight, float eps,
                              const uint16_t* wqkv, const uint16_t* bqkv, int tokens, int hidden,
                              int q_heads, const int32_t* positions, const int32_t* slots,
                              const float* inv_freq, float scaling, const PagedKvLayer& cache,
                              uint16_t* q_out, cudaStream_t stream,
                              const NormQkvRopeTuning& tuning = NormQkvRopeTuning{});

// Router: for each row of logits f32 [rows, E] the K largest (descending, ties
// to the lower index as torch.topk does) and the softmax over those K only.
// E <= 256, K <= 8. clear_logits: the rows are set to zero once read (for a
// projection that accumulates into them next time).
cudaError_t LaunchRouterTopK(float* logits, int rows, int num_experts, int k, int32_t* ids,
                             float* weights, cudaStream_t stream, bool clear_logits = false);

}  // namespace flotilla::kernels::cuda
