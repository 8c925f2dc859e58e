// Where CudaEngine takes its weights from while it builds: one piece at a time
// (the embedding, lm_head, the final norm, then layer by layer), each a set of
// views laid out as worker/model/weights.h says (a single rank's: every head
// and expert), in host or device memory, valid until the next call. The
// engine's upload reads either and applies its layout transforms (fused QKV,
// RoPE-pair row order, sinks in f32) the same way, so a feed that generates
// the pieces on the device needs room for only one piece at a time.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "common/model_spec.h"
#include "worker/model/weights.h"

namespace flotilla {

class CudaWeightFeed {
 public:
  virtual ~CudaWeightFeed() = default;
  // Each call may enqueue work on `stream`; the engine reads the views on the
  // same stream before it asks for the next piece.
  virtual absl::StatusOr<Bf16Matrix> Embedding(cudaStream_t stream) = 0;
  virtual absl::StatusOr<Bf16Matrix> LmHead(cudaStream_t stream) = 0;
  virtual absl::StatusOr<Bf16Vector> FinalNorm(cudaStream_t stream) = 0;
  virtual absl::StatusOr<LayerWeights> Layer(int layer, cudaStream_t stream) = 0;
};

// The pieces of weights already in host memory.
class HostWeightsFeed : public CudaWeightFeed {
 public:
  explicit HostWeightsFeed(const ModelWeights& weights) : weights_(weights) {}
  absl::StatusOr<Bf16Matrix> Embedding(cudaStream_t) override { return weights_.embed; }
  absl::StatusOr<Bf16Matrix> LmHead(cudaStream_t) override { return weights_.lm_head; }
  absl::StatusOr<Bf16Vector> FinalNorm(cudaStream_t) override { return weights_.final_norm; }
  absl::StatusOr<LayerWeights> Layer(int layer, cudaStream_t) override {
    return weights_.layers[layer];
  }

 private:
  const ModelWeights& weights_;
};

// The synthetic checkpoint `flotilla make-checkpoint` would write for
// (config, weights), the part of it `shard` names (default: all of it), generated on the current
// device piece by piece into one staging buffer (the largest piece: a layer with every expert, or
// the embedding) that lives as long as the feed.
absl::StatusOr<std::unique_ptr<CudaWeightFeed>> MakeSyntheticCheckpointFeed(
    const ModelConfig& config, const SyntheticWeights& weights, const ShardSpec& shard = {});

}  // namespace flotilla
