// An EAGLE3 draft head (speculative decoding), read from a directory in the
// layout the published gpt-oss EAGLE3 heads use: config.json
// ("LlamaForCausalLMEagle3") and safetensors files. The head is one Llama
// decoder layer whose attention reads [the embedded token, the fused target
// state] (2 x hidden inputs), `fc` fusing the target's hidden states at
// `aux_layers` into one, a final norm and an lm_head over a reduced draft
// vocabulary whose ids map to the target's through `d2t`. Which tensor names
// and config keys are read: worker/README.md "EAGLE3 heads".
// The weights are kept in bf16 (f16 and f32 files are rounded to it).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model_config.h"
#include "worker/model/weights.h"

namespace flotilla {

struct Eagle3Config {
  int64_t hidden_size = 0;         // the head's
  int64_t target_hidden_size = 0;  // the target's (fc's inputs per layer)
  int64_t intermediate_size = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab_size = 0;        // the target's vocabulary
  int64_t draft_vocab_size = 0;  // lm_head's rows
  // Target layers whose outputs (the residual stream after layer i, 0-based)
  // fc fuses, in fc's input order.
  std::vector<int> aux_layers;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  // rope_scaling of type "yarn" (else plain RoPE).
  bool yarn = false;
  double yarn_factor = 1.0;
  double yarn_original_max_position = 4096;
  double yarn_beta_fast = 32;
  double yarn_beta_slow = 1;
  // The fused state is normed before it becomes the residual (a variant's
  // config key; false in the published gpt-oss heads).
  bool norm_before_residual = false;
};

// The target layers a head fuses when its config names none: 1, L/2 - 1 and
// L - 4 for L >= 8 layers (gpt-oss-120b: 1, 17, 32), else 0, (L-1)/2, L-1.
std::vector<int> DefaultEagle3AuxLayers(int target_layers);

// config.json's object parsed and checked against the target it drafts for:
// INVALID_ARGUMENT naming the key that is missing, malformed or does not fit
// the target (vocabulary, hidden size, a layer the target does not have).
absl::StatusOr<Eagle3Config> ParseEagle3Config(const std::string& json_text,
                                               const ModelConfig& target);

struct Eagle3Head {
  Eagle3Config config;
  // bf16, row-major [out, in] as in the files.
  std::vector<uint16_t> fc;                      // [H, aux * TH]
  std::vector<uint16_t> input_norm;              // [H] (on the embedded token)
  std::vector<uint16_t> hidden_norm;             // [H] (on the fused state)
  std::vector<uint16_t> q_proj, k_proj, v_proj;  // [heads * D, 2H], [kv * D, 2H]
  std::vector<uint16_t> o_proj;                  // [H, heads * D]
  std::vector<uint16_t> post_attention_norm;     // [H]
  std::vector<uint16_t> gate_proj, up_proj;      // [I, H]
  std::vector<uint16_t> down_proj;               // [H, I]
  std::vector<uint16_t> final_norm;              // [H]
  std::vector<uint16_t> lm_head;                 // [draft_vocab, H]
  // The target id of each draft id (draft id + d2t[draft id]).
  std::vector<int32_t> draft_to_target;
  // Token embeddings [vocab, H]: the head's own embed_tokens, or the
  // target's (UseTargetEmbedding), kept alive by embedding_owner.
  Bf16Matrix embedding;
  std::vector<uint16_t> own_embedding;
  std::shared_ptr<const void> embedding_owner;

  bool has_embedding() const { return embedding.data != nullptr; }
  // A head without embed_tokens embeds with the target's: `embed` [vocab, H]
  // (FAILED_PRECONDITION when its shape is not [vocab, hidden]).
  absl::Status UseTargetEmbedding(const Bf16Matrix& embed, std::shared_ptr<const void> owner);
};

// Reads the head in `dir` for `target`. Errors name the file, the tensor or
// the config key: a missing config.json or safetensors file (a
// pytorch_model.bin-only directory is refused with that said), a missing
// tensor, a shape that does not follow from the config, an unsupported
// dtype, a d2t entry mapping outside the target's vocabulary, an unknown
// tensor name.
absl::StatusOr<std::unique_ptr<Eagle3Head>> LoadEagle3Head(const std::string& dir,
                                                           const ModelConfig& target);

}  // namespace flotilla
