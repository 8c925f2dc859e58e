#include "coordinator/cluster/placement.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/comm_names.h"
#include "common/status.h"

namespace flotilla::coordinator {
namespace {

using NodeWorkers = std::map<std::string, std::vector<WorkerDesc>>;

const char* KindName(DeviceKind kind) { return kind == DeviceKind::kCuda ? "cuda" : "cpu"; }

absl::Status CheckWorkerIds(const std::vector<WorkerDesc>& workers) {
  std::set<std::string> ids;
  for (const WorkerDesc& w : workers) {
    if (!ids.insert(w.worker_id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker id '", w.worker_id, "' registered twice"));
    }
  }
  return absl::OkStatus();
}

// The ranks of an instance step in lockstep through one kind of engine.
absl::StatusOr<DeviceKind> OneDeviceKind(const std::vector<WorkerDesc>& workers) {
  const WorkerDesc& first = workers.front();
  for (const WorkerDesc& w : workers) {
    if (w.kind != first.kind) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the workers mix devices: '", first.worker_id, "' runs on ", KindName(first.kind),
          " and '", w.worker_id, "' on ", KindName(w.kind),
          "; an instance runs one kind of engine, so start every worker with the same --device"));
    }
  }
  return first.kind;
}

// GPU ranks of one node map each other's memory (CUDA IPC), so a node name
// must stand for one machine.
absl::Status CheckNodeIdentities(const std::vector<WorkerDesc>& workers) {
  std::map<std::string, const WorkerDesc*> host_of_node;
  for (const WorkerDesc& w : workers) {
    if (w.host_id.empty()) continue;
    auto [it, fresh] = host_of_node.emplace(w.node, &w);
    if (!fresh && it->second->host_id != w.host_id) {
      return absl::InvalidArgumentError(absl::StrCat(
          "workers '", it->second->worker_id, "' and '", w.worker_id, "' both say node '", w.node,
          "' but run on different machines (their host ids differ); GPU ranks of one node share "
          "memory, so give each machine its own --node name"));
    }
  }
  return absl::OkStatus();
}

// Workers per node, ordered by node then device so that ranks are stable.
NodeWorkers ByNode(std::vector<WorkerDesc> workers) {
  std::sort(workers.begin(), workers.end(), [](const WorkerDesc& a, const WorkerDesc& b) {
    return std::tie(a.node, a.device_index, a.worker_id) <
           std::tie(b.node, b.device_index, b.worker_id);
  });
  NodeWorkers by_node;
  for (WorkerDesc& w : workers) by_node[w.node].push_back(std::move(w));
  return by_node;
}

// Whether tp ranks per group tile every node exactly (no group spans nodes).
bool TilesEveryNode(int tp, const NodeWorkers& by_node) {
  for (const auto& [node, ws] : by_node) {
    if (ws.size() % tp != 0) return false;
  }
  return true;
}

// The largest tp dividing the heads and the world that keeps groups in nodes:
// fitting the smallest node on CPUs, tiling every node exactly on GPUs.
int AutomaticTp(const ModelConfig& model, int world, const NodeWorkers& by_node, DeviceKind kind) {
  int smallest_node = world;
  for (const auto& [node, ws] : by_node) smallest_node = std::min<int>(smallest_node, ws.size());
  const int g = std::gcd(std::gcd(model.num_key_value_heads, model.num_attention_heads), world);
  for (int t = g; t > 1; --t) {
    if (g % t != 0) continue;
    if (kind == DeviceKind::kCuda ? TilesEveryNode(t, by_node) : t <= smallest_node) return t;
  }
  return 1;
}

absl::StatusOr<int> ChooseTp(const ModelConfig& model, int world, const NodeWorkers& by_node,
                             DeviceKind kind, const LayoutRequest& request) {
  if (request.dp_groups < 0 || request.tp_size < 0) {
    return absl::InvalidArgumentError("tp and dp must be >= 0 (0 = automatic)");
  }
  int tp = request.tp_size;
  if (tp == 0 && request.dp_groups > 0) {
    if (world % request.dp_groups != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(request.dp_groups, " DP groups do not divide ", world, " workers"));
    }
    tp = world / request.dp_groups;
  }
  if (tp == 0) tp = AutomaticTp(model, world, by_node, kind);
  if (request.dp_groups > 0 && request.dp_groups * tp != world) {
    return absl::InvalidArgumentError(absl::StrCat("tp ", tp, " x dp ", request.dp_groups, " = ",
                                                   tp * request.dp_groups, " ranks but ", world,
                                                   " workers are registered"));
  }
  return tp;
}

