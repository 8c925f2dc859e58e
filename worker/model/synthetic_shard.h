// One rank's shard of the synthetic checkpoint, generated instead of read:
// the same views LoadWeights would give for the checkpoint `flotilla
// make-checkpoint` writes with this config and seed, holding only what the
// shard needs (its heads, its experts). Where the bytes go is up to a
// SyntheticSliceWriter: host memory for CPU workers (MakeSyntheticShard), a
// device staging buffer for the CUDA engine (worker/engine/cuda_weight_feed.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model_config.h"
#include "worker/model/checkpoint.h"
#include "worker/model/synthetic_tensors.h"
#include "worker/model/weights.h"

namespace flotilla {

// Memory for generated slices and the generator that fills it.
class SyntheticSliceWriter {
 public:
  virtual ~SyntheticSliceWriter() = default;
  // Room for `bytes`, aligned to at least 16 bytes.
  virtual absl::StatusOr<uint8_t*> Allocate(size_t bytes) = 0;
  // Writes elements [first, first + count) of `tensor` to `out` (room from Allocate).
  virtual absl::Status Fill(const SyntheticTensor& tensor, int64_t first, int64_t count,
                            uint8_t* out) = 0;
};

// Builds the views piece by piece, so a caller can keep only one piece alive
// (the CUDA engine uploads each and reuses its staging memory).
class SyntheticShardBuilder {
 public:
  // Checks `shard` as LoadWeights does; `writer` must outlive the builder.
  static absl::StatusOr<SyntheticShardBuilder> Create(const ModelConfig& config,
                                                      const SyntheticWeights& weights,
                                                      const ShardSpec& shard,
                                                      SyntheticSliceWriter* writer);

  const ModelConfig& config() const { return config_; }
  absl::StatusOr<Bf16Matrix> Embedding();  // [V, H]
  absl::StatusOr<Bf16Matrix> LmHead();     // [V, H]; the embedding's values when tied
  absl::StatusOr<Bf16Vector> FinalNorm();  // [H]
  // The layer's norms, this rank's heads, router and experts (sinks on the host).
  absl::StatusOr<LayerWeights> Layer(int layer);

 private:
  SyntheticShardBuilder(const ModelConfig& config, const SyntheticWeights& weights,
                        const ShardSpec& shard, std::vector<int> experts,
                        SyntheticSliceWriter* writer);

  // Elements [first, first + count) of tensor `name`, in fresh room.
  absl::StatusOr<const uint8_t*> Slice(const std::string& name, int64_t first, int64_t count);
  absl::StatusOr<const uint16_t*> Bf16Slice(const std::string& name, int64_t first, int64_t count);
  // Rows [row_begin, row_begin + rows) of a [*, cols] bf16 matrix.
  absl::StatusOr<Bf16Matrix> Rows(const std::string& name, int64_t row_begin, int64_t rows,
                                  int64_t cols);
  // Columns [col_begin, col_begin + cols) of a [rows, total_cols] bf16 matrix, dense.
  absl::StatusOr<Bf16Matrix> Columns(const std::string& name, int64_t rows, int64_t total_cols,
                                     int64_t col_begin, int64_t cols);
  absl::Status Attention(int layer, AttentionWeights* attention);
  absl::StatusOr<ExpertWeights> Expert(int layer, int expert);
  std::vector<float> Sinks(const std::string& name, int begin, int count) const;

  ModelConfig config_;
  SyntheticWeights weights_;
  ShardSpec shard_;
  std::vector<int> experts_;
  SyntheticSliceWriter* writer_ = nullptr;
  std::map<std::string, TensorSpec, std::less<>> specs_;  // ExpectedTensors by name
};

// The shard in host memory, owned through ModelWeights::keepalive: equal, view
// for view, to LoadWeights(checkpoint make-checkpoint writes, shard).
absl::StatusOr<ModelWeights> MakeSyntheticShard(const ModelConfig& config,
                                                const SyntheticWeights& weights,
                                                const ShardSpec& shard);

}  // namespace flotilla
