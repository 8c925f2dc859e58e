// Fills the weight views of worker/model/weights.h from a checkpoint.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/checkpoint.h"
#include "worker/model/weights.h"

namespace flotilla {

// The views one rank needs, pointing into the checkpoint's mappings (which
// ModelWeights::keepalive keeps alive): this rank's q/kv heads and its
// o_proj column slice, the experts `shard.experts` names (all when empty),
// and the embedding / lm_head when asked. Nothing is copied or dequantised
// except the sinks (to f32). Each tensor used is checked against the config:
// a missing tensor or a wrong dtype or shape is an error naming the tensor,
// what was expected and what was found. tp_size must divide both head
// counts, tp_rank must be in [0, tp_size), and expert ids must be distinct
// and in [0, E).
absl::StatusOr<ModelWeights> LoadWeights(std::shared_ptr<const Checkpoint> checkpoint,
                                         const ShardSpec& shard);

// The checks LoadWeights makes on `shard` (tp_size divides the head counts,
// tp_rank in range, expert ids distinct and in [0, E)); `experts` receives the
// experts to hold, in order (all of them when shard.experts is empty).
absl::Status CheckShardSpec(const ModelConfig& config, const ShardSpec& shard,
                            std::vector<int>* experts);

}  // namespace flotilla