// On GPUs a TP group's all-reduce runs twice per layer: it stays in one node.
absl::Status CheckGroupsInsideNodes(int tp, const NodeWorkers& by_node) {
  if (TilesEveryNode(tp, by_node)) return absl::OkStatus();
  std::vector<std::string> counts;
  std::vector<int> fitting;
  int gcd = 0;
  for (const auto& [node, ws] : by_node) {
    counts.push_back(absl::StrCat("'", node, "' ", ws.size()));
    gcd = std::gcd(gcd, static_cast<int>(ws.size()));
  }
  for (int t = 1; t <= gcd; ++t) {
    if (gcd % t == 0) fitting.push_back(t);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "tp ", tp,
      " would put a TP group across nodes (GPU workers per node: ", absl::StrJoin(counts, ", "),
      "); the ranks of a GPU TP group must share a node, since "
      "their all-reduce runs every layer. Use a tp that divides every node's worker count (",
      absl::StrJoin(fitting, ", "), ") and the model's heads, or add workers"));
}

// TP groups: whole groups inside each node first, leftovers grouped across nodes.
std::vector<std::vector<WorkerDesc>> FormGroups(int tp, const NodeWorkers& by_node, int* spanning) {
  std::vector<std::vector<WorkerDesc>> groups;
  std::vector<WorkerDesc> leftovers;
  for (const auto& [node, ws] : by_node) {
    size_t i = 0;
    for (; i + tp <= ws.size(); i += tp) groups.emplace_back(ws.begin() + i, ws.begin() + i + tp);
    leftovers.insert(leftovers.end(), ws.begin() + i, ws.end());
  }
  *spanning = 0;
  for (size_t i = 0; i < leftovers.size(); i += tp) {
    groups.emplace_back(leftovers.begin() + i, leftovers.begin() + i + tp);
    ++*spanning;
  }
  return groups;
}

// CPU workers: each one's memory (when reported) against its weights.
absl::Status CheckHostMemory(const std::vector<const WorkerDesc*>& rank_workers,
                             const Placement& p) {
  for (size_t rank = 0; rank < rank_workers.size(); ++rank) {
    const WorkerDesc& w = *rank_workers[rank];
    const uint64_t bytes = p.bytes_per_rank[rank];
    if (w.memory_bytes != 0 && bytes > w.memory_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("worker '", w.worker_id, "' has ", w.memory_bytes >> 20, " MiB but rank ",
                       rank, " needs about ", bytes >> 20, " MiB of weights with ",
                       p.parallel.ToString(), "; add workers or raise tp"));
    }
  }
  return absl::OkStatus();
}

// GPU ranks: memory per physical GPU, then the transport between them.
absl::Status PlanDevice(const ModelConfig& model,
                        const std::vector<const WorkerDesc*>& rank_workers,
                        cluster::DeviceTransport requested, Placement& p) {
  std::vector<GpuRankNeed> needs;
  for (size_t rank = 0; rank < rank_workers.size(); ++rank) {
    needs.push_back(EstimateGpuRankNeed(model, p.parallel.tp_size(),
                                        p.expert_map.SlotsOnRank(0, static_cast<int>(rank))));
    p.device_bytes_per_rank.push_back(needs.back().total());
  }
  FLOTILLA_RETURN_IF_ERROR(CheckGpuMemory(rank_workers, needs));
  FLOTILLA_ASSIGN_OR_RETURN(p.device_transport, ChooseDeviceTransport(rank_workers, requested));
  return absl::OkStatus();
}

}  // namespace

MoeLayout ChooseMoeLayout(cluster::MoeLayout requested, DeviceKind device, int world, int tp) {
  if (requested != cluster::MOE_LAYOUT_UNSPECIFIED) return ToMoeLayout(requested);
  return device == DeviceKind::kCuda && tp > 1 && world == tp ? MoeLayout::kTensorParallel
                                                              : MoeLayout::kExpertParallel;
}

