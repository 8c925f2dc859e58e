// Which weights one CUDA engine holds: its TP rank's heads and, per layer,
// the expert in each MoE slot (from the instance's expert map, or the
// tensor-parallel MoE layout's slice of every expert).
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "common/model_config.h"
#include "worker/parallel/parallel_context.h"

namespace flotilla {

// What one rank holds: its TP rank's heads and, per layer, the expert in
// each MoE slot (the slot ids ExpertMap gives this rank; -1: slot unused).
// Without a ParallelContext: every head, and expert e in slot e. The
// tensor-parallel MoE layout: expert e in slot e, each this TP rank's slice.
struct RankShard {
  int tp_rank = 0;
  int tp_size = 1;
  bool moe_tp = false;
  std::vector<std::vector<int>> slot_expert;  // [layer][slot]
  int max_slots = 0;
};

// The shard of the rank `p` runs (nullptr: a single-GPU engine, everything).
// INVALID_ARGUMENT when the expert map does not fit the model or the
// instance, or gives this rank no expert.
absl::StatusOr<RankShard> ShardOfRank(const ModelConfig& c, const parallel::ParallelContext* p);

}  // namespace flotilla
