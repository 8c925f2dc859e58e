// CUDA: the gpt-oss MoE layer with MXFP4 experts (CPU reference: LinearMxfp4,
// SwigluClamped and the router-weighted sum in kernels/cpu/ops.h; MODEL.md
// gives the math). Pure CUDA runtime: no Abseil, gRPC or protobuf.
//
// One call, all on `stream`:
//   1. routing: the T*K (token, k) pairs are grouped by expert on the GPU
//      (counts, offsets, permutation, the list of experts touched);
//   2. gate_up: a grouped MXFP4 x activation GEMV per touched expert, the 32-value
//      blocks decoded in registers, bias and the clamped SwiGLU over the
//      interleaved gate/up rows fused in the epilogue -> h [T*K, I] f32;
//   3. down: the same GEMV over h with bias, times the router weight, added
//      into the output rows with atomics (fused scatter-add).
// Default path (MoeTuning): routing and the bf16 -> f16 conversion of x in one
// kernel (or, launched `routed`, both left by the router's kernel:
// MoeRouteTargets); each projection a CTA per 16 weight rows of a touched expert, the
// rows' MXFP4 bytes brought into shared memory by the bulk copy engine (read
// from HBM once per call, L2 evict-first), decoded to f16 in registers and
// multiplied on the tensor cores (mma.sync, f32 accumulation) against up to 8
// of the expert's tokens at a time. Activations enter the tensor cores as f16:
// x exactly for |x| < 65504 (normal range); h as an f16 high + low pair.
// Scale byte 0 (2^-127) is taken as 0. kernels/cuda/moe.cu has the details.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace flotilla::kernels::cuda {

// Device-resident expert weights of one layer, contiguous per tensor, in the
// checkpoint's own layout (MODEL.md): for `num_experts` experts,
//   gate_up_blocks [E, 2I, H/32, 16] u8, gate_up_scales [E, 2I, H/32] u8,
//   gate_up_bias [E, 2I] bf16, down_blocks [E, H, I/32, 16] u8,
//   down_scales [E, H, I/32] u8, down_bias [E, H] bf16.
// Expert slot e here is the index used in the routing ids.
struct MoeDeviceWeights {
  int num_experts = 0;
  int hidden = 0;        // H, a multiple of 32, at most 4096
  int intermediate = 0;  // I, a multiple of 32, at most 4096
  uint8_t* gate_up_blocks = nullptr;
  uint8_t* gate_up_scales = nullptr;
  uint16_t* gate_up_bias = nullptr;
  uint8_t* down_blocks = nullptr;
  uint8_t* down_scales = nullptr;
  uint16_t* down_bias = nullptr;

  // Bytes of one expert (blocks + scales + bias of both projections).
  size_t ExpertBytes() const;
};

// Allocates the six tensors (uninitialised). Returns cudaErrorInvalidValue for
// shapes the kernels do not take; on error nothing stays allocated.
cudaError_t AllocMoeWeights(int num_experts, int hidden, int intermediate, MoeDeviceWeights* w);
// Frees what AllocMoeWeights allocated and resets `w`.
void FreeMoeWeights(MoeDeviceWeights* w);

// Copies one expert's tensors (checkpoint layout, as in
// worker/model/weights.h ExpertWeights; host or device memory) into slot
// `slot`. Asynchronous on `stream`; pageable host memory makes it
// effectively synchronous.
cudaError_t UploadMoeExpert(const MoeDeviceWeights& w, int slot, const uint8_t* gate_up_blocks,
                            const uint8_t* gate_up_scales, const uint16_t* gate_up_bias,
                            const uint8_t* down_blocks, const uint8_t* down_scales,
                            const uint16_t* down_bias, cudaStream_t stream);

// The tensor-parallel MoE layout's share of one expert: from the full
// expert's tensors (checkpoint layout, intermediate size
// `full_intermediate`), the intermediate columns [begin, begin +
// w.intermediate) (begin a multiple of 32) into slot `slot`: gate_up rows
// [2 begin, 2 (begin + w.intermediate)) with their biases, down's blocks and
// scales of those columns, and down's bias when `with_down_bias` (else zeros:
// exactly one rank of a TP group adds it). Asynchronous on `stream`.
cudaError_t UploadMoeExpertSlice(const MoeDeviceWeights& w, int slot, int full_intermediate,
                                 int begin, bool with_down_bias, const uint8_t* gate_up_blocks,
                                 const uint8_t* gate_up_scales, const uint16_t* gate_up_bias,
                                 const uint8_t* down_blocks, const uint8_t* down_scales,
                                 const uint16_t* down_bias, cudaStream_t stream);

