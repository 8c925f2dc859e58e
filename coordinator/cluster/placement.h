// The placement planner: from the registered workers and a requested layout,
// decide ranks, TP groups (kept inside a node when possible; always on GPUs),
// EP over all ranks, the first expert map and, for GPU ranks, whether each GPU
// holds its ranks' shards and which device transport links the ranks.
// Pure: no I/O, no gRPC.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/expert_map.h"
#include "common/model_config.h"
#include "common/parallel_config.h"
#include "coordinator/cluster/placement_memory.h"
#include "coordinator/cluster/placement_transport.h"
#include "coordinator/cluster/worker_desc.h"

namespace flotilla::coordinator {

struct LayoutRequest {
  int tp_size = 0;    // 0 = automatic
  int dp_groups = 0;  // 0 = automatic (all workers); else tp * dp must equal the workers
  // Between GPU ranks; UNSPECIFIED = automatic (placement_transport.h).
  cluster::DeviceTransport device_transport = cluster::DEVICE_TRANSPORT_UNSPECIFIED;
  // How the MoE layer is split; UNSPECIFIED = automatic (ChooseMoeLayout).
  cluster::MoeLayout moe = cluster::MOE_LAYOUT_UNSPECIFIED;
};

// The automatic MoE layout: tensor parallel for GPU instances of one TP group
// (tp > 1, dp 1: a token's MoE then needs one all-reduce in place of a
// dispatch and a combine, and the group holds every expert), expert parallel
// otherwise (attention data parallelism, several nodes, CPU instances).
MoeLayout ChooseMoeLayout(cluster::MoeLayout requested, DeviceKind device, int world, int tp);

struct RankPlacement {
  int rank = 0;
  std::string worker_id;
  std::string node;
  int dp_group = 0;
  int tp_rank = 0;
  int device_index = 0;  // the worker's GPU ordinal (0 for CPU ranks)
};

struct Placement {
  ParallelConfig parallel;
  std::vector<RankPlacement> ranks;  // indexed by rank
  ExpertMap expert_map;
  std::vector<uint64_t> bytes_per_rank;  // estimated weight bytes each rank loads
  int groups_spanning_nodes = 0;         // TP groups that could not stay on one node
  DeviceKind device = DeviceKind::kCpu;  // every rank's engine
  // GPU ranks: weights, the KV minimum and the runtime allowance each needs on
  // its GPU (empty for CPU ranks).
  std::vector<uint64_t> device_bytes_per_rank;
  // GPU ranks, W > 1: CUDA IPC or NCCL (placement_transport.h); else UNSPECIFIED.
  cluster::DeviceTransport device_transport = cluster::DEVICE_TRANSPORT_UNSPECIFIED;
};

// Refuses impossible layouts with a message that says why (no workers, tp that
// does not divide the heads or the worker count, dp * tp != workers, more
// workers than experts, CPU and GPU workers mixed, shards that do not fit a
// worker's memory). GPU workers also get: TP groups strictly inside nodes (a
// group's all-reduce runs every layer), each GPU's memory checked against the
// sum of its ranks' needs (several workers may share a GPU), and a device
// transport every rank can join.
// Automatic tp: the largest divisor of the heads that also divides the worker
// count and fits in the smallest node (on GPUs: divides every node's worker
// count), so TP does not cross nodes.
absl::StatusOr<Placement> PlanPlacement(const ModelConfig& model,
                                        const std::vector<WorkerDesc>& workers,
                                        const LayoutRequest& request);

// Whether `holders` (indexed by rank) can hold the ranks of `placement` as
// planned; used when newcomers take the ranks of workers that are gone. They
// must run the same kind of engine; on GPUs each must also be on its rank's
// node, the GPUs must hold the shards, and the device transport must stay.
absl::Status CheckRankHolders(const ModelConfig& model, const Placement& placement,
                              const std::vector<WorkerDesc>& holders);

}  // namespace flotilla::coordinator
