// CudaEngine::Build: checks the shape, uploads (or fills) the weights piece
// by piece, allocates the step buffers and workspaces, sizes and places the
// KV arena and the step metadata, all through the engine's DeviceArena.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/fill.h"
#include "kernels/cuda/kv_quant.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/sampling.h"
#include "worker/engine/cuda_engine.h"
#include "worker/engine/cuda_engine_state.h"
#include "worker/engine/cuda_kv_host_tier.h"
#include "worker/engine/cuda_weight_feed.h"
#include "worker/engine/device_sampler.h"
#include "worker/engine/rank_shard.h"
#include "worker/engine/rope_params.h"
#include "worker/engine/step_layout.h"
#include "worker/model/expert_slice.h"
#include "worker/parallel/parallel_context.h"

namespace flotilla {
namespace {

namespace kc = kernels::cuda;
using Layer = CudaDeviceState::Layer;

// The sizes of what this rank holds.
struct BuildShape {
  int64_t H = 0, D = 0, I = 0;
  int64_t I_rank = 0;       // the experts' intermediate size here: a slice with the TP MoE layout
  int64_t NH = 0, NKV = 0;  // this rank's heads (all of them without tensor parallelism)
  int64_t E = 0, K = 0, V = 0, QKV = 0;
  ExpertSliceLayout slice;
};

BuildShape ShapeOf(const ModelConfig& c, const RankShard& shard) {
  BuildShape b;
  b.H = c.hidden_size;
  b.D = c.head_dim;
  b.I = c.intermediate_size;
  b.slice = ExpertSliceOf(b.H, b.I, shard.tp_rank, shard.tp_size);
  b.I_rank = shard.moe_tp ? b.slice.slice.size : b.I;
  b.NH = c.num_attention_heads / shard.tp_size;
  b.NKV = c.num_key_value_heads / shard.tp_size;
  b.E = c.num_local_experts;
  b.K = c.num_experts_per_tok;
  b.V = c.vocab_size;
  b.QKV = (b.NH + 2 * b.NKV) * b.D;
  return b;
}

absl::Status CheckBuild(const ModelConfig& c, const BuildShape& b,
                        const CudaEngineOptions& options) {
  if (b.H <= 0 || b.H % 32 != 0 || b.I <= 0 || b.I % 32 != 0 || b.NH <= 0 || b.NKV <= 0 ||
      b.NH % b.NKV != 0 || b.E <= 0 || b.K <= 0 || b.K > b.E || b.V <= 0 ||
      static_cast<int>(c.layer_types.size()) != c.num_hidden_layers ||
      (b.D != 16 && b.D != 32 && b.D != 64 && b.D != 128)) {
    return absl::InvalidArgumentError(
        "cuda engine: needs hidden and intermediate sizes that are multiples of 32, head_dim in "
        "{16, 32, 64, 128}, GQA heads, 0 < experts_per_tok <= experts and one layer type per "
        "layer");
  }
  if (options.kv_block_size < 16 || options.kv_block_size > 128 ||
      (options.kv_block_size & (options.kv_block_size - 1)) != 0) {
    return absl::InvalidArgumentError(
        "cuda engine: kv_block_size must be a power of two in [16, 128]");
  }
  if (options.kv_cache_dtype == KvCacheDtype::kFp8 && b.D != 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda engine: kv_cache_dtype fp8 needs head_dim 64 (the model has ", b.D, ")"));
  }
  if (options.max_batch_tokens <= 0 || options.max_sequences <= 0 ||
      options.max_sequences > options.max_batch_tokens) {
    return absl::InvalidArgumentError("cuda engine: need 0 < max_sequences <= max_batch_tokens");
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || options.device < 0 ||
      options.device >= devices) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda engine: no CUDA device ", options.device, " (", devices, " present)"));
  }
  return absl::OkStatus();
}

// The uploads read host or device memory alike (cudaMemcpyDefault): a weight
// feed may hand over pieces it generated on the device.

// Copies a possibly strided bf16 matrix into a dense [rows, cols] device block.
absl::Status UploadMatrix(const Bf16Matrix& m, uint16_t* dst, cudaStream_t stream) {
  return CudaStatus(
      cudaMemcpy2DAsync(dst, m.cols * sizeof(uint16_t), m.data, m.row_stride * sizeof(uint16_t),
                        m.cols * sizeof(uint16_t), m.rows, cudaMemcpyDefault, stream),
      "upload matrix");
}

absl::Status UploadVector(const Bf16Vector& v, uint16_t* dst, cudaStream_t stream) {
  return CudaStatus(
      cudaMemcpyAsync(dst, v.data, v.size * sizeof(uint16_t), cudaMemcpyDefault, stream),
      "upload vector");
}

// The rows of a q or k projection [heads * head_dim, cols] (or its bias, cols
// = 1) in QkvRowOrder::kRopePairs: per head, dimensions 0..D/2-1 go to the
// even rows and D/2..D-1 to the odd ones, two strided copies per head.
absl::Status UploadRopePairs(const uint16_t* src, size_t src_stride, int64_t rows, int64_t cols,
                             int64_t head_dim, uint16_t* dst, cudaStream_t stream) {
  const int64_t half = head_dim / 2;
  for (int64_t h0 = 0; h0 < rows; h0 += head_dim) {
    for (int64_t part = 0; part < 2; ++part) {
      const cudaError_t err =
          cudaMemcpy2DAsync(dst + (h0 + part) * cols, 2 * cols * sizeof(uint16_t),
                            src + (h0 + part * half) * src_stride, src_stride * sizeof(uint16_t),
                            cols * sizeof(uint16_t), half, cudaMemcpyDefault, stream);
      if (err != cudaSuccess) return CudaStatus(err, "upload q/k rows in rope-pair order");
    }
  }
  return absl::OkStatus();
}

absl::Status UploadMatrixRopePairs(const Bf16Matrix& m, int64_t head_dim, uint16_t* dst,
                                   cudaStream_t stream) {
  if (m.rows % head_dim != 0) {
    return absl::InvalidArgumentError("cuda engine: a q/k projection of partial heads");
  }
  return UploadRopePairs(m.data, m.row_stride, m.rows, m.cols, head_dim, dst, stream);
}

absl::Status UploadVectorRopePairs(const Bf16Vector& v, int64_t head_dim, uint16_t* dst,
                                   cudaStream_t stream) {
  if (v.size % head_dim != 0) {
    return absl::InvalidArgumentError("cuda engine: a q/k bias of partial heads");
  }
  return UploadRopePairs(v.data, 1, v.size, 1, head_dim, dst, stream);
}

// The embedding, model.norm and lm_head from `feed`, or (no feed) the
// benchmarks' fill from `seed`.
absl::Status UploadEmbeddingAndHead(CudaDeviceState& d, CudaWeightFeed* feed, uint64_t seed,
                                    const BuildShape& b) {
  const int64_t V = b.V, H = b.H;
  cudaStream_t s = d.stream;
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.embed, V * H));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.lm_head, V * H));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.final_norm, H));
  if (feed != nullptr) {
    FLOTILLA_ASSIGN_OR_RETURN(const Bf16Matrix embed, feed->Embedding(s));
    FLOTILLA_RETURN_IF_ERROR(UploadMatrix(embed, d.embed, s));
    FLOTILLA_ASSIGN_OR_RETURN(const Bf16Matrix lm_head, feed->LmHead(s));
    FLOTILLA_RETURN_IF_ERROR(UploadMatrix(lm_head, d.lm_head, s));
    FLOTILLA_ASSIGN_OR_RETURN(const Bf16Vector final_norm, feed->FinalNorm(s));
    return UploadVector(final_norm, d.final_norm, s);
  }
  const float in_scale_h = std::sqrt(3.0f / static_cast<float>(H));
  FLOTILLA_CUDA_RETURN(kc::LaunchFillBf16(d.embed, V * H, seed + 1, 1.0f, 0.0f, s));
  FLOTILLA_CUDA_RETURN(kc::LaunchFillBf16(d.lm_head, V * H, seed + 2, in_scale_h, 0.0f, s));
  FLOTILLA_CUDA_RETURN(kc::LaunchFillBf16(d.final_norm, H, seed + 3, 0.1f, 1.0f, s));
  return absl::OkStatus();
}

