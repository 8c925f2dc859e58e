// The synthetic checkpoint generated on the GPU: a SyntheticShardBuilder
// (the same views LoadWeights gives for the written checkpoint) writing into a
// device staging buffer through kernels/cuda/synthetic_fill.h, one piece at a
// time, for CudaEngine::Build to upload with its usual layout transforms.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cuda/synthetic_fill.h"
#include "worker/engine/cuda_engine.h"
#include "worker/engine/cuda_status.h"
#include "worker/engine/cuda_weight_feed.h"
#include "worker/model/checkpoint.h"
#include "worker/model/synthetic_shard.h"
#include "worker/parallel/parallel_context.h"

namespace flotilla {
namespace {

constexpr size_t kStagingAlignment = 256;

size_t AlignUp(size_t bytes) {
  return (bytes + kStagingAlignment - 1) / kStagingAlignment * kStagingAlignment;
}

int64_t TensorBytes(const TensorSpec& spec) {
  int64_t n = DTypeSize(spec.dtype);
  for (int64_t d : spec.shape) n *= d;
  return n;
}

// Bytes of staging the largest piece needs: the embedding (or lm_head), or
// one layer with every expert, each slice rounded up to the alignment.
size_t StagingBytes(const ModelConfig& c) {
  size_t layer = 0;
  const std::string prefix = LayerTensorName(0, "");
  for (const TensorSpec& spec : ExpectedTensors(c)) {
    if (absl::StartsWith(spec.name, prefix)) layer += static_cast<size_t>(TensorBytes(spec));
  }
  // Slices per layer: norms, q/k/v/o weights and biases, router, six per expert.
  const size_t slices = 16 + 6 * static_cast<size_t>(c.num_local_experts);
  layer += slices * kStagingAlignment;
  const size_t embedding = AlignUp(static_cast<size_t>(c.vocab_size) * c.hidden_size * 2);
  return std::max(layer, embedding);
}

// A bump allocator over one device buffer, emptied before each piece; fills
// run on the stream of the piece being built.
class DeviceStagingWriter : public SyntheticSliceWriter {
 public:
  explicit DeviceStagingWriter(size_t capacity) : capacity_(capacity) {}
  ~DeviceStagingWriter() override {
    if (base_ != nullptr) cudaFree(base_);
  }

  // Empties the buffer for the next piece (the engine has enqueued its reads
  // of the previous one on `stream`, so later fills on it come after them).
  absl::Status StartPiece(cudaStream_t stream) {
    stream_ = stream;
    used_ = 0;
    if (base_ != nullptr) return absl::OkStatus();
    const cudaError_t err = cudaMalloc(&base_, capacity_);
    if (err != cudaSuccess) {
      base_ = nullptr;
      return absl::ResourceExhaustedError(
          absl::StrCat("cuda: cannot allocate ", capacity_,
                       " bytes of staging for the synthetic weights: ", cudaGetErrorString(err)));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<uint8_t*> Allocate(size_t bytes) override {
    if (base_ == nullptr || used_ + AlignUp(bytes) > capacity_) {
      return absl::InternalError(absl::StrCat("synthetic weights: a piece needs more than the ",
                                              capacity_, " bytes of staging"));
    }
    uint8_t* out = static_cast<uint8_t*>(base_) + used_;
    used_ += AlignUp(bytes);
    return out;
  }

  absl::Status Fill(const SyntheticTensor& tensor, int64_t first, int64_t count,
                    uint8_t* out) override {
    return CudaStatus(kernels::cuda::LaunchSyntheticFill(out, tensor.fill, tensor.state0,
                                                         static_cast<int>(DTypeSize(tensor.dtype)),
                                                         static_cast<uint64_t>(first),
                                                         static_cast<uint64_t>(count), stream_),
                      "synthetic fill");
  }

 private:
  size_t capacity_ = 0;
  size_t used_ = 0;
  void* base_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

class SyntheticCheckpointFeed : public CudaWeightFeed {
 public:
  SyntheticCheckpointFeed(std::unique_ptr<DeviceStagingWriter> writer,
                          SyntheticShardBuilder builder)
      : writer_(std::move(writer)), builder_(std::move(builder)) {}

  absl::StatusOr<Bf16Matrix> Embedding(cudaStream_t stream) override {
    FLOTILLA_RETURN_IF_ERROR(writer_->StartPiece(stream));
    return builder_.Embedding();
  }
  absl::StatusOr<Bf16Matrix> LmHead(cudaStream_t stream) override {
    FLOTILLA_RETURN_IF_ERROR(writer_->StartPiece(stream));
    return builder_.LmHead();
  }
  absl::StatusOr<Bf16Vector> FinalNorm(cudaStream_t stream) override {
    FLOTILLA_RETURN_IF_ERROR(writer_->StartPiece(stream));
    return builder_.FinalNorm();
  }
  absl::StatusOr<LayerWeights> Layer(int layer, cudaStream_t stream) override {
    FLOTILLA_RETURN_IF_ERROR(writer_->StartPiece(stream));
    return builder_.Layer(layer);
  }

 private:
  std::unique_ptr<DeviceStagingWriter> writer_;  // the builder writes through it
  SyntheticShardBuilder builder_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaWeightFeed>> MakeSyntheticCheckpointFeed(
    const ModelConfig& config, const SyntheticWeights& weights, const ShardSpec& shard) {
  auto writer = std::make_unique<DeviceStagingWriter>(StagingBytes(config));
  FLOTILLA_ASSIGN_OR_RETURN(SyntheticShardBuilder builder,
                            SyntheticShardBuilder::Create(config, weights, shard, writer.get()));
  return std::make_unique<SyntheticCheckpointFeed>(std::move(writer), std::move(builder));
}

absl::StatusOr<std::unique_ptr<CudaEngine>> CudaEngine::CreateFromSyntheticCheckpoint(
    const ModelConfig& config, const SyntheticWeights& weights, const CudaEngineOptions& options) {
  // A sharded rank generates its TP rank's heads and every expert it holds
  // in any layer (the engine uploads each layer's slots from them).
  ShardSpec shard;
  if (const parallel::ParallelContext* p = options.parallel) {
    shard.tp_rank = p->config().tp_rank_of(p->rank());
    shard.tp_size = p->config().tp_size();
    // The tensor-parallel MoE: every expert (empty = all), sliced on upload.
    std::set<int> held;
    for (int l = 0; l < p->expert_map().num_layers() && !p->config().moe_tp(); ++l) {
      for (int e : p->expert_map().ExpertsOnRank(l, p->rank())) held.insert(e);
    }
    shard.experts.assign(held.begin(), held.end());
  }
  FLOTILLA_ASSIGN_OR_RETURN(std::unique_ptr<CudaWeightFeed> feed,
                            MakeSyntheticCheckpointFeed(config, weights, shard));
  return Build(config, std::move(feed), 0, options);
}

}  // namespace flotilla
