// The balancer's plan: a pure function from the window's expert load and
// the maps to a new expert map. Each rank keeps the experts it loaded at
// placement (its base slots); its spare slots take replicas of hot experts.
// Per layer, greedily, the replica that most lowers the most-loaded rank
// (then the spread of rank loads) is added, on a rank with a free spare slot
// not holding that expert, while it helps and the bytes to load stay within
// the bound (a replica the current map already holds costs nothing and keeps
// its slot). A rank's predicted load is the sum over its experts of the
// expert's load divided by its number of replicas (rows take turns).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/expert_map.h"

namespace flotilla::coordinator {

struct BalancerInput {
  ExpertMap current;  // the map in force
  ExpertMap base;     // the map the ranks loaded: their base slots
  // [layer][expert]: tokens in the window.
  std::vector<std::vector<double>> load;
  std::vector<int> slots_per_rank;  // expert slots per layer, by rank
  uint64_t expert_bytes = 0;        // bytes of one expert
  uint64_t max_bytes = 0;           // 0 = no bound
};

struct BalancerPlan {
  ExpertMap map;  // version current + 1 (or the current map when nothing changes)
  bool changed = false;
  double imbalance_before = 0;  // mean over layers with load, under `current`
  double imbalance_after = 0;   // ... under `map`
  std::vector<double> layer_before, layer_after;
  uint64_t bytes_moved = 0;
  int replicas_added = 0;    // replicas `map` has that `current` has not
  int replicas_removed = 0;  // and the other way round
};

absl::StatusOr<BalancerPlan> PlanRebalance(const BalancerInput& input);

// Predicted per-rank load of `layer` under `map`.
std::vector<double> PredictRankLoad(const ExpertMap& map, int layer,
                                    const std::vector<double>& expert_load);

}  // namespace flotilla::coordinator