// One layer's dense weights and its MoE slots on the device; the bytes of
// the weights the layer holds.
absl::StatusOr<size_t> AllocLayer(CudaDeviceState& d, Layer& L, const BuildShape& b,
                                  const RankShard& shard, int layer) {
  const int64_t H = b.H, QKV = b.QKV, NH = b.NH, D = b.D, E = b.E;
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&L.input_norm, H));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&L.post_norm, H));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&L.wqkv, QKV * H));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&L.bqkv, QKV));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&L.wo, H * NH * D));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&L.bo, H));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&L.router, E * H));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&L.router_bias, E));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&L.sinks, NH));
  size_t bytes = (2 * H + QKV * H + QKV + H * NH * D + H + E * H + E) * 2 + NH * 4;
  FLOTILLA_CUDA_RETURN(kc::AllocMoeWeights(shard.max_slots, static_cast<int>(H),
                                           static_cast<int>(b.I_rank), &L.moe));
  bytes += L.moe.ExpertBytes() * shard.slot_expert[layer].size();
  d.arena->Count(L.moe.ExpertBytes() * shard.max_slots);
  return bytes;
}

// A layer's attention, norms and router from the feed: q and k rows in
// QkvRowOrder::kRopePairs (the order both QKV paths of the step read), v
// rows as in the checkpoint.
absl::Status UploadLayerAttention(Layer& L, const LayerWeights& src, const BuildShape& b,
                                  int tp_rank, cudaStream_t s) {
  const int64_t H = b.H, D = b.D, NH = b.NH, NKV = b.NKV;
  const AttentionWeights& a = src.attn;
  FLOTILLA_RETURN_IF_ERROR(UploadVector(src.input_norm, L.input_norm, s));
  FLOTILLA_RETURN_IF_ERROR(UploadVector(src.post_attn_norm, L.post_norm, s));
  FLOTILLA_RETURN_IF_ERROR(UploadMatrixRopePairs(a.wq, D, L.wqkv, s));
  FLOTILLA_RETURN_IF_ERROR(UploadMatrixRopePairs(a.wk, D, L.wqkv + NH * D * H, s));
  FLOTILLA_RETURN_IF_ERROR(UploadMatrix(a.wv, L.wqkv + (NH + NKV) * D * H, s));
  FLOTILLA_RETURN_IF_ERROR(UploadVectorRopePairs(a.bq, D, L.bqkv, s));
  FLOTILLA_RETURN_IF_ERROR(UploadVectorRopePairs(a.bk, D, L.bqkv + NH * D, s));
  FLOTILLA_RETURN_IF_ERROR(UploadVector(a.bv, L.bqkv + (NH + NKV) * D, s));
  FLOTILLA_RETURN_IF_ERROR(UploadMatrix(a.wo, L.wo, s));
  // o_proj's bias joins the TP sum on TP rank 0 only.
  if (tp_rank == 0) {
    FLOTILLA_RETURN_IF_ERROR(UploadVector(a.bo, L.bo, s));
  } else {
    FLOTILLA_CUDA_RETURN(cudaMemsetAsync(L.bo, 0, H * sizeof(uint16_t), s));
  }
  FLOTILLA_RETURN_IF_ERROR(UploadMatrix(src.router, L.router, s));
  FLOTILLA_RETURN_IF_ERROR(UploadVector(src.router_bias, L.router_bias, s));
  FLOTILLA_CUDA_RETURN(
      cudaMemcpyAsync(L.sinks, a.sinks.data(), NH * sizeof(float), cudaMemcpyHostToDevice, s));
  return absl::OkStatus();
}

