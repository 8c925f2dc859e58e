// What a --model flag names: a checkpoint directory (Hugging Face layout), or
// "synthetic:PRESET[:SEED[:LAYERS]]", the weights `flotilla make-checkpoint
// --preset PRESET --seed SEED` would write (SEED defaults to 0; LAYERS keeps
// only the preset's first LAYERS layers, as `--set num_hidden_layers=LAYERS`
// would), generated where they
// are needed instead of read from disk. A preset named with "-chain"
// ("120b-chain") has the same shapes and layer weights, but its embedding and
// lm_head make every token's next token clear: see SyntheticWeights.
// "synthetic:demo" is the exception: the project's tiny trained gpt-oss
// (tools/demo_model/), whose compact checkpoint is built into the programs and
// expanded into the Hugging Face layout where it is needed
// (worker/model/demo_model.h). Shared by the coordinator (which needs only the
// config), the workers and the CLI.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model_config.h"

namespace flotilla {

inline constexpr absl::string_view kSyntheticModelPrefix = "synthetic:";
// The preset of the trained demo model: "synthetic:demo", `--preset demo`.
inline constexpr absl::string_view kDemoPreset = "demo";

// Which synthetic weights: every tensor's stream comes from `seed`. With
// `chain` (a "-chain" preset) the embedding is 32x larger, so the residual
// stays close to the current token's embedding through the layers, and
// lm_head's rows are the embedding's rows permuted (SyntheticChainNext in
// worker/model/synthetic_tensors.h): every ordinary token's successor then
// leads the logits by a wide margin, so greedy and sampled outputs alike
// follow a fixed chain of tokens that rounding differences between batch
// shapes cannot change. Every layer runs as in the plain preset (the same
// shapes, the same weights, distinct tokens routed to distinct experts): it
// is the model to measure speculative decoding's cost with a drafter that
// replays earlier outputs (worker/replay_drafter.h). A bare seed converts
// implicitly: plain weights of that seed.
struct SyntheticWeights {
  SyntheticWeights(uint64_t seed_in = 0, bool chain_in = false) : seed(seed_in), chain(chain_in) {}
  uint64_t seed = 0;
  bool chain = false;
};

struct SyntheticModelSpec {
  std::string preset;  // tiny, 20b, 120b or demo, with "-chain" when `chain`
  uint64_t seed = 0;
  bool chain = false;
  ModelConfig config;  // the preset's configuration (cut to LAYERS layers if given)

  SyntheticWeights weights() const { return SyntheticWeights(seed, chain); }
};

// True when `model` starts with "synthetic:" (a directory of that name cannot
// be named this way; write ./synthetic:... to mean one).
bool IsSyntheticModel(absl::string_view model);

// Parses "synthetic:PRESET[:SEED[:LAYERS]]". Errors name the spec and the problem: an
// unknown preset, a seed that is not a non-negative 64-bit integer, extra fields.
absl::StatusOr<SyntheticModelSpec> ParseSyntheticModel(absl::string_view model);

// The configuration make-checkpoint writes for `preset` (tiny, 20b, 120b, demo;
// the first three also with "-chain", which changes values, not shapes).
absl::StatusOr<ModelConfig> SyntheticPresetConfig(absl::string_view preset);

// True for a "-chain" preset; `base` (optional) gets the preset without it.
bool IsChainPreset(absl::string_view preset, std::string* base = nullptr);

// The configuration of what `model` names: the synthetic preset's, or the
// directory's config.json.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model);

// The name clients see when no --model-id is given: a synthetic spec as
// written, a directory by its last path component.
std::string DefaultModelId(const std::string& model);

}  // namespace flotilla