// Fills every expert with deterministic pseudo-random weights derived from
// `seed` (uniform nibbles, scales 2^(-10..-5), biases in [-0.1, 0.1)), for
// tests and benchmarks at full shapes without a checkpoint.
cudaError_t LaunchFillMoeWeightsSynthetic(const MoeDeviceWeights& w, uint64_t seed,
                                          cudaStream_t stream);

// Scratch bytes LaunchMoeLayer needs for `tokens` tokens with `top_k` experts each.
// `deterministic` as LaunchMoeLayer's (it needs a row per routed pair more).
size_t MoeWorkspaceBytes(const MoeDeviceWeights& w, int tokens, int top_k,
                         bool deterministic = false);

// How LaunchMoeLayer runs, passed with each call (an engine keeps its own:
// CudaEngineOptions::moe_tuning). The defaults are the fastest measured;
// benchmarks and tests switch them to compare paths.
struct MoeTuning {
  // The first CUDA-core kernels (f32 FMAs per value), kept as the baseline.
  bool legacy_fma = false;
  // Tensor-core path: FP4 -> f16 through byte permutes (else shifts and masks).
  bool prmt_decode = true;
  // L2 evict-first hint on the weight copies (weights stream through once;
  // activations and routing stay in L2).
  bool evict_first = true;
  // Programmatic dependent launch: each kernel starts while the one before it
  // drains (the down projection brings in its weights before waiting for
  // gate_up's results). The first kernel waits for whatever the stream ran
  // before the call.
  bool pdl = true;
  // Weight tiles a CTA keeps in shared memory: 1 = one tile per CTA, a CTA for
  // every tile; 2 or 3 = persistent CTAs (as many as fit) that compute one
  // tile while the copies of the next ones are in flight (slower on an H100:
  // fewer warps resident, and the math, not the copies, sets the pace).
  int tile_buffers = 1;
  // With one tile buffer and at most this many tokens: gate_up and down in
  // one launch, each down tile starting once its expert's gate_up tiles are
  // done (not all of gate_up); 0 = always two launches. Figures in
  // kernels/README.md (MoE): the gain is the gap between the launches, which
  // matters while the layer is short.
  int fuse_projections_max_tokens = 8;
  // The down projection's reduction split over this many CTAs per 16-row tile
  // (their sums meet in the output atomics): more, smaller CTAs. H200, 120b
  // layer, us with 1 / 2 (moe_cuda_bench tc-split1 / tc, two runs): 1 token
  // 34.6-34.9 / 34.4, 8 tokens 163-164 / 170-172, 64 tokens 619-620 /
  // 648-653, 128 tokens 798-802 / 843-851, 160 tokens 863-870 / 925-926: one
  // CTA per tile, half the atomics.
  int down_split_k = 1;
  // Groups of 8 mma columns (tokens) per weight decode in the decode kernels:
  // 1, 2 or 4; 0 picks 4 from 16 routed pairs per expert, 2 from 8, else 1.
  int decode_groups = 0;
  // Grouped tensor-core GEMMs (moe_gemm.h) instead of the decode kernels once
  // a step routes at least this many (token, expert) pairs per expert on
  // average (0: always; negative: never). H200, 120b layer, decode kernels
  // against 32-row wgmma GEMM tiles (down_split_k 1, two runs): 5 pairs per
  // expert (160 tokens) 860-862 / 954 us, 6 (192) 937-939 / 954-957, 7 (224)
  // 1015-1019 / 959-961, 8 (256) 1220 / 978-979. At 6 the engine's batch-192
  // step is the same either way (43.38-43.48 ms from 6, 43.44-43.45 from 7).
  int gemm_min_pairs_per_expert = 6;
  // Steps below this many pairs per expert (the sizes the GEMMs took over
  // from the decode kernels) carry the 32-row tiles' h as f16 high + low
  // parts (~22 bits, as the decode kernels keep it; f16 alone moved a
  // near-tie routing of the tiny golden model past cuda_engine_test's
  // bound); larger steps (prefill) keep f16 h alone, as before. The low
  // parts cost ~5%: H200 120b engine step at batch 192 / 256 43.4 / 42.1 ms
  // with them, 41.3 / 40.0 without (kernels/moe_notes.md).
  int gemm_h_low_part_below_pairs = 16;
  // Their tile height: 32, 64, 128 or 160 rows; 0 picks by pairs per expert:
  // 160 where gemm_160_rows says so, 128 from 64 (H200, 120b layer, 64 /
  // 128 rows: 32 pairs per expert, 1024 tokens, 1115 / 1179 us; 64 pairs,
  // 2048 tokens, 1776 / 1731), 64 from 24.
  int gemm_rows_per_tile = 0;
  // 160-row tiles (tensor-map kernels) where they save enough passes over
  // the experts' weights (moe_gemm.h, MoeGemmPrefers160Rows): an expert of
  // 129-160 rows then takes one tile, not a 128-row tile and a remainder.
  bool gemm_160_rows = true;
  // An expert's last GEMM tile, when at most half filled, as smaller tiles
  // (moe_gemm.h says which).
  bool gemm_remainder_tiles = true;
  // GEMM tiles on warpgroup MMA (wgmma) instead of mma.sync.
  bool gemm_wgmma = true;
  // wgmma tiles fed by tensor-map copies (moe_gemm_tma.h) where h carries no
  // low parts, instead of cp.async from every thread.
  bool gemm_tma = true;
  // Their big tiles and the experts' remainder tiles on two streams (the
  // calling thread's side stream, kernels/cuda/side_stream.h), joined before
  // the layer ends (MoeGemmOptions::two_streams).
  bool gemm_two_streams = true;
};