// A layer's experts from the feed into their slots: whole experts, or this
// TP rank's slice of each with the tensor-parallel MoE layout.
absl::Status UploadLayerExperts(Layer& L, const LayerWeights& src,
                                const std::vector<int>& slot_expert, const RankShard& shard,
                                const BuildShape& b, cudaStream_t s) {
  for (size_t slot = 0; slot < slot_expert.size(); ++slot) {
    if (slot_expert[slot] < 0) continue;
    const ExpertWeights& x = src.experts[src.slot_of_expert[slot_expert[slot]]];
    if (shard.moe_tp) {
      FLOTILLA_CUDA_RETURN(kc::UploadMoeExpertSlice(
          L.moe, static_cast<int>(slot), static_cast<int>(b.I), b.slice.slice.begin,
          b.slice.down_bias, x.gate_up.blocks, x.gate_up.scales, x.gate_up_bias.data, x.down.blocks,
          x.down.scales, x.down_bias.data, s));
      continue;
    }
    FLOTILLA_CUDA_RETURN(kc::UploadMoeExpert(L.moe, static_cast<int>(slot), x.gate_up.blocks,
                                             x.gate_up.scales, x.gate_up_bias.data, x.down.blocks,
                                             x.down.scales, x.down_bias.data, s));
  }
  return absl::OkStatus();
}

// A layer's weights from the benchmarks' generator (layer seed `ls`).
absl::Status FillLayerSynthetic(Layer& L, uint64_t ls, const BuildShape& b, cudaStream_t s) {
  const int64_t H = b.H, QKV = b.QKV, NH = b.NH, D = b.D, E = b.E;
  const float in_scale_h = std::sqrt(3.0f / static_cast<float>(H));
  const float in_scale_o = std::sqrt(3.0f / static_cast<float>(NH * D));
  FLOTILLA_CUDA_RETURN(kc::LaunchFillBf16(L.input_norm, H, ls + 1, 0.1f, 1.0f, s));
  FLOTILLA_CUDA_RETURN(kc::LaunchFillBf16(L.post_norm, H, ls + 2, 0.1f, 1.0f, s));
  FLOTILLA_CUDA_RETURN(kc::LaunchFillBf16(L.wqkv, QKV * H, ls + 3, in_scale_h, 0.0f, s));
  FLOTILLA_CUDA_RETURN(kc::LaunchFillBf16(L.bqkv, QKV, ls + 4, 0.02f, 0.0f, s));
  FLOTILLA_CUDA_RETURN(kc::LaunchFillBf16(L.wo, H * NH * D, ls + 5, in_scale_o, 0.0f, s));
  FLOTILLA_CUDA_RETURN(kc::LaunchFillBf16(L.bo, H, ls + 6, 0.02f, 0.0f, s));
  FLOTILLA_CUDA_RETURN(kc::LaunchFillBf16(L.router, E * H, ls + 7, in_scale_h, 0.0f, s));
  FLOTILLA_CUDA_RETURN(kc::LaunchFillBf16(L.router_bias, E, ls + 8, 0.02f, 0.0f, s));
  FLOTILLA_CUDA_RETURN(kc::LaunchFillF32(L.sinks, NH, ls + 9, 0.5f, 0.0f, s));
  FLOTILLA_CUDA_RETURN(kc::LaunchFillMoeWeightsSynthetic(L.moe, ls + 10, s));
  return absl::OkStatus();
}

// Every weight of the model (this rank's share): the bytes held.
absl::StatusOr<size_t> UploadWeights(CudaDeviceState& d, const ModelConfig& c, CudaWeightFeed* feed,
                                     uint64_t seed, const BuildShape& b, const RankShard& shard) {
  cudaStream_t s = d.stream;
  size_t weight_bytes = (2 * b.V * b.H + b.H) * 2;
  FLOTILLA_RETURN_IF_ERROR(UploadEmbeddingAndHead(d, feed, seed, b));
  d.layers.resize(c.num_hidden_layers);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    Layer& L = d.layers[l];
    L.window = c.is_sliding(l) ? c.sliding_window : 0;
    FLOTILLA_ASSIGN_OR_RETURN(const size_t layer_bytes, AllocLayer(d, L, b, shard, l));
    weight_bytes += layer_bytes;
    if (feed == nullptr) {
      FLOTILLA_RETURN_IF_ERROR(
          FillLayerSynthetic(L, seed + 1000 * static_cast<uint64_t>(l + 1), b, s));
      continue;
    }
    FLOTILLA_ASSIGN_OR_RETURN(const LayerWeights src, feed->Layer(l, s));
    FLOTILLA_RETURN_IF_ERROR(UploadLayerAttention(L, src, b, shard.tp_rank, s));
    FLOTILLA_RETURN_IF_ERROR(UploadLayerExperts(L, src, shard.slot_expert[l], shard, b, s));
  }
  // The projections' biases in f32 once, for the cuBLASLt epilogue of the
  // steps with more tokens than the GEMV takes.
  for (const Layer& L : d.layers) {
    FLOTILLA_CUDA_RETURN(kc::CacheLinearBias(d.linear, L.bqkv, static_cast<int>(b.QKV), s));
    FLOTILLA_CUDA_RETURN(kc::CacheLinearBias(d.linear, L.bo, static_cast<int>(b.H), s));
    FLOTILLA_CUDA_RETURN(kc::CacheLinearBias(d.linear, L.router_bias, static_cast<int>(b.E), s));
  }
  FLOTILLA_CUDA_RETURN(cudaStreamSynchronize(s));
  return weight_bytes;
}

