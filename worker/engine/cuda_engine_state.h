// CudaEngine's device state (worker/engine/cuda_engine.h): the weights, the
// KV arena, the step buffers and workspaces, the pinned mirrors they are
// filled from, and the captured graphs. Shared by the engine's source files
// (cuda_engine*.cc, cuda_layer_stages.cc, device_sampler.cc); no other code
// includes it.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/sampling.h"
#include "worker/engine/cuda_engine.h"
#include "worker/engine/cuda_status.h"
#include "worker/engine/device_arena.h"
#include "worker/engine/graph_cache.h"
#include "worker/engine/step_layout.h"

namespace flotilla {

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Device state: weights, KV arena, step buffers, graphs.
struct CudaDeviceState {
  struct Layer {
    uint16_t* input_norm = nullptr;
    uint16_t* post_norm = nullptr;
    // [(NH + 2 NKV) D, H], q and k rows in kernels::cuda::QkvRowOrder::kRopePairs
    uint16_t* wqkv = nullptr;
    uint16_t* bqkv = nullptr;  // same order
    uint16_t* wo = nullptr;    // [H, NH D]
    uint16_t* bo = nullptr;
    uint16_t* router = nullptr;  // [E, H]
    uint16_t* router_bias = nullptr;
    float* sinks = nullptr;
    kernels::cuda::MoeDeviceWeights moe;
    kernels::cuda::PagedKvLayer kv;
    int window = 0;
    int kv_group = 0;  // the KvBlockAllocator group whose block table it reads
  };

  int device = 0;
  cudaStream_t stream = nullptr;
  // Small steps fork L2 prefetches of the next projection's weights onto
  // this stream (CudaEngineOptions::l2_prefetch_max_tokens): `fork` is
  // recorded on `stream` before each, `join` ends the step's branch.
  cudaStream_t prefetch_stream = nullptr;
  cudaEvent_t prefetch_fork = nullptr;
  cudaEvent_t prefetch_join = nullptr;
  // CudaEngineOptions::time_device_steps: the previous step's end, this
  // step's first upload, its launch and its end.
  cudaEvent_t step_events[4] = {};
  bool step_events_recorded = false;
  kernels::cuda::LinearContext* linear = nullptr;
  // Every buffer below but the MoE weights (counted in it, freed by the destructor).
  std::unique_ptr<DeviceArena> arena;

  uint16_t* embed = nullptr;
  uint16_t* final_norm = nullptr;
  uint16_t* lm_head = nullptr;
  std::vector<Layer> layers;
  float* inv_freq = nullptr;
  float rope_scaling = 1.0f;
  uint16_t* kv_arena = nullptr;
  // Per KV pool (= layer group): the bytes of one block over its layers.
  std::vector<size_t> kv_pool_block_bytes;
  // kv_cache_dtype fp8: the step's new K and V in bf16 [max_tokens, NKV, D],
  // written there (at kv_stage_slots, 0..max_tokens-1) by the QKV kernels and
  // quantized into the FP8 layers' cache by LaunchKvQuantize.
  uint16_t* kv_stage_k = nullptr;
  uint16_t* kv_stage_v = nullptr;
  int32_t* kv_stage_slots = nullptr;

