// The demo model: a tiny gpt-oss trained by the project (tools/demo_model/),
// built into the programs as its compact checkpoint, one safetensors image
// holding the Hugging Face tensors except that model.embed_tokens.weight and
// lm_head.weight have one row per token of `vocab_ids` (I32, ascending) plus a
// last row shared by every other token of the vocabulary; its __metadata__
// names the format ("flotilla-demo-v1") and holds the config.json text, which
// must be ModelConfig::Demo(). Expanded, it is an ordinary checkpoint with the
// full o200k_harmony vocabulary, read by the same loader as any other.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace flotilla {

// The built-in compact checkpoint's bytes.
absl::Span<const uint8_t> DemoCompactImage();

// Writes the demo model expanded from `image` into `dir` (created if needed)
// as config.json plus model.safetensors. Errors name what in the image is
// wrong (format, config, a tensor's dtype or shape, a vocabulary id).
absl::Status WriteDemoCheckpoint(absl::Span<const uint8_t> image, const std::string& dir);

// Where models written on first use are kept: flotilla under
// $XDG_CACHE_HOME, else $HOME/.cache, else the temporary directory.
std::string ModelCacheRoot();

// A directory holding the expanded built-in demo model, written on first use:
// flotilla/demo-HASH (HASH of the image) under $XDG_CACHE_HOME, else
// $HOME/.cache, else the temporary directory. Processes that start at once
// each write a private copy and rename it into place; the first rename wins.
absl::StatusOr<std::string> DemoCheckpointDir();

}  // namespace flotilla
