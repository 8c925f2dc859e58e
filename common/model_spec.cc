#include "common/model_spec.h"

#include <charconv>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"

namespace flotilla {

bool IsSyntheticModel(absl::string_view model) {
  return absl::StartsWith(model, kSyntheticModelPrefix);
}

bool IsChainPreset(absl::string_view preset, std::string* base) {
  constexpr absl::string_view kChain = "-chain";
  const bool chain = absl::EndsWith(preset, kChain) && preset != kChain;
  if (base != nullptr) {
    *base = std::string(chain ? preset.substr(0, preset.size() - kChain.size()) : preset);
  }
  return chain;
}

absl::StatusOr<ModelConfig> SyntheticPresetConfig(absl::string_view name) {
  std::string preset;
  if (IsChainPreset(name, &preset) && preset == kDemoPreset) {
    return absl::InvalidArgumentError(
        "unknown preset 'demo-chain' (the demo model is trained weights: it has no chain form)");
  }
  ModelConfig config;
  if (preset == "tiny") {
    config = ModelConfig::Tiny();
  } else if (preset == "20b") {
    config = ModelConfig::Gptoss20b();
  } else if (preset == "120b") {
    config = ModelConfig::Gptoss120b();
  } else if (preset == kDemoPreset) {
    config = ModelConfig::Demo();
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown preset '", name,
                     "' (choose tiny, 20b, 120b or demo; tiny, 20b and 120b also with -chain)"));
  }
  // Through the JSON form, exactly as make-checkpoint writes and reads it back.
  return ModelConfig::FromJson(config.ToJson());
}

absl::StatusOr<SyntheticModelSpec> ParseSyntheticModel(absl::string_view model) {
  if (!IsSyntheticModel(model)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", model, "' is not a synthetic model (expected synthetic:PRESET[:SEED[:LAYERS]])"));
  }
  const std::vector<absl::string_view> fields =
      absl::StrSplit(model.substr(kSyntheticModelPrefix.size()), ':');
  auto error = [&](const std::string& problem) {
    return absl::InvalidArgumentError(
        absl::StrCat("--model ", model, ": ", problem, "; expected synthetic:PRESET[:SEED[:LAYERS]]"));
  };
  if (fields.size() > 3) return error("too many ':' fields");
  SyntheticModelSpec spec;
  spec.preset = std::string(fields[0]);
  absl::StatusOr<ModelConfig> config = SyntheticPresetConfig(spec.preset);
  if (!config.ok()) return error(std::string(config.status().message()));
  spec.config = *std::move(config);
  spec.chain = IsChainPreset(spec.preset);
  if (spec.preset == kDemoPreset && fields.size() > 1) {
    return error("the demo model is trained weights: it takes no seed and no layer count");
  }
  if (fields.size() >= 2) {
    const absl::string_view seed = fields[1];
    auto [end, ec] = std::from_chars(seed.data(), seed.data() + seed.size(), spec.seed);
    if (seed.empty() || ec != std::errc() || end != seed.data() + seed.size()) {
      return error(absl::StrCat("seed '", seed, "' is not a non-negative 64-bit integer"));
    }
  }
  if (fields.size() == 3) {
    // The preset's first LAYERS layers (same shapes and layer types): a
    // full-width model that loads in seconds, for tests and benchmarks.
    const absl::string_view text = fields[2];
    int layers = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), layers);
    const int most = spec.config.num_hidden_layers;
    if (text.empty() || ec != std::errc() || end != text.data() + text.size() || layers < 1 ||
        layers > most) {
      return error(absl::StrCat("layers '", text, "' is not a whole number in [1, ", most, "]"));
    }
    spec.config.num_hidden_layers = layers;
    spec.config.layer_types.resize(layers);
    absl::StatusOr<ModelConfig> cut = ModelConfig::FromJson(spec.config.ToJson());
    if (!cut.ok()) return error(std::string(cut.status().message()));
    spec.config = *std::move(cut);
  }
  return spec;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model) {
  if (!IsSyntheticModel(model)) return ModelConfig::Load(model);
  FLOTILLA_ASSIGN_OR_RETURN(SyntheticModelSpec spec, ParseSyntheticModel(model));
  return spec.config;
}

std::string DefaultModelId(const std::string& model) {
  if (IsSyntheticModel(model)) return model;
  std::string m = model;
  while (m.size() > 1 && m.back() == '/') m.pop_back();
  return m.substr(m.find_last_of('/') + 1);
}

}  // namespace flotilla