// YaRN's inverse frequencies on the device and its attention scaling.
absl::Status UploadRope(CudaDeviceState& d, const ModelConfig& c) {
  const std::vector<float> inv_freq = kernels::cpu::YarnInvFreq(YarnParamsOf(c));
  d.rope_scaling = kernels::cpu::YarnAttentionScaling(c.rope_scaling.factor);
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.inv_freq, inv_freq.size()));
  FLOTILLA_CUDA_RETURN(cudaMemcpyAsync(d.inv_freq, inv_freq.data(), inv_freq.size() * sizeof(float),
                                       cudaMemcpyHostToDevice, d.stream));
  return absl::OkStatus();
}

// Sharded ranks with expert slots: the rows each (layer, slot) ran, on the
// device and its pinned read-back mirror.
absl::Status AllocExpertCounters(CudaDeviceState& d, const ModelConfig& c, int max_slots) {
  const size_t counters = static_cast<size_t>(c.num_hidden_layers) * max_slots;
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.expert_counts, counters));
  FLOTILLA_CUDA_RETURN(cudaMemsetAsync(d.expert_counts, 0, counters * sizeof(uint32_t), d.stream));
  FLOTILLA_RETURN_IF_ERROR(d.AllocHost(&d.expert_counts_host, counters));
  FLOTILLA_CUDA_RETURN(cudaEventCreateWithFlags(&d.counts_event, cudaEventDisableTiming));
  return absl::OkStatus();
}

// The activations of the largest step (T tokens, B sequences).
absl::Status AllocActivations(CudaDeviceState& d, const ModelConfig& c,
                              const CudaEngineOptions& options, const BuildShape& b,
                              const RankShard& shard) {
  const int64_t T = options.max_batch_tokens, H = b.H, E = b.E, K = b.K;
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.x, T * H));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.t, T * H));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.qkv, T * b.QKV));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.q, T * b.NH * b.D));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.attn, T * b.NH * b.D));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.router_logits, T * E));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.router_done, 1));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.topk_ids, T * K));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.topk_w, T * K));
  d.max_slots = shard.max_slots;
  if (options.parallel != nullptr && !shard.moe_tp) {
    FLOTILLA_RETURN_IF_ERROR(AllocExpertCounters(d, c, shard.max_slots));
  }
  FLOTILLA_CUDA_RETURN(
      cudaMemsetAsync(d.router_logits, 0, static_cast<size_t>(T) * E * sizeof(float), d.stream));
  FLOTILLA_CUDA_RETURN(cudaMemsetAsync(d.router_done, 0, sizeof(unsigned), d.stream));
  if (options.record_routing) {
    FLOTILLA_RETURN_IF_ERROR(
        d.Alloc(&d.routing_record, static_cast<size_t>(c.num_hidden_layers) * T * K));
  }
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.final_t, d.logit_rows * H));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.logits, static_cast<size_t>(d.logit_rows) * b.V));
  if (options.parallel != nullptr && options.parallel->tp().size() > 1) {
    FLOTILLA_RETURN_IF_ERROR(
        d.Alloc(&d.group_logits, static_cast<size_t>(kMaxGroupLogitRows) * b.V));
  }
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.invalid, 1));
  if (options.parallel != nullptr) {
    FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.o_part, static_cast<size_t>(T) * H));
    FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.moe_y, static_cast<size_t>(T) * H));
  }
  return absl::OkStatus();
}

// The MoE workspace: for every routed row of a step, or (sharded with
// expert slots) for the rows a rank can receive in one dispatch: from each
// of the W ranks, its share of a step's tokens times K (the device
// context's capacity).
absl::Status AllocMoeWorkspace(CudaDeviceState& d, const CudaEngineOptions& options,
                               const BuildShape& b, const RankShard& shard) {
  const int T = options.max_batch_tokens;
  if (options.parallel != nullptr && !shard.moe_tp) {
    const int W = options.parallel->config().world_size();
    d.moe_rows = static_cast<size_t>(W) * CeilDiv(T, shard.tp_size) * b.K;
    d.moe_ws_bytes = kc::MoeWorkspaceBytes(d.layers[0].moe, static_cast<int>(d.moe_rows), 1,
                                           options.deterministic);
  } else {
    d.moe_rows = static_cast<size_t>(T) * b.K;
    d.moe_ws_bytes =
        kc::MoeWorkspaceBytes(d.layers[0].moe, T, static_cast<int>(b.K), options.deterministic);
  }
  return d.Alloc(reinterpret_cast<uint8_t**>(&d.moe_ws), d.moe_ws_bytes);
}

