#include "coordinator/placement.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace flotilla::coordinator {

uint64_t EstimateRankBytes(const ModelConfig& m, int tp_size, int experts_on_rank) {
  const uint64_t H = m.hidden_size, I = m.intermediate_size, D = m.head_dim;
  const uint64_t q = m.num_attention_heads * D / tp_size, kv = m.num_key_value_heads * D / tp_size;
  // bf16 attention: q, k, v (with bias), o column slice, sinks.
  const uint64_t attn = 2 * ((q + 2 * kv) * (H + 1) + H * q + H) + 4 * q;
  // MXFP4 expert: 17 bytes per 32 weights, bf16 biases.
  const uint64_t expert = (2 * I * H + H * I) / 32 * 17 + 2 * (2 * I + H);
  const uint64_t router = 2 * (m.num_local_experts * (H + 1));
  const uint64_t norms = 2 * 2 * H;
  const uint64_t per_layer = attn + router + norms;
  const uint64_t embed = 2 * uint64_t(m.vocab_size) * H;
  return m.num_hidden_layers * (per_layer + expert * experts_on_rank) + 2 * embed + 2 * H;
}

absl::StatusOr<Placement> PlanPlacement(const ModelConfig& model,
                                        const std::vector<WorkerDesc>& workers,
                                        const LayoutRequest& request) {
  const int world = static_cast<int>(workers.size());
  if (world == 0) return absl::FailedPreconditionError("no workers registered");
  {
    std::set<std::string> ids;
    for (const WorkerDesc& w : workers) {
      if (!ids.insert(w.worker_id).second) {
        return absl::InvalidArgumentError(absl::StrCat("worker id '", w.worker_id,
                                                       "' registered twice"));
      }
    }
  }

  // Workers per node, ordered by node then device so ranks are stable.
  std::vector<WorkerDesc> sorted = workers;
  std::sort(sorted.begin(), sorted.end(), [](const WorkerDesc& a, const WorkerDesc& b) {
    return std::tie(a.node, a.device_index, a.worker_id) <
           std::tie(b.node, b.device_index, b.worker_id);
  });
  std::map<std::string, std::vector<WorkerDesc>> by_node;
  for (const WorkerDesc& w : sorted) by_node[w.node].push_back(w);
  int smallest_node = world;
  for (auto& [node, ws] : by_node) smallest_node = std::min<int>(smallest_node, ws.size());

  int tp = request.tp_size;
  if (request.dp_groups < 0 || tp < 0) {
    return absl::InvalidArgumentError("tp and dp must be >= 0 (0 = automatic)");
  }
  if (tp == 0 && request.dp_groups > 0) {
    if (world % request.dp_groups != 0) {
      return absl::InvalidArgumentError(absl::StrCat(request.dp_groups,
                                                     " DP groups do not divide ", world,
                                                     " workers"));
    }
    tp = world / request.dp_groups;
  }
  if (tp == 0) {
    const int g = std::gcd(std::gcd(model.num_key_value_heads, model.num_attention_heads), world);
    tp = 1;
    for (int t = g; t >= 1; --t) {
      if (g % t == 0 && t <= smallest_node) {
        tp = t;
        break;
      }
    }
  }
  if (request.dp_groups > 0 && request.dp_groups * tp != world) {
    return absl::InvalidArgumentError(absl::StrCat("tp ", tp, " x dp ", request.dp_groups, " = ",
                                                   tp * request.dp_groups, " ranks but ", world,
                                                   " workers are registered"));
  }
  FLOTILLA_ASSIGN_OR_RETURN(ParallelConfig parallel, ParallelConfig::Create(world, tp, model));

  // TP groups: whole groups inside each node first, leftovers grouped across nodes.
  std::vector<std::vector<WorkerDesc>> groups;
  std::vector<WorkerDesc> leftovers;
  for (auto& [node, ws] : by_node) {
    size_t i = 0;
    for (; i + tp <= ws.size(); i += tp) groups.emplace_back(ws.begin() + i, ws.begin() + i + tp);
    leftovers.insert(leftovers.end(), ws.begin() + i, ws.end());
  }
  int spanning = 0;
  for (size_t i = 0; i < leftovers.size(); i += tp) {
    groups.emplace_back(leftovers.begin() + i, leftovers.begin() + i + tp);
    ++spanning;
  }

  FLOTILLA_ASSIGN_OR_RETURN(
      ExpertMap map,
      ExpertMap::Contiguous(model.num_hidden_layers, model.num_local_experts, world, 1));

  Placement p{.parallel = parallel, .ranks = {}, .expert_map = std::move(map),
              .bytes_per_rank = {}, .groups_spanning_nodes = spanning};
  for (size_t g = 0; g < groups.size(); ++g) {
    for (int t = 0; t < tp; ++t) {
      const WorkerDesc& w = groups[g][t];
      const int rank = static_cast<int>(g) * tp + t;
      p.ranks.push_back(RankPlacement{rank, w.worker_id, w.node, static_cast<int>(g), t});
      const uint64_t bytes =
          EstimateRankBytes(model, tp, p.expert_map.SlotsOnRank(0, rank));
      p.bytes_per_rank.push_back(bytes);
      if (w.memory_bytes != 0 && bytes > w.memory_bytes) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "worker '", w.worker_id, "' has ", w.memory_bytes >> 20, " MiB but rank ", rank,
            " needs about ", bytes >> 20, " MiB of weights with ", parallel.ToString(),
            "; add workers or raise tp"));
      }
    }
  }
  return p;
}

}  // namespace flotilla::coordinator
