#include "worker/engine/rank_shard.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace flotilla {

absl::StatusOr<RankShard> ShardOfRank(const ModelConfig& c, const parallel::ParallelContext* p) {
  RankShard shard;
  const int L = c.num_hidden_layers, E = c.num_local_experts;
  if (p == nullptr || p->config().moe_tp()) {
    std::vector<int> all(E);
    for (int e = 0; e < E; ++e) all[e] = e;
    shard.slot_expert.assign(L, all);
    shard.max_slots = E;
    if (p != nullptr) {
      shard.tp_rank = p->config().tp_rank_of(p->rank());
      shard.tp_size = p->config().tp_size();
      shard.moe_tp = true;
    }
    return shard;
  }
  const ParallelConfig& pc = p->config();
  const ExpertMap& map = p->expert_map();
  if (map.num_layers() != L || map.num_experts() != E || map.world_size() != pc.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda engine: the expert map covers ", map.num_layers(), " layers x ", map.num_experts(),
        " experts over ", map.world_size(), " ranks; the model has ", L, " x ", E,
        " and the instance ", pc.world_size(), " ranks"));
  }
  shard.tp_rank = pc.tp_rank_of(p->rank());
  shard.tp_size = pc.tp_size();
  shard.slot_expert.resize(L);
  for (int l = 0; l < L; ++l) {
    std::vector<int>& slots = shard.slot_expert[l];
    slots.assign(map.SlotsOnRank(l, p->rank()), -1);
    for (int e = 0; e < E; ++e) {
      for (const ExpertLocation& loc : map.replicas(l, e)) {
        if (loc.rank == p->rank()) slots[loc.slot] = e;
      }
    }
    shard.max_slots = std::max(shard.max_slots, static_cast<int>(slots.size()));
  }
  if (shard.max_slots == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda engine: rank ", p->rank(), " holds no expert"));
  }
  return shard;
}

}  // namespace flotilla