// Buffers for penalties, logit bias, token masks and logprobs (see
// CudaDeviceState) for `rows` rows.
absl::Status AllocSamplingExtras(CudaDeviceState& d, int rows, int vocab) {
  const int cap = CudaDeviceState::kAdjustCapacity, top = CudaDeviceState::kMaxTopLogprobs;
  d.mask_capacity = rows;
  d.mask_words = (vocab + 31) / 32;
  const size_t mask_ints = static_cast<size_t>(d.mask_capacity) * d.mask_words;
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.mask_rows, d.mask_capacity + 2));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.mask_late, 1));
  FLOTILLA_CUDA_RETURN(cudaMemsetAsync(d.mask_late, 0, sizeof(int32_t), d.stream));
  FLOTILLA_RETURN_IF_ERROR(d.AllocHost(&d.masks_host, mask_ints));
  FLOTILLA_RETURN_IF_ERROR(d.AllocHost(&d.mask_rows_host, d.mask_capacity + 2));
  FLOTILLA_RETURN_IF_ERROR(d.AllocHost(&d.mask_ready, 1));
  FLOTILLA_RETURN_IF_ERROR(d.AllocHost(&d.mask_late_host, 1));
  *d.mask_ready = 0;
  *d.mask_late_host = 0;
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.adjust, cap));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.adjust_saved, cap));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.adjust_count, 1));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.greedy_params, rows));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.ref_tokens, rows));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.ref_logprobs, rows));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.top_ids, static_cast<size_t>(rows) * top));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.top_logprobs, static_cast<size_t>(rows) * top));
  const std::vector<kc::SamplingRow> greedy(rows);  // temperature 0
  FLOTILLA_CUDA_RETURN(cudaMemcpy(d.greedy_params, greedy.data(), rows * sizeof(kc::SamplingRow),
                                  cudaMemcpyHostToDevice));
  FLOTILLA_RETURN_IF_ERROR(d.AllocHost(&d.adjust_host, cap + 1));
  FLOTILLA_RETURN_IF_ERROR(d.AllocHost(&d.top_ids_host, static_cast<size_t>(rows) * top));
  FLOTILLA_RETURN_IF_ERROR(d.AllocHost(&d.top_logprobs_host, static_cast<size_t>(rows) * top));
  return absl::OkStatus();
}

// The sampler's buffers for B rows over the vocabulary.
absl::Status AllocSampling(CudaDeviceState& d, int B, int V) {
  d.sample_ws_bytes = kc::SampleWorkspaceBytes(B, V);
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(reinterpret_cast<uint8_t**>(&d.sample_ws), d.sample_ws_bytes));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.sampled_tokens, B));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.sampled_logprobs, B));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.sample_params, B));
  return AllocSamplingExtras(d, B, V);
}

// Every step buffer and workspace but attention's (sized with the KV).
absl::Status AllocStepBuffers(CudaDeviceState& d, const ModelConfig& c,
                              const CudaEngineOptions& options, const BuildShape& b,
                              const RankShard& shard) {
  d.max_tokens = options.max_batch_tokens;
  d.max_seqs = options.max_sequences;
  d.logit_rows = std::max(options.max_sequences, 64);
  FLOTILLA_RETURN_IF_ERROR(AllocActivations(d, c, options, b, shard));
  FLOTILLA_RETURN_IF_ERROR(AllocMoeWorkspace(d, options, b, shard));
  return AllocSampling(d, options.max_sequences, c.vocab_size);
}

// The KV block groups of `c`: the full-attention layers (group 0) and, when
// the model has both kinds, the sliding-window layers (group 1). The kernels
// write every new position of a step into the cache.
KvBlockAllocatorOptions KvGroups(const ModelConfig& c, const CudaEngineOptions& o) {
  bool any_full = false, any_sliding = false;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    (c.is_sliding(l) && c.sliding_window > 0 ? any_sliding : any_full) = true;
  }
  KvBlockAllocatorOptions k;
  k.sliding =
      any_full && any_sliding ? std::vector<bool>{false, true} : std::vector<bool>{any_sliding};
  k.window = c.sliding_window;
  k.block_size = o.kv_block_size;
  k.prefix_cache = o.prefix_cache;
  k.write_whole_chunk = true;
  k.max_chunk_tokens = o.max_batch_tokens;
  // A pool per group: each group's blocks are sized for its own layers.
  for (size_t g = 0; g < k.sliding.size(); ++g) k.group_pools.push_back(static_cast<int>(g));
  return k;
}

// Attention scratch for any step: the split count depends on the batch
// (fewer sequences, more splits), so take the largest over every shape.
absl::Status AllocAttentionWorkspace(CudaDeviceState& d, const CudaEngineOptions& options,
                                     const BuildShape& b, int64_t max_context) {
  const int B = options.max_sequences, T = options.max_batch_tokens;
  const int64_t bs = options.kv_block_size;
  d.attn_ws_bytes = 0;
  for (int batch = 1; batch <= B; ++batch) {
    for (int q = 1; q <= 8 && q * batch <= T; ++q) {
      kc::AttentionBatch probe;
      probe.batch = batch;
      probe.total_q = q * batch;
      probe.max_seq_len = static_cast<int>(max_context);
      probe.max_q_per_seq = q;
      probe.max_blocks_per_seq = static_cast<int>(CeilDiv(max_context, bs));
      d.attn_ws_bytes = std::max(
          d.attn_ws_bytes,
          kc::AttentionWorkspaceBytes(probe, static_cast<int>(b.NH), static_cast<int>(b.D)));
    }
  }
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(reinterpret_cast<uint8_t**>(&d.attn_ws), d.attn_ws_bytes));
  // The split-KV merge keeps its arrival counters here; they start at zero
  // and every launch leaves them so.
  FLOTILLA_CUDA_RETURN(cudaMemsetAsync(d.attn_ws, 0, d.attn_ws_bytes, d.stream));
  return absl::OkStatus();
}

