// What a --model flag names: a checkpoint directory (Hugging Face layout), or
// "synthetic:PRESET[:SEED[:LAYERS]]", the weights `flotilla make-checkpoint
// --preset PRESET --seed SEED` would write (SEED defaults to 0; LAYERS keeps
// only the preset's first LAYERS layers, as `--set num_hidden_layers=LAYERS`
// would), generated where they
// are needed instead of read from disk. "synthetic:demo" is the exception: the
// project's tiny trained gpt-oss (tools/demo_model/), whose compact checkpoint
// is built into the programs and expanded into the Hugging Face layout where
// it is needed (worker/model/demo_model.h). Shared by the coordinator (which needs
// only the config), the workers and the CLI.
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

struct SyntheticModelSpec {
  std::string preset;  // tiny, 20b, 120b or demo
  uint64_t seed = 0;
  ModelConfig config;  // the preset's configuration (cut to LAYERS layers if given)
};

// True when `model` starts with "synthetic:" (a directory of that name cannot
// be named this way; write ./synthetic:... to mean one).
bool IsSyntheticModel(absl::string_view model);

// Parses "synthetic:PRESET[:SEED[:LAYERS]]". Errors name the spec and the problem: an
// unknown preset, a seed that is not a non-negative 64-bit integer, extra fields.
absl::StatusOr<SyntheticModelSpec> ParseSyntheticModel(absl::string_view model);

// The configuration make-checkpoint writes for `preset` (tiny, 20b, 120b, demo).
absl::StatusOr<ModelConfig> SyntheticPresetConfig(absl::string_view preset);

// The configuration of what `model` names: the synthetic preset's, or the
// directory's config.json.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model);

// The name clients see when no --model-id is given: a synthetic spec as
// written, a directory by its last path component.
std::string DefaultModelId(const std::string& model);

}  // namespace flotilla