  // Step buffers, sized for the largest step.
  int max_tokens = 0, max_seqs = 0, logit_rows = 0;
  float* x = nullptr;  // [T, H] residual stream
  // EAGLE3 (SetHiddenCapture): the layers whose output x a step with
  // return_hidden items copies into hidden_host, pinned [C][max_tokens][H];
  // capture_step: this step copies (it runs eagerly, outside graphs).
  std::vector<int> capture_layers;
  float* hidden_host = nullptr;
  bool capture_step = false;
  uint16_t* t = nullptr;            // [T, H] normed activations
  float* qkv = nullptr;             // [T, (NH + 2 NKV) D], rows as wqkv
  uint16_t* q = nullptr;            // [T, NH D]
  uint16_t* attn = nullptr;         // [T, NH D]
  float* router_logits = nullptr;   // [T, E], zero between steps' uses (see the router)
  unsigned* router_done = nullptr;  // the fused router's finished-block count, zero between uses
  // Sharded ranks: this rank's O-projection partial before the TP sum, and
  // the joined MoE output, both f32 [T, H].
  float* o_part = nullptr;
  float* moe_y = nullptr;
  size_t moe_rows = 0;  // rows the MoE workspace holds (received rows when sharded)
  int32_t* topk_ids = nullptr;
  int32_t* routing_record = nullptr;  // [layers][max_tokens * K] when recording
  float* topk_w = nullptr;
  uint16_t* final_t = nullptr;  // [rows, H]
  float* logits = nullptr;      // [logit_rows, V]
  // A TP rank's share of lm_head's output for a step with group logits:
  // [kMaxGroupLogitRows, V] (only the share's columns used), or null.
  float* group_logits = nullptr;
  int32_t* invalid = nullptr;
  void* moe_ws = nullptr;
  size_t moe_ws_bytes = 0;
  void* attn_ws = nullptr;
  size_t attn_ws_bytes = 0;
  void* sample_ws = nullptr;
  size_t sample_ws_bytes = 0;
  int32_t* sampled_tokens = nullptr;
  float* sampled_logprobs = nullptr;
  kernels::cuda::SamplingRow* sample_params = nullptr;
  // Penalties and logit bias (LaunchAdjustLogits), raw logprobs of tokens
  // drawn from adjusted logits (a greedy reference draw), top logprobs.
  static constexpr int kAdjustCapacity = 1 << 18;
  static constexpr int kMaxTopLogprobs = 20;
  kernels::cuda::LogitAdjustmentEntry* adjust = nullptr;
  float* adjust_saved = nullptr;
  int32_t* adjust_count = nullptr;
  kernels::cuda::SamplingRow* greedy_params = nullptr;
  int32_t* ref_tokens = nullptr;
  float* ref_logprobs = nullptr;
  int32_t* top_ids = nullptr;     // [max_seqs, kMaxTopLogprobs]
  float* top_logprobs = nullptr;  // [max_seqs, kMaxTopLogprobs]
  // Token masks of structured-output rows (LaunchMaskLogitsWhenReady): every
  // row of a step (mask_capacity = its sequences) keeps the device sampler
  // under its mask, which the host writes into masks_host while the step
  // runs and then marks with the step's number in mask_ready.
  int mask_capacity = 0;
  int mask_words = 0;
  // [mask_capacity + 2]: the logit rows, the count, the step's number.
  int32_t* mask_rows = nullptr;
  int32_t* mask_late = nullptr;  // set by the device when the masks came too late

  // Step metadata: one int32 region on the device at fixed offsets (graphs
  // keep the addresses), filled from a pinned host mirror.
  int32_t* meta = nullptr;
  int32_t* meta_host = nullptr;
  // Sharded ranks: rows run per (layer, slot) [layers * max_slots] on the
  // device, read back into the pinned mirror after a step (counts_event).
  int max_slots = 0;
  uint32_t* expert_counts = nullptr;
  uint32_t* expert_counts_host = nullptr;
  cudaEvent_t counts_event = nullptr;
  bool counts_pending = false;
  // Hot swap: the stream StageExperts copies on (its own thread) and the map
  // version it last staged.
  cudaStream_t copy_stream = nullptr;
  std::atomic<uint64_t> staged_version{0};
  std::vector<std::vector<int>> counts_slot_expert;  // the map the read-back counted under
  StepMetaOffsets meta_at;                           // the regions of `meta`
  int kv_groups = 1;
  kernels::cuda::SamplingRow* params_host = nullptr;
  int32_t* tokens_host = nullptr;
  float* logprobs_host = nullptr;
  // [kAdjustCapacity + 1]; the count after the entries.
  kernels::cuda::LogitAdjustmentEntry* adjust_host = nullptr;
  uint32_t* masks_host = nullptr;     // [mask_capacity, mask_words], read by the device
  int32_t* mask_rows_host = nullptr;  // the mirror of mask_rows
  int32_t* mask_ready = nullptr;      // the number of the step whose masks are written
  int32_t* mask_late_host = nullptr;
  int32_t* top_ids_host = nullptr;
  float* top_logprobs_host = nullptr;

  // Decode graphs by (padded batch, context bucket, sampling variant, the
  // instance's step-token bound when sharded).
  GraphCache graphs;

  ~CudaDeviceState();
  template <typename T>
  absl::Status Alloc(T** p, size_t count) {
    return arena->Alloc(p, count);
  }
  template <typename T>
  absl::Status AllocHost(T** p, size_t count) {
    return arena->AllocHost(p, count);
  }
};

}  // namespace flotilla