// The KV arena's geometry: a block holds K and V of every layer of one group
// (full or sliding layers); each group has its own pool of blocks and its
// layers index their own arrays with the pool's block ids.
struct KvArenaShape {
  KvBlockAllocatorOptions options;
  std::vector<int64_t> group_layers;      // per group: its layers
  std::vector<size_t> layer_block_bytes;  // per group: K or V of one layer in one block
  std::vector<bool> fp8;                  // per group: FP8 codes and scales
  // Per group: a block over every layer of the group, K and V.
  size_t block_bytes(size_t g) const { return 2 * layer_block_bytes[g] * group_layers[g]; }
};

KvArenaShape KvArenaShapeOf(CudaDeviceState& d, const ModelConfig& c,
                            const CudaEngineOptions& options, const BuildShape& b) {
  KvArenaShape k;
  k.options = KvGroups(c, options);
  d.kv_groups = static_cast<int>(k.options.sliding.size());
  k.group_layers.assign(d.kv_groups, 0);
  for (Layer& L : d.layers) {
    L.kv_group = d.kv_groups == 2 && L.window > 0 ? 1 : 0;
    ++k.group_layers[L.kv_group];
  }
  const size_t positions = static_cast<size_t>(b.NKV) * options.kv_block_size;
  for (int g = 0; g < d.kv_groups; ++g) {
    // Sliding-window layers stay bf16; FP8 keeps a bf16 scale per position
    // and kv head beside the codes, each block 16-byte aligned.
    const bool fp8 = options.kv_cache_dtype == KvCacheDtype::kFp8 && !k.options.sliding[g];
    k.fp8.push_back(fp8);
    k.layer_block_bytes.push_back(fp8 ? (positions * (b.D + 2) + 15) / 16 * 16
                                      : positions * b.D * sizeof(uint16_t));
  }
  return k;
}

// Blocks of each pool, scratch block 0 included: options.kv_num_blocks + 1
// each, or what this engine's share of the device leaves: gpu_memory_
// utilization of it, less what the engine holds already and room for the
// CUDA context, block tables, graphs and cuBLASLt; never more than is free
// now, nor more than max_sequences sequences of max_context tokens need.
// The sliding-window pool gets what max_sequences sequences reserve there
// (their windows and one step's reserve), at most half the bytes; the
// full-attention pool the rest.
absl::StatusOr<std::vector<int64_t>> KvBlocksToAllocate(CudaDeviceState& d,
                                                        const CudaEngineOptions& options,
                                                        KvArenaShape& k, int64_t max_context) {
  const size_t pools = k.options.sliding.size();
  if (options.kv_num_blocks > 0) return std::vector<int64_t>(pools, options.kv_num_blocks + 1);
  size_t free_bytes = 0, total_bytes = 0;
  FLOTILLA_CUDA_RETURN(cudaStreamSynchronize(d.stream));
  FLOTILLA_CUDA_RETURN(cudaMemGetInfo(&free_bytes, &total_bytes));
  constexpr double kContextReserve = 768.0 * (1 << 20);
  const double budget = static_cast<double>(total_bytes) * options.gpu_memory_utilization -
                        static_cast<double>(d.arena->allocated_bytes()) - kContextReserve;
  const double free_now = static_cast<double>(free_bytes) - kContextReserve / 2;
  double usable = std::max(0.0, std::min(budget, free_now));
  // What max_sequences sequences of max_context tokens reserve in each pool,
  // from a probe with the smallest valid pools: the needs do not depend on
  // the pool sizes, and its prefix cache holds ~28 bytes of host memory per
  // block (probe pools of 2^30 blocks took 51 GB of host memory in every GPU
  // worker as it started).
  k.options.pool_blocks.assign(pools, KvBlockAllocator::SmallestValidPool(k.options));
  FLOTILLA_ASSIGN_OR_RETURN(std::unique_ptr<KvBlockAllocator> probe,
                            KvBlockAllocator::Create(k.options));
  const std::vector<int64_t> need = probe->PoolBlocksForLength(max_context);
  std::vector<int64_t> blocks(pools, 0);
  for (size_t i = 0; i < pools; ++i) {
    // Allocated last to first: the sliding-window pool (1) before the full one.
    const size_t p = pools - 1 - i;
    const int64_t want =
        need[p] * options.max_sequences + (probe->pool_blocks(p) - probe->admission_blocks(p)) + 1;
    const double bytes = p > 0 ? usable / 2 : usable;
    blocks[p] = std::min<int64_t>(
        want, static_cast<int64_t>(bytes / static_cast<double>(k.block_bytes(p))));
    usable -= static_cast<double>(blocks[p]) * static_cast<double>(k.block_bytes(p));
  }
  return blocks;
}