// out[t, :] += sum_k topk_weights[t, k] * (Wd[e] swiglu(Wgu[e] x[t] + bgu[e]) + bd[e])
// with e = topk_ids[t, k].
//   x: bf16 [tokens, H]; topk_ids int32 / topk_weights f32 [tokens, top_k];
//   out: f32 [tokens, H], added into (pass a zeroed buffer or the residual);
//   workspace: MoeWorkspaceBytes() bytes, 16-byte aligned;
//   invalid_ids: device int32 that receives how many ids were outside
//     [0, num_experts) (those pairs are skipped), or nullptr.
// swiglu uses `limit` (7) and `alpha` (1.702) as in MODEL.md.
// deterministic: the same inputs give the same bits on every call. Without
// it, a token's K expert outputs are added into `out` with float atomics in
// the order the CTAs finish; with it, each pair's output goes to a zeroed row
// of its own (at most two writers per value: the down projection's split is
// capped at 2, and a + b == b + a), and one more kernel adds each token's K
// rows into `out` in choice order. Not on the CUDA-core baseline
// (MoeTuning::legacy_fma). `tuning` picks the kernels (MoeTuning). Returns
// cudaErrorInvalidValue for bad arguments, else the launch status.
// routed: the step's routing and f16 x are already in `workspace` where
// MoeRouteTargetsIn puts them (written by the router's kernel,
// LaunchNormLinearTopK with route targets), so the layer skips its own
// routing launch; the CUDA-core baseline routes again regardless.
cudaError_t LaunchMoeLayer(const MoeDeviceWeights& w, const uint16_t* x, const int32_t* topk_ids,
                           const float* topk_weights, int tokens, int top_k, float limit,
                           float alpha, float* out, void* workspace, size_t workspace_bytes,
                           int32_t* invalid_ids, cudaStream_t stream, bool deterministic = false,
                           const MoeTuning& tuning = MoeTuning{}, bool routed = false);

// Where LaunchMoeLayer keeps a step's routing (step 1 above) and its f16 copy
// of x inside its workspace, for `tokens` x `top_k` pairs: another kernel may
// write them (kernels/cuda/moe_route.cuh) and the layer be launched with
// `routed`. count, offset [experts + 1], active, num_active, invalid_ids as
// LaunchMoeRoute's; pair_of [pairs]; done: the fused decode launch's
// per-slot counters, zeroed by the routing; xh: [tokens, hidden] f16 in the
// decode kernels' fragment order.
struct MoeRouteTargets {
  int experts = 0;
  int32_t* count = nullptr;
  int32_t* offset = nullptr;
  int32_t* pair_of = nullptr;
  int32_t* active = nullptr;
  int32_t* num_active = nullptr;
  int32_t* done = nullptr;
  int32_t* invalid = nullptr;  // may be null
  uint16_t* xh = nullptr;
};
MoeRouteTargets MoeRouteTargetsIn(const MoeDeviceWeights& w, int tokens, int top_k,
                                  bool deterministic, void* workspace, int32_t* invalid_ids);

// Routing alone (step 1 above), exposed for tests. For P = tokens * top_k pairs:
//   expert_count [num_experts], expert_offset [num_experts + 1] (exclusive
//   prefix sum), pair_of [P]: the pair indices grouped by expert (order within
//   an expert unspecified), active [num_experts]: the touched experts in
//   ascending order, num_active [1], invalid_ids [1].
cudaError_t LaunchMoeRoute(const int32_t* topk_ids, int pairs, int num_experts,
                           int32_t* expert_count, int32_t* expert_offset, int32_t* pair_of,
                           int32_t* active, int32_t* num_active, int32_t* invalid_ids,
                           cudaStream_t stream);

// Whether LaunchMoeLayer takes the grouped-GEMM path for this step under
// `tuning` (it rounds x to f16 once more than the decode kernels and sums in
// another order: tests widen their tolerance for it).
bool MoeUsesGemm(int tokens, int top_k, int num_experts, const MoeTuning& tuning = MoeTuning{});

}  // namespace flotilla::kernels::cuda
