// Writes a synthetic gpt-oss checkpoint of any shape in exactly the Hugging
// Face layout (config.json, model.safetensors or model-0000i-of-0000N.safetensors
// plus model.safetensors.index.json). Values are a deterministic function of
// the seed and the tensor name, and are chosen so that the model is
// numerically sane: activations keep an O(1) scale through the layers, router
// logits spread so different tokens pick different experts, and MXFP4 experts
// have random nibbles with scales that give weights of about 1/sqrt(fan_in).
// Tensors are generated and written in chunks: a 120b-shaped checkpoint needs
// a few MB of memory, not the size of the model. The values are those of
// worker/model/synthetic_tensors.h, which also generates them in memory
// (`--model synthetic:PRESET[:SEED]`, common/model_spec.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model_config.h"
#include "worker/model/safetensors.h"

namespace flotilla {

struct SyntheticCheckpointOptions {
  uint64_t seed = 0;
  bool chain = false;                 // the "-chain" form (common/model_spec.h SyntheticWeights)
  int shards = 1;                     // 1: model.safetensors; N > 1: N files plus the index
  DType sinks_dtype = DType::kBF16;   // BF16 or F32
  // Experts whose router bias is raised by hot_bias in every layer (skewed
  // expert load for balancing tests); the values differ from the synthetic
  // model's there, so `synthetic:` specs cannot name such a checkpoint.
  std::vector<int> hot_experts;
  float hot_bias = 0;
};

// Writes the checkpoint into `dir` (created if needed; an earlier checkpoint
// there is replaced). The files are written into a hidden sibling directory
// (".NAME.partial-PID") and moved into `dir` only once all of them are
// complete, so an interrupted run never leaves a partial checkpoint under the
// final name (at worst that hidden directory, which a later run does not read).
absl::Status WriteSyntheticCheckpoint(const ModelConfig& config,
                                      const SyntheticCheckpointOptions& options,
                                      const std::string& dir);

// The configuration the make-checkpoint command writes: `preset` ("tiny",
// "20b", "120b") or, when `config_file` is not empty, that config.json; then
// each "key=value" of `sets` (value parsed as JSON, else taken as a string;
// dotted keys reach into objects, e.g. rope_scaling.factor=8). When
// num_hidden_layers changes and layer_types is not set, layer_types is
// regenerated (sliding on even layers, full on odd).
absl::StatusOr<ModelConfig> MakeSyntheticConfig(absl::string_view preset,
                                                const std::string& config_file,
                                                const std::vector<std::string>& sets);

}  // namespace flotilla