// An FP8 full-attention layer's codes and scales: K and V each a block of
// layer_block_bytes per block id; filled with finite pseudo-random codes and
// scales like the bf16 arena.
absl::Status MakeFp8Layer(CudaDeviceState& d, kc::PagedKvLayer& kv, size_t layer_block_bytes,
                          uint64_t seed) {
  kv.k8 = reinterpret_cast<uint8_t*>(kv.k);
  kv.v8 = reinterpret_cast<uint8_t*>(kv.v);
  kv.fp8_block_bytes = static_cast<long long>(layer_block_bytes);
  kv.k = nullptr;
  kv.v = nullptr;
  FLOTILLA_CUDA_RETURN(kc::LaunchFillKvFp8(kv, seed, 1.0f, d.stream));
  return absl::OkStatus();
}

// FP8 layers' writes: the step's new K and V in bf16 and the staging slots
// 0..max_tokens-1 the QKV kernels write them at (LaunchKvQuantize then
// stores them in the cache).
absl::Status AllocKvStaging(CudaDeviceState& d, const BuildShape& b) {
  const size_t n = static_cast<size_t>(d.max_tokens) * b.NKV * b.D;
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.kv_stage_k, n));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.kv_stage_v, n));
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.kv_stage_slots, d.max_tokens));
  std::vector<int32_t> slots(d.max_tokens);
  for (int i = 0; i < d.max_tokens; ++i) slots[i] = i;
  FLOTILLA_CUDA_RETURN(cudaMemcpy(d.kv_stage_slots, slots.data(), slots.size() * sizeof(int32_t),
                                  cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

// Allocates the arena, each group's pool of `num_blocks[group]` blocks
// (pseudo-random contents: padded graph rows and ExtendSynthetic read them)
// and points each layer at its K and V arrays in its group's part (FP8 ones
// for the full-attention layers with kFp8).
absl::Status PlaceKvArena(CudaDeviceState& d, const KvArenaShape& k,
                          const std::vector<int64_t>& num_blocks, const BuildShape& b,
                          const CudaEngineOptions& options, uint64_t seed) {
  std::vector<size_t> group_offset(d.kv_groups, 0);  // bytes
  size_t bytes = 0;
  for (int g = 0; g < d.kv_groups; ++g) {
    group_offset[g] = bytes;
    bytes += static_cast<size_t>(num_blocks[g]) * k.block_bytes(g);
  }
  const size_t elems = bytes / sizeof(uint16_t);
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.kv_arena, elems));
  FLOTILLA_CUDA_RETURN(kc::LaunchFillBf16(d.kv_arena, elems, seed + 77, 1.0f, 0.0f, d.stream));
  char* arena = reinterpret_cast<char*>(d.kv_arena);
  std::vector<int> in_group(d.kv_groups, 0);
  for (Layer& L : d.layers) {
    const int g = L.kv_group;
    const size_t i = in_group[g]++;  // its index among its group's layers
    const size_t array_bytes = static_cast<size_t>(num_blocks[g]) * k.layer_block_bytes[g];
    kc::PagedKvLayer& kv = L.kv;
    kv.k = reinterpret_cast<uint16_t*>(arena + group_offset[g] + (2 * i) * array_bytes);
    kv.v = reinterpret_cast<uint16_t*>(arena + group_offset[g] + (2 * i + 1) * array_bytes);
    kv.num_blocks = static_cast<int>(num_blocks[g]);
    kv.block_size = options.kv_block_size;
    kv.kv_heads = static_cast<int>(b.NKV);
    kv.head_dim = static_cast<int>(b.D);
    if (k.fp8[g]) {
      FLOTILLA_RETURN_IF_ERROR(MakeFp8Layer(d, kv, k.layer_block_bytes[g], seed + 78 + i));
    }
  }
  if (options.kv_cache_dtype == KvCacheDtype::kFp8) FLOTILLA_RETURN_IF_ERROR(AllocKvStaging(d, b));
  return absl::OkStatus();
}

// The attention workspace, the KV arena and its block allocator (each
// pool's block 0 is scratch; the allocator hands out the others low to
// high). `max_context` comes back capped by what the arena holds.
absl::StatusOr<std::unique_ptr<KvBlockAllocator>> BuildKvCache(
    CudaDeviceState& d, const ModelConfig& c, const CudaEngineOptions& options, const BuildShape& b,
    uint64_t seed, int64_t* max_context, std::unique_ptr<CudaKvHostTier>* host) {
  KvArenaShape k = KvArenaShapeOf(d, c, options, b);
  *max_context = options.max_context > 0
                     ? std::min<int64_t>(options.max_context, c.max_position_embeddings)
                     : c.max_position_embeddings;
  FLOTILLA_RETURN_IF_ERROR(AllocAttentionWorkspace(d, options, b, *max_context));
  FLOTILLA_ASSIGN_OR_RETURN(std::vector<int64_t> num_blocks,
                            KvBlocksToAllocate(d, options, k, *max_context));
  for (int g = 0; g < d.kv_groups; ++g) {
    if (num_blocks[g] < 2) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cuda engine: no memory left for the KV cache (a block of ",
                       options.kv_block_size, " positions takes ", k.block_bytes(g),
                       " bytes over the ", k.group_layers[g], " layers of a group)"));
    }
  }
  FLOTILLA_RETURN_IF_ERROR(PlaceKvArena(d, k, num_blocks, b, options, seed));
  k.options.first_block = 1;
  k.options.pool_blocks.clear();
  for (int64_t n : num_blocks) k.options.pool_blocks.push_back(n - 1);
  for (int g = 0; g < d.kv_groups; ++g) d.kv_pool_block_bytes.push_back(k.block_bytes(g));
  if (options.prefix_cache && options.kv_host_cache_bytes > 0) {
    FLOTILLA_ASSIGN_OR_RETURN(*host, CudaKvHostTier::Create(d, options.kv_host_cache_bytes));
    if (*host != nullptr) {
      k.options.host_tier = &(*host)->tier();
      k.options.mover = host->get();
    }
  }
  FLOTILLA_ASSIGN_OR_RETURN(std::unique_ptr<KvBlockAllocator> kv,
                            KvBlockAllocator::Create(k.options));
  *max_context = std::min<int64_t>(*max_context, kv->MaxTokens());
  return kv;
}

