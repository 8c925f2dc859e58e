// A gpt-oss checkpoint directory in the Hugging Face layout: config.json plus
// either model.safetensors or model.safetensors.index.json naming the shard
// files. Every file is memory-mapped once and validated on Open().
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model_config.h"
#include "worker/model/safetensors.h"

namespace flotilla {

// Every tensor of the checkpoint `config` describes, in the Hugging Face
// order (embedding, then layer by layer, then the final norm and lm_head;
// lm_head is left out when tie_word_embeddings is set). Sinks are written
// in `sinks_dtype`; readers accept BF16 or F32 for them.
std::vector<TensorSpec> ExpectedTensors(const ModelConfig& config,
                                        DType sinks_dtype = DType::kBF16);

// The names the checkpoint uses, so callers never spell them by hand.
std::string LayerTensorName(int layer, absl::string_view suffix);  // "model.layers.3.<suffix>"

class Checkpoint {
 public:
  // Reads DIR/config.json (through ModelConfig::Load), then DIR/model.safetensors
  // or, when absent, DIR/model.safetensors.index.json and each file its
  // weight_map names (each opened once). Errors name the file and the problem.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }

  // nullptr when no file holds `name`.
  const TensorInfo* Find(absl::string_view name) const;
  // The tensor, checked against the expected dtype and shape; the error names
  // the tensor, what was expected and what was found.
  absl::StatusOr<const TensorInfo*> Get(const TensorSpec& expected) const;
  // Like Get, but any dtype among `dtypes` is accepted.
  absl::StatusOr<const TensorInfo*> Get(absl::string_view name, const std::vector<DType>& dtypes,
                                        const std::vector<int64_t>& shape) const;

  // Checks every tensor ExpectedTensors(config) names (sinks as BF16 or F32).
  absl::Status Validate() const;

  // All tensor names, sorted.
  std::vector<std::string> TensorNames() const;
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  Checkpoint() = default;

  std::string dir_;
  ModelConfig config_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*, std::less<>> tensors_;
};

}  // namespace flotilla
