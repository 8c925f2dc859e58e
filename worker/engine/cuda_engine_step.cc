// CudaEngine::RunStep: the host layout of the step (StepLayout) uploaded,
// the layer stages launched (replayed as a CUDA graph for decode steps),
// the KV committed and the results brought back.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/engine/cuda_engine.h"
#include "worker/engine/cuda_engine_state.h"
#include "worker/engine/cuda_layer_stages.h"
#include "worker/engine/device_sampler.h"
#include "worker/engine/step_layout.h"
#include "worker/parallel/parallel_context.h"

namespace flotilla {

absl::Status CudaEngine::RunStep(const std::vector<StepItem>& items, const DeviceSampling* sampling,
                                 StepOutput* logits_out, std::vector<SampledToken>* sampled) {
  const auto start = std::chrono::steady_clock::now();
  last_timing_ = {};
  FLOTILLA_RETURN_IF_ERROR(Validate(items));
  CudaDeviceState& d = *impl_;
  FLOTILLA_CUDA_RETURN(cudaSetDevice(d.device));
  FLOTILLA_RETURN_IF_ERROR(Reserve(items));
  d.capture_step =
      std::any_of(items.begin(), items.end(), [](const StepItem& it) { return it.return_hidden; });
  int64_t step_bound = 0;
  const bool timed = options_.time_device_steps;
  if (timed) FLOTILLA_CUDA_RETURN(cudaEventRecord(d.step_events[0], d.stream));
  FLOTILLA_ASSIGN_OR_RETURN(const StepLayout plan,
                            LayOutStep(items, sampling, logits_out != nullptr, &step_bound));
  LayerStages::SampleFn sample;
  if (sampling != nullptr) {
    sample = [this, sampling](int rows, cudaStream_t stream) {
      return sampler_->Launch(*sampling, rows, stream);
    };
  }
  OpMarks marks(options_.profile_ops);
  LayerStages stages(d, config_, options_, plan, std::move(sample), &marks);
  if (timed) FLOTILLA_CUDA_RETURN(cudaEventRecord(d.step_events[1], d.stream));
  const absl::Status launched = LaunchStep(stages, plan, sampling, step_bound);
  if (timed && launched.ok()) {
    FLOTILLA_CUDA_RETURN(cudaEventRecord(d.step_events[2], d.stream));
  }
  // Structured-output masks are computed now, while the device runs the
  // layers (its sampling waits for them), and written even if the launch
  // failed partway, so nothing on the device waits for them in vain.
  if (sampling != nullptr) sampler_->WriteMasks(*sampling);
  FLOTILLA_RETURN_IF_ERROR(launched);
  last_timing_.launch_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  if (!marks.empty()) {
    FLOTILLA_RETURN_IF_ERROR(WaitForStep(d.stream));
    FLOTILLA_RETURN_IF_ERROR(marks.AddTimes(&op_time_ms_));
  }
  FLOTILLA_RETURN_IF_ERROR(CommitStep(items));
  FLOTILLA_ASSIGN_OR_RETURN(std::vector<std::vector<int32_t>> routing, CollectRouting(items));
  if (sampling != nullptr) {
    FLOTILLA_RETURN_IF_ERROR(sampler_->Collect(items, *sampling, plan, logits_out, sampled,
                                               [&] { return WaitForStep(d.stream); }));
  } else {
    FLOTILLA_RETURN_IF_ERROR(CollectLogits(items, plan, stages, std::move(routing), logits_out));
  }
  if (d.capture_step && logits_out != nullptr) {
    FLOTILLA_RETURN_IF_ERROR(WaitForStep(d.stream));
    CollectHidden(items, logits_out);
  }
  return timed ? ReadStepEvents() : absl::OkStatus();
}

absl::Status CudaEngine::ReadStepEvents() {
  CudaDeviceState& d = *impl_;
  cudaEvent_t* e = d.step_events;
  FLOTILLA_CUDA_RETURN(cudaEventSynchronize(e[2]));
  float ms = 0;
  FLOTILLA_CUDA_RETURN(cudaEventElapsedTime(&ms, e[0], e[1]));
  last_timing_.device_upload_us = ms * 1e3;
  FLOTILLA_CUDA_RETURN(cudaEventElapsedTime(&ms, e[1], e[2]));
  last_timing_.device_us = ms * 1e3;
  if (d.step_events_recorded) {
    FLOTILLA_CUDA_RETURN(cudaEventElapsedTime(&ms, e[3], e[0]));
    last_timing_.device_idle_us = ms * 1e3;
  }
  // This step's end is the next one's "previous end".
  std::swap(e[2], e[3]);
  d.step_events_recorded = true;
  return absl::OkStatus();
}

absl::StatusOr<StepLayout> CudaEngine::LayOutStep(const std::vector<StepItem>& items,
                                                  const DeviceSampling* sampling, bool logits_out,
                                                  int64_t* step_bound) {
  CudaDeviceState& d = *impl_;
  parallel::ParallelContext* par = options_.parallel;
  // With sampling, every item that samples (or asks for its last logits)
  // owns one row (a drafted chunk draft_tokens + 1), drawn on the device or
  // verified on the host; StepAndSample's items (no samplers) all sample.
  // A group-logits item owns its last row on every rank of the group,
  // whether this rank samples it, returns it or neither.
  std::vector<LogitsMode> modes(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    if (sampling == nullptr) {
      modes[i] = items[i].group_logits ? LogitsMode::kLast : items[i].logits;
      continue;
    }
    const bool row = items[i].logits != LogitsMode::kNone || items[i].sampler != nullptr ||
                     items[i].group_logits || !logits_out;
    modes[i] = row ? LogitsMode::kLast : LogitsMode::kNone;
  }
  // Decode steps replay a graph over a padded batch (StepLayout::Plan). An
  // idle sharded rank's empty step (it only joins its peers' exchanges)
  // replays a one-padding-row graph too: launched eagerly, NCCL's enqueue of
  // 72 exchanges costs more than the busy peer's whole step.
  StepLayoutOptions layout_options;
  layout_options.max_sequences = options_.max_sequences;
  layout_options.block_size = options_.kv_block_size;
  layout_options.graphs = options_.cuda_graphs && !options_.profile_ops;
  layout_options.sharded = par != nullptr;
  layout_options.max_logit_rows = std::min(d.max_seqs, d.logit_rows);  // the sampler's rows
  layout_options.max_tokens = d.max_tokens;
  FLOTILLA_ASSIGN_OR_RETURN(StepLayout plan,
                            StepLayout::Plan(items, modes, sampling != nullptr, *kv_, d.meta_at,
                                             layout_options, d.meta_host));
  plan.group_logits = !items.empty() && items[0].group_logits;  // all or none (Validate)
  // Sharded: every rank sizes the step's exchanges from the same bound, the
  // instance's largest step rounded up as decode batches are (so it covers
  // this rank's padded rows too).
  if (par != nullptr) {
    FLOTILLA_ASSIGN_OR_RETURN(*step_bound, ShardedStepBound(instance_step_tokens_, plan.tokens,
                                                            options_.max_batch_tokens));
    par->ep().SetStepTokens(*step_bound);
  }
  // Upload the used part of each region (offsets are fixed).
  for (const auto& [offset, count] : plan.UsedRegions(d.meta_at)) {
    FLOTILLA_CUDA_RETURN(cudaMemcpyAsync(d.meta + offset, d.meta_host + offset,
                                         count * sizeof(int32_t), cudaMemcpyHostToDevice,
                                         d.stream));
  }
  if (sampling != nullptr) FLOTILLA_RETURN_IF_ERROR(sampler_->Upload(*sampling, plan));
  return plan;
}

absl::Status CudaEngine::LaunchStep(LayerStages& stages, const StepLayout& plan,
                                    const DeviceSampling* sampling, int64_t step_bound) {
  CudaDeviceState& d = *impl_;
  if (plan.decode) {
    const int64_t ctx = DecodeContextBucket(plan.max_len, options_.max_context);
    const int base =
        sampling != nullptr ? DeviceSampler::Variant(*sampling) : (plan.pad_rows ? -1 : -2);
    const int variant = 2 * base + (plan.group_logits ? 1 : 0);
    // A step that copies hidden states out runs eagerly (the copies' host
    // buffer is not part of the captured graphs).
    if (d.capture_step) return stages.Forward(ctx, plan.rows, 0);
    const GraphCache::Key key(plan.seqs, plan.chunk, ctx, variant, step_bound);
    return d.graphs.Launch(key, d.stream, [&] { return stages.Forward(ctx, plan.rows, 0); });
  }
  if (plan.rows <= d.logit_rows) return stages.Forward(plan.max_len, plan.rows, 0);
  // More logit rows than the buffer holds (kAll over a long chunk): the
  // layers once, then lm_head in pieces, copied out one by one
  // (CollectLogits).
  return stages.Forward(plan.max_len, 0, 0);
}

absl::StatusOr<std::vector<std::vector<int32_t>>> CudaEngine::CollectRouting(
    const std::vector<StepItem>& items) {
  CudaDeviceState& d = *impl_;
  std::vector<std::vector<int32_t>> routing;
  if (d.routing_record == nullptr) return routing;
  const int layers = config_.num_hidden_layers, K = config_.num_experts_per_tok;
  const size_t layer_stride = static_cast<size_t>(d.max_tokens) * K;
  std::vector<int32_t> all(layers * layer_stride);
  FLOTILLA_CUDA_RETURN(cudaMemcpyAsync(all.data(), d.routing_record, all.size() * sizeof(int32_t),
                                       cudaMemcpyDeviceToHost, d.stream));
  FLOTILLA_RETURN_IF_ERROR(WaitForStep(d.stream));
  int offset = 0;
  for (const StepItem& item : items) {
    const int n = static_cast<int>(item.tokens.size());
    std::vector<int32_t> r(static_cast<size_t>(n) * layers * K);
    for (int j = 0; j < n; ++j) {
      for (int l = 0; l < layers; ++l) {
        for (int k = 0; k < K; ++k) {
          r[(static_cast<size_t>(j) * layers + l) * K + k] =
              all[l * layer_stride + static_cast<size_t>(offset + j) * K + k];
        }
      }
    }
    routing.push_back(std::move(r));
    offset += n;
  }
  return routing;
}

absl::Status CudaEngine::CollectLogits(const std::vector<StepItem>& items, const StepLayout& plan,
                                       LayerStages& stages,
                                       std::vector<std::vector<int32_t>> routing, StepOutput* out) {
  CudaDeviceState& d = *impl_;
  const int V = config_.vocab_size;
  out->routing = std::move(routing);
  out->logits.resize(items.size());
  // No item wants rows (a TP peer's step: with group logits its rows went
  // into the all-reduce): nothing to copy, the step still waited for.
  if (std::none_of(items.begin(), items.end(),
                   [](const StepItem& it) { return it.logits != LogitsMode::kNone; })) {
    return WaitForStep(d.stream);
  }
  std::vector<float> host(static_cast<size_t>(plan.rows) * V);
  if (plan.rows <= d.logit_rows || plan.decode) {
    FLOTILLA_CUDA_RETURN(cudaMemcpyAsync(host.data(), d.logits, host.size() * sizeof(float),
                                         cudaMemcpyDeviceToHost, d.stream));
  } else {
    for (int r0 = 0; r0 < plan.rows; r0 += d.logit_rows) {
      const int n = std::min(d.logit_rows, plan.rows - r0);
      FLOTILLA_RETURN_IF_ERROR(stages.LogitRows(n, r0));
      FLOTILLA_CUDA_RETURN(cudaMemcpyAsync(host.data() + static_cast<size_t>(r0) * V, d.logits,
                                           static_cast<size_t>(n) * V * sizeof(float),
                                           cudaMemcpyDeviceToHost, d.stream));
    }
  }
  FLOTILLA_RETURN_IF_ERROR(WaitForStep(d.stream));
  for (size_t i = 0; i < items.size(); ++i) {
    out->logits[i].assign(
        host.begin() + static_cast<size_t>(plan.first_row[i]) * V,
        host.begin() + static_cast<size_t>(plan.first_row[i] + plan.row_count[i]) * V);
  }
  return absl::OkStatus();
}

}  // namespace flotilla