// The step metadata region at fixed offsets and the pinned mirrors of the
// metadata and of the sampled rows.
absl::Status AllocStepMeta(CudaDeviceState& d, int64_t max_blocks_per_seq) {
  const int B = d.max_seqs;
  d.meta_at = StepMetaOffsets::For(d.max_tokens, B, d.logit_rows, d.kv_groups, max_blocks_per_seq);
  FLOTILLA_RETURN_IF_ERROR(d.Alloc(&d.meta, d.meta_at.total));
  FLOTILLA_RETURN_IF_ERROR(d.AllocHost(&d.meta_host, d.meta_at.total));
  FLOTILLA_RETURN_IF_ERROR(d.AllocHost(&d.params_host, B));
  FLOTILLA_RETURN_IF_ERROR(d.AllocHost(&d.tokens_host, B));
  FLOTILLA_RETURN_IF_ERROR(d.AllocHost(&d.logprobs_host, B));
  return absl::OkStatus();
}

// The device state's stream and cuBLASLt context on options.device.
absl::StatusOr<std::unique_ptr<CudaDeviceState>> NewDeviceState(int device) {
  auto d = std::make_unique<CudaDeviceState>();
  d->device = device;
  d->arena = std::make_unique<DeviceArena>(device);
  FLOTILLA_CUDA_RETURN(cudaSetDevice(device));
  FLOTILLA_CUDA_RETURN(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking));
  FLOTILLA_CUDA_RETURN(cudaStreamCreateWithFlags(&d->prefetch_stream, cudaStreamNonBlocking));
  FLOTILLA_CUDA_RETURN(cudaEventCreateWithFlags(&d->prefetch_fork, cudaEventDisableTiming));
  FLOTILLA_CUDA_RETURN(cudaEventCreateWithFlags(&d->prefetch_join, cudaEventDisableTiming));
  for (cudaEvent_t& e : d->step_events) FLOTILLA_CUDA_RETURN(cudaEventCreate(&e));
  FLOTILLA_CUDA_RETURN(kc::CreateLinearContext(&d->linear));
  return d;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaEngine>> CudaEngine::Build(const ModelConfig& c,
                                                              std::unique_ptr<CudaWeightFeed> feed,
                                                              uint64_t seed,
                                                              const CudaEngineOptions& options) {
  FLOTILLA_ASSIGN_OR_RETURN(RankShard shard, ShardOfRank(c, options.parallel));
  if (options.parallel != nullptr && !shard.moe_tp) {
    shard.max_slots += std::max(0, options.spare_expert_slots);
  }
  const BuildShape b = ShapeOf(c, shard);
  FLOTILLA_RETURN_IF_ERROR(CheckBuild(c, b, options));
  FLOTILLA_ASSIGN_OR_RETURN(std::unique_ptr<CudaDeviceState> state, NewDeviceState(options.device));
  CudaDeviceState& d = *state;
  kc::SetLinearDeterministic(d.linear, options.deterministic);
  FLOTILLA_ASSIGN_OR_RETURN(const size_t weight_bytes,
                            UploadWeights(d, c, feed.get(), seed, b, shard));
  feed.reset();  // a feed's staging memory goes back before the KV cache is sized
  FLOTILLA_RETURN_IF_ERROR(UploadRope(d, c));
  FLOTILLA_RETURN_IF_ERROR(AllocStepBuffers(d, c, options, b, shard));
  int64_t max_context = 0;
  std::unique_ptr<CudaKvHostTier> host_tier;
  FLOTILLA_ASSIGN_OR_RETURN(std::unique_ptr<KvBlockAllocator> kv,
                            BuildKvCache(d, c, options, b, seed, &max_context, &host_tier));
  const int64_t max_blocks_per_seq = CeilDiv(max_context, options.kv_block_size);
  FLOTILLA_RETURN_IF_ERROR(AllocStepMeta(d, max_blocks_per_seq));
  // Steps launch the sampling kernels behind one that waits for the host's
  // masks: they must be loaded before.
  FLOTILLA_CUDA_RETURN(kernels::cuda::LoadSamplingKernels());
  FLOTILLA_CUDA_RETURN(cudaStreamSynchronize(d.stream));

  std::unique_ptr<CudaEngine> engine(new CudaEngine(std::move(state), c));
  engine->options_ = options;
  engine->options_.max_context = max_context;
  engine->max_blocks_per_seq_ = max_blocks_per_seq;
  engine->weight_bytes_ = weight_bytes;
  engine->host_tier_ = std::move(host_tier);
  engine->kv_ = std::move(kv);
  engine->sampler_ = std::make_unique<DeviceSampler>(*engine->impl_, c.vocab_size);
  return engine;
}

}  // namespace flotilla