absl::StatusOr<Placement> PlanPlacement(const ModelConfig& model,
                                        const std::vector<WorkerDesc>& workers,
                                        const LayoutRequest& request) {
  const int world = static_cast<int>(workers.size());
  if (world == 0) return absl::FailedPreconditionError("no workers registered");
  FLOTILLA_RETURN_IF_ERROR(CheckWorkerIds(workers));
  FLOTILLA_ASSIGN_OR_RETURN(const DeviceKind kind, OneDeviceKind(workers));
  const bool gpu = kind == DeviceKind::kCuda;
  if (gpu) FLOTILLA_RETURN_IF_ERROR(CheckNodeIdentities(workers));

  const NodeWorkers by_node = ByNode(workers);
  FLOTILLA_ASSIGN_OR_RETURN(const int tp, ChooseTp(model, world, by_node, kind, request));
  FLOTILLA_ASSIGN_OR_RETURN(
      ParallelConfig parallel,
      ParallelConfig::Create(world, tp, model, ChooseMoeLayout(request.moe, kind, world, tp)));
  if (gpu) FLOTILLA_RETURN_IF_ERROR(CheckGroupsInsideNodes(tp, by_node));
  int spanning = 0;
  const std::vector<std::vector<WorkerDesc>> groups = FormGroups(tp, by_node, &spanning);

  FLOTILLA_ASSIGN_OR_RETURN(
      ExpertMap map,
      ExpertMap::Contiguous(model.num_hidden_layers, model.num_local_experts, world, 1));
  Placement p{.parallel = parallel,
              .ranks = {},
              .expert_map = std::move(map),
              .bytes_per_rank = {},
              .groups_spanning_nodes = spanning,
              .device = kind,
              .device_bytes_per_rank = {},
              .device_transport = cluster::DEVICE_TRANSPORT_UNSPECIFIED};
  std::vector<const WorkerDesc*> rank_workers;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (int t = 0; t < tp; ++t) {
      const WorkerDesc& w = groups[g][t];
      const int rank = static_cast<int>(g) * tp + t;
      p.ranks.push_back(
          RankPlacement{rank, w.worker_id, w.node, static_cast<int>(g), t, w.device_index});
      // The tensor-parallel MoE holds 1/tp of every expert: E/tp experts' bytes.
      const int experts = parallel.moe_tp() ? (model.num_local_experts + tp - 1) / tp
                                            : p.expert_map.SlotsOnRank(0, rank);
      p.bytes_per_rank.push_back(EstimateRankBytes(model, tp, experts));
      rank_workers.push_back(&w);
    }
  }
  if (gpu) {
    FLOTILLA_RETURN_IF_ERROR(PlanDevice(model, rank_workers, request.device_transport, p));
  } else {
    FLOTILLA_RETURN_IF_ERROR(CheckHostMemory(rank_workers, p));
  }
  return p;
}

absl::Status CheckRankHolders(const ModelConfig& model, const Placement& placement,
                              const std::vector<WorkerDesc>& holders) {
  if (holders.size() != placement.ranks.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(holders.size(), " holders for ", placement.ranks.size(), " ranks"));
  }
  for (size_t rank = 0; rank < holders.size(); ++rank) {
    const WorkerDesc& w = holders[rank];
    if (w.kind != placement.device) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker '", w.worker_id, "' runs on ", KindName(w.kind),
                       " but the instance's ranks run on ", KindName(placement.device)));
    }
    if (placement.device == DeviceKind::kCuda && w.node != placement.ranks[rank].node) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker '", w.worker_id, "' is on node '", w.node, "' but rank ", rank,
                       "'s TP group is on node '", placement.ranks[rank].node, "'"));
    }
  }
  if (placement.device != DeviceKind::kCuda) return absl::OkStatus();
  std::vector<const WorkerDesc*> rank_workers;
  for (const WorkerDesc& w : holders) rank_workers.push_back(&w);
  Placement replanned = placement;
  replanned.device_bytes_per_rank.clear();
  // The transport stays, so ask for it: any other choice is refused.
  FLOTILLA_RETURN_IF_ERROR(PlanDevice(model, rank_workers, placement.device_transport, replanned));
  return absl::OkStatus();
}

}  // namespace flotilla::coordinator
