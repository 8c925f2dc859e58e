// Deterministic synthetic weights of any gpt-oss shape, built in memory (owned
// through ModelWeights::keepalive). Used by tests and by benchmarks that should
// not touch disk. Values are scaled so activations stay in a sane range.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/model_config.h"
#include "worker/model/weights.h"

namespace flotilla {

// Fills every tensor the shard holds from `seed` (same seed, same weights).
// Honours spec.tp_rank/tp_size (head slices), spec.experts and the
// load_embedding / load_lm_head flags exactly as a checkpoint loader would.
absl::StatusOr<ModelWeights> MakeSyntheticWeights(const ModelConfig& config, uint64_t seed,
                                                  const ShardSpec& spec = {});

}  // namespace flotilla
