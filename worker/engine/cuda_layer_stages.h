// One CudaEngine step's launches on the engine's stream, stage by stage in
// the order of CpuEngine::RunLayer: the embedding; per layer the attention
// block (input norm, QKV projection, RoPE and KV write, attention, O
// projection and, tensor-parallel, the TP sum), the router (post-attention
// norm, projection, top-k) and the MoE (single GPU, expert-parallel
// dispatch/combine, or the tensor-parallel layout's slices and all-reduce);
// then the logit rows' norm, lm_head and the device sampler. The same calls
// are recorded into a CUDA graph for decode steps or launched eagerly.
// With CudaEngineOptions::profile_ops an event marks each op; skip_ops
// leaves ops out (benchmarks).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/model_config.h"
#include "worker/engine/cuda_engine.h"
#include "worker/engine/cuda_engine_state.h"
#include "worker/engine/step_layout.h"

namespace flotilla {

// Per-op events of one eager step (profile_ops); no events when off.
class OpMarks {
 public:
  explicit OpMarks(bool on) : on_(on) {}
  ~OpMarks();
  OpMarks(const OpMarks&) = delete;
  OpMarks& operator=(const OpMarks&) = delete;

  // An event on `stream` that starts op `label` (and ends the one before).
  absl::Status Mark(const char* label, cudaStream_t stream);
  bool empty() const { return marks_.empty(); }
  // Once the stream has passed the last mark: adds each op's milliseconds.
  absl::Status AddTimes(std::map<std::string, double>* op_time_ms) const;

 private:
  bool on_;
  std::vector<std::pair<std::string, cudaEvent_t>> marks_;
};

class LayerStages {
 public:
  // Draws from the first `rows` logit rows on `stream` (the device sampler).
  using SampleFn = std::function<absl::Status(int rows, cudaStream_t stream)>;

  // `plan` is the step's layout (its metadata already on the device);
  // `sample` is empty when the step does not sample.
  LayerStages(CudaDeviceState& d, const ModelConfig& config, const CudaEngineOptions& options,
              const StepLayout& plan, SampleFn sample, OpMarks* marks);

  // Every launch of the step; `ctx` bounds the sequence lengths for the KV
  // split; the norm, lm_head and sampler run on `logit_rows` rows from
  // `row_offset` of the step's logit rows (none when 0).
  absl::Status Forward(int64_t ctx, int logit_rows, int row_offset);
  // The final norm and lm_head of `rows` logit rows from `row_offset`
  // (logit rows beyond the buffer, a piece at a time).
  absl::Status LogitRows(int rows, int row_offset);

 private:
  absl::Status Mark(const char* label) { return marks_->Mark(label, d_.stream); }
  // False for an op CudaEngineOptions::skip_ops leaves out.
  bool On(const char* op) const;
  // Empty steps of a sharded rank: only the layers' exchanges.
  absl::Status JoinExchanges();
  // EAGLE3 steps (capture_step): x after `layer` to hidden_host when the
  // engine captures that layer.
  absl::Status CaptureHidden(int layer);
  // Small steps (prefetch_, CudaEngineOptions::l2_prefetch_max_tokens): an
  // L2 prefetch of [p, p + bytes) on the prefetch stream, forked from the
  // step stream here.
  absl::Status Prefetch(const void* p, size_t bytes);
  // The step stream waits for the forked prefetches (before the logits, so
  // a captured graph's branch ends inside it).
  absl::Status JoinPrefetches();
  absl::Status AttentionBlock(int layer);
  // The input norm, QKV projection, RoPE and the layer's KV write (an FP8
  // layer's through bf16 staging and LaunchKvQuantize).
  absl::Status NormQkvRope(const CudaDeviceState::Layer& L);
  // The same writing K and V into `kv` at `slots`.
  absl::Status WriteQkv(const CudaDeviceState::Layer& L, const kernels::cuda::PagedKvLayer& kv,
                        const int32_t* slots);
  absl::Status Attention(const CudaDeviceState::Layer& L);
  absl::Status OProjection(const CudaDeviceState::Layer& L);
  absl::Status Router(int layer);
  // Copies the layer's chosen experts to the routing record, if kept.
  absl::Status RecordRouting(int layer);
  absl::Status Moe(int layer);
  // A sharded rank's MoE for one layer: dispatch its share of the step's
  // `tokens` routed rows (d.t, topk), run its experts on the rows received,
  // combine and add the result into the residual. tokens may be 0.
  absl::Status ExpertParallelMoe(int layer, int tokens);
  // The tensor-parallel MoE layout: this rank's slices of every expert on
  // all `tokens`, the TP group's all-reduce of the partial outputs,
  // residual add.
  absl::Status TensorParallelMoe(int layer, int tokens);
  absl::Status Logits(int logit_rows, int row_offset);
  // lm_head of a group-logits step (StepItem::group_logits): this TP rank's
  // share of the vocabulary, placed in zeroed logit rows, joined with the
  // peers' shares by the group's all-reduce.
  absl::Status GroupLmHead(int logit_rows);

  CudaDeviceState& d_;
  const ModelConfig& c_;
  const CudaEngineOptions& options_;
  const StepLayout& plan_;
  SampleFn sample_;
  OpMarks* marks_;
  parallel::ParallelContext* par_;
  int tp_ = 1;
  bool moe_tp_ = false;
  bool deterministic_ = false;  // CudaEngineOptions::deterministic
  int H_ = 0, D_ = 0, NH_ = 0, E_ = 0, K_ = 0, V_ = 0, QKV_ = 0, T_ = 0;
  float eps_ = 0;
  bool prefetch_ = false;
  bool prefetch_next_qkv_ = false;  // CudaEngineOptions::l2_prefetch_next_qkv_max_tokens
  bool prefetch_forked_ = false;
  // This layer's router wrote the MoE's routing (route_in_router).
  bool routed_ = false;
  kernels::cuda::AttentionBatch batch_;  // block_tables: the layer's group's, set per layer
};

}  // namespace flotilla
