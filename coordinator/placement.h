// The placement planner: from the registered workers and a requested layout,
// decide ranks, TP groups (kept inside a node when possible), EP over all
// ranks and the first expert map. Pure: no I/O, no gRPC.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/expert_map.h"
#include "common/model_config.h"
#include "common/parallel_config.h"

namespace flotilla::coordinator {

struct WorkerDesc {
  std::string worker_id;
  std::string node;          // host name; TP groups prefer one node
  int device_index = 0;      // GPU ordinal on the node (0 for CPU workers)
  uint64_t memory_bytes = 0; // device memory; 0 = unknown (no check)
};

struct LayoutRequest {
  int tp_size = 0;    // 0 = automatic
  int dp_groups = 0;  // 0 = automatic (all workers); else tp * dp must equal the workers
};

struct RankPlacement {
  int rank = 0;
  std::string worker_id;
  std::string node;
  int dp_group = 0;
  int tp_rank = 0;
};

struct Placement {
  ParallelConfig parallel;
  std::vector<RankPlacement> ranks;  // indexed by rank
  ExpertMap expert_map;
  std::vector<uint64_t> bytes_per_rank;  // estimated weight bytes each rank loads
  int groups_spanning_nodes = 0;         // TP groups that could not stay on one node
};

// Estimated weight bytes of one rank: its share of attention, its experts,
// and the replicated parts (norms, router, embedding, lm_head).
uint64_t EstimateRankBytes(const ModelConfig& model, int tp_size, int experts_on_rank);

// Refuses impossible layouts with a message that says why (no workers, tp that
// does not divide the heads or the worker count, dp * tp != workers, more
// workers than experts, shards that do not fit a worker's memory).
// Automatic tp: the largest divisor of the kv heads that also divides the
// worker count and fits in the smallest node, so TP never crosses nodes.
absl::StatusOr<Placement> PlanPlacement(const ModelConfig& model,
                                        const std::vector<WorkerDesc>& workers,
                                        const LayoutRequest& request);

}  // namespace flotilla::coordinator
