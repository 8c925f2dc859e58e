// The prefill of a prompt in chunks, which engine tests compare with one
// shot and with reference logits (any Engine: CPU or CUDA).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/engine/engine.h"

namespace flotilla::testing_util {

// What prefilling a prompt in chunks returned, position after position.
struct ChunkedPrefill {
  std::vector<float> logits;     // every position's logits
  std::vector<int32_t> routing;  // every position's experts, when the engine reports them
};

// Feeds `tokens` to the new sequence `sequence` of `engine` `chunk` tokens a
// step (the last step takes what is left), asking for every position's
// logits; the first failed step's error.
inline absl::StatusOr<ChunkedPrefill> PrefillInChunks(Engine& engine, int64_t sequence,
                                                      const std::vector<int32_t>& tokens,
                                                      size_t chunk) {
  ChunkedPrefill got;
  for (size_t begin = 0; begin < tokens.size(); begin += chunk) {
    const size_t end = std::min(tokens.size(), begin + chunk);
    absl::StatusOr<StepOutput> out = engine.Step(
        {StepItem{sequence, {tokens.begin() + begin, tokens.begin() + end}, LogitsMode::kAll}});
    if (!out.ok()) return out.status();
    got.logits.insert(got.logits.end(), out->logits[0].begin(), out->logits[0].end());
    if (!out->routing.empty()) {
      got.routing.insert(got.routing.end(), out->routing[0].begin(), out->routing[0].end());
    }
  }
  return got;
}

}  // namespace flotilla::testing_util
