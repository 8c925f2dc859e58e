// "synthetic:eagle3[:SEED]": an EAGLE3 head of deterministic random weights
// shaped for the target it drafts for (its hidden size, heads, vocabulary;
// the published gpt-oss heads' intermediate size of 6 x hidden and draft
// vocabulary of 32,000), written as config.json and model.safetensors in the
// published layout and read back by LoadEagle3Head like any other head. For
// tests and benchmarks: random weights accept almost nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model_config.h"
#include "worker/model/eagle3_head.h"

namespace flotilla {

inline constexpr absl::string_view kSyntheticEagle3 = "synthetic:eagle3";

// Writes the synthetic head for `target` and `seed` into `dir` (created).
absl::Status WriteSyntheticEagle3Head(const std::string& dir, const ModelConfig& target,
                                      uint64_t seed);

// The directory --speculative-model names: `spec` itself, or for
// "synthetic:eagle3[:SEED]" a cache directory (ModelCacheRoot) holding that
// head for `target`, written on first use. INVALID_ARGUMENT for a malformed
// synthetic spec.
absl::StatusOr<std::string> Eagle3HeadDir(const std::string& spec, const ModelConfig& target);

// Eagle3HeadDir, then LoadEagle3Head.
absl::StatusOr<std::unique_ptr<Eagle3Head>> OpenEagle3Head(const std::string& spec,
                                                           const ModelConfig& target);

}  // namespace flotilla
