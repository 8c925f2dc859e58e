// The gpt-oss model configuration, read from a Hugging Face config.json.
// Every value comes from the file; nothing is hard-coded to 120b or 20b.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/statusor.h"

namespace flotilla {

enum class LayerType { kSlidingAttention, kFullAttention };

struct RopeScaling {
  std::string rope_type = "yarn";
  double factor = 32.0;
  int64_t original_max_position_embeddings = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = false;
};

struct ModelConfig {
  int num_hidden_layers = 0;
  int num_local_experts = 0;     // E
  int num_experts_per_tok = 0;   // K
  int hidden_size = 0;           // H
  int intermediate_size = 0;     // I
  int num_attention_heads = 0;   // NH
  int num_key_value_heads = 0;   // NKV
  int head_dim = 0;              // D
  int vocab_size = 0;            // V
  int sliding_window = 0;
  int64_t max_position_embeddings = 0;
  std::vector<LayerType> layer_types;  // one per layer
  double rope_theta = 0;
  RopeScaling rope_scaling;
  double rms_norm_eps = 0;
  double swiglu_limit = 0;
  std::vector<int> eos_token_ids;  // config's eos_token_id (int or list)
  int pad_token_id = -1;
  bool tie_word_embeddings = false;
  bool mxfp4_experts = true;  // quantization_config.quant_method == "mxfp4"
  std::vector<std::string> modules_to_not_convert;

  // Parses and validates a config.json object. Errors name the field and say
  // what was expected, e.g. "config.json: missing field 'head_dim'".
  static absl::StatusOr<ModelConfig> FromJson(const nlohmann::json& j);
  // Reads DIR/config.json (or the file itself when `path` is a file).
  static absl::StatusOr<ModelConfig> Load(const std::string& path);
  // Writes the Hugging Face layout back (FromJson(ToJson()) is the identity).
  nlohmann::json ToJson() const;

  // Shapes of the published models and a tiny one for tests.
  static ModelConfig Gptoss120b();
  static ModelConfig Gptoss20b();
  static ModelConfig Tiny();  // H=64, E=8, 4 layers, window 16, V=1024
  // The demo model's shape (tools/demo_model/): H=64, E=8 (K=2), 4 layers,
  // window 64, the full o200k_harmony vocabulary.
  static ModelConfig Demo();

  bool is_sliding(int layer) const {
    return layer_types[layer] == LayerType::kSlidingAttention;
  }
};

}  // namespace flotilla
