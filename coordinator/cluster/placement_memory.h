// How many bytes a rank needs on its device, and whether the GPUs of a
// placement can hold what their ranks need. Pure arithmetic over the model
// config and the workers' reports; no I/O.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/model_config.h"
#include "coordinator/cluster/worker_desc.h"

namespace flotilla::coordinator {

// The KV cache a GPU rank must have room for beyond its weights: one 4k-token
// sequence. Less and the engine could not serve an ordinary chat turn.
inline constexpr int64_t kMinKvTokens = 4096;
// Per worker process on a GPU: its CUDA context, the GEMM and attention
// workspaces, activations and captured graphs (an allowance, not a measure).
inline constexpr uint64_t kGpuRuntimeBytes = uint64_t{1} << 30;

// Estimated weight bytes of one rank: its share of attention at `tp_size`, its
// experts, and the replicated parts (norms, router, embedding, lm_head) whole.
uint64_t EstimateRankBytes(const ModelConfig& model, int tp_size, int experts_on_rank);

// KV bytes of one token on a rank holding 1/tp of the KV heads (bf16 K and V
// of every layer: the engine's arena gives every layer the same blocks).
uint64_t KvBytesPerToken(const ModelConfig& model, int tp_size);

// What one GPU rank needs on its device.
struct GpuRankNeed {
  uint64_t weights = 0;
  uint64_t kv_minimum = 0;  // kMinKvTokens tokens
  uint64_t runtime = 0;     // kGpuRuntimeBytes
  std::string shard;        // what the weights are, for messages
  uint64_t total() const { return weights + kv_minimum + runtime; }
};

GpuRankNeed EstimateGpuRankNeed(const ModelConfig& model, int tp_size, int experts_on_rank);

// Groups the ranks by physical GPU (several workers may share one) and checks
// that each GPU holds the sum of its ranks' needs within its memory x the
// workers' gpu_memory_utilization, and that their weights and KV fit in what
// was free when they registered. `rank_workers[r]` holds rank r with need
// `needs[r]`. RESOURCE_EXHAUSTED says how much is needed, how much the GPU has
// and what to change. GPUs of unknown size are not checked.
absl::Status CheckGpuMemory(const std::vector<const WorkerDesc*>& rank_workers,
                            const std::vector<GpuRankNeed>& needs);

}  // namespace flotilla::coordinator
