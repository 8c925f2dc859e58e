// Where a rank's weights come from, resolved from the --model string
// (common/model_spec.h): a checkpoint directory, memory-mapped and sliced by
// LoadWeights, or a synthetic model, whose shard is generated in host memory
// (MakeSyntheticShard) or, by the CUDA engine, directly on the GPU.
// "synthetic:demo", the trained demo model, is a checkpoint: the built-in
// compact one expanded into a cache directory (worker/model/demo_model.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/model_config.h"
#include "common/model_spec.h"
#include "worker/model/checkpoint.h"
#include "worker/model/weights.h"

namespace flotilla {

class ModelSource {
 public:
  // Opens the checkpoint (Checkpoint::Open) or parses the synthetic spec; the
  // errors name the problem.
  static absl::StatusOr<std::unique_ptr<ModelSource>> Open(const std::string& model);

  const std::string& model() const { return model_; }  // as given
  const ModelConfig& config() const { return config_; }
  // The synthetic model's spec; nullptr for a checkpoint.
  const SyntheticModelSpec* synthetic() const { return synthetic_ ? &*synthetic_ : nullptr; }

  // The views `shard` needs: into the checkpoint's mappings, or generated
  // into host memory the views own (the same values either way).
  absl::StatusOr<ModelWeights> LoadShard(const ShardSpec& shard) const;

 private:
  ModelSource() = default;

  std::string model_;
  ModelConfig config_;
  std::shared_ptr<const Checkpoint> checkpoint_;
  std::optional<SyntheticModelSpec> synthetic_;
};

// Bytes of the attention projections and MXFP4 experts `shard` holds (what a
// worker reports as loaded).
uint64_t ShardProjectionBytes(const ModelConfig& config, const ShardSpec& shard);

}  // namespace flotilla
