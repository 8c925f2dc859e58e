#include "coordinator/cluster/balancer.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "coordinator/cluster/expert_load_window.h"

namespace flotilla::coordinator {
namespace {

using Layer = std::vector<std::vector<ExpertLocation>>;  // [expert][replica]

// (max rank load, sum of squares): what a step tries to lower, in order.
std::pair<double, double> Score(const std::vector<double>& rank_load) {
  double max = 0, squares = 0;
  for (double v : rank_load) {
    max = std::max(max, v);
    squares += v * v;
  }
  return {max, squares};
}

std::vector<double> Loads(const std::vector<std::vector<int>>& ranks,
                          const std::vector<double>& load, int world) {
  std::vector<double> out(world, 0);
  for (size_t e = 0; e < ranks.size(); ++e) {
    for (int r : ranks[e]) out[r] += load[e] / ranks[e].size();
  }
  return out;
}

bool Holds(const std::vector<ExpertLocation>& replicas, int rank) {
  for (const ExpertLocation& at : replicas) {
    if (at.rank == rank) return true;
  }
  return false;
}

// Plans one layer's replicas: returns [expert] -> ranks of its replicas
// beyond the base one(s). `budget` is the bytes still allowed.
std::vector<std::vector<int>> PlanLayer(const BalancerInput& in, int layer, uint64_t* budget) {
  const int world = in.base.world_size(), E = in.base.num_experts();
  std::vector<std::vector<int>> ranks(E), extra(E);
  std::vector<int> spare(world);
  for (int r = 0; r < world; ++r) {
    spare[r] = std::max(0, in.slots_per_rank[r] - in.base.SlotsOnRank(layer, r));
  }
  for (int e = 0; e < E; ++e) {
    for (const ExpertLocation& at : in.base.replicas(layer, e)) ranks[e].push_back(at.rank);
  }
  const std::vector<double>& load = in.load[layer];
  auto score = Score(Loads(ranks, load, world));
  while (true) {
    int best_e = -1, best_r = -1;
    auto best = score;
    for (int e = 0; e < E; ++e) {
      if (load[e] <= 0) continue;
      for (int r = 0; r < world; ++r) {
        if (spare[r] == 0 || std::find(ranks[e].begin(), ranks[e].end(), r) != ranks[e].end()) {
          continue;
        }
        const uint64_t cost = Holds(in.current.replicas(layer, e), r) ? 0 : in.expert_bytes;
        if (in.max_bytes > 0 && cost > *budget) continue;
        ranks[e].push_back(r);
        auto s = Score(Loads(ranks, load, world));
        ranks[e].pop_back();
        if (s < best) {
          best = s;
          best_e = e;
          best_r = r;
        }
      }
    }
    if (best_e < 0) break;
    ranks[best_e].push_back(best_r);
    extra[best_e].push_back(best_r);
    --spare[best_r];
    const uint64_t cost = Holds(in.current.replicas(layer, best_e), best_r) ? 0 : in.expert_bytes;
    if (in.max_bytes > 0) *budget -= cost;
    score = best;
  }
  return extra;
}

// Base replicas plus `extra`, slots assigned: a replica the current map has
// in a spare slot keeps it, the others take the lowest free spare slot.
Layer PlaceLayer(const BalancerInput& in, int layer, const std::vector<std::vector<int>>& extra) {
  const int world = in.base.world_size(), E = in.base.num_experts();
  Layer out(E);
  std::vector<std::set<int>> used(world);
  for (int e = 0; e < E; ++e) {
    out[e] = in.base.replicas(layer, e);
    for (const ExpertLocation& at : out[e]) used[at.rank].insert(at.slot);
  }
  std::vector<std::pair<int, int>> fresh;  // (expert, rank) needing a slot
  for (int e = 0; e < E; ++e) {
    for (int r : extra[e]) {
      int kept = -1;
      for (const ExpertLocation& at : in.current.replicas(layer, e)) {
        if (at.rank == r && !used[r].count(at.slot) && at.slot < in.slots_per_rank[r])
          kept = at.slot;
      }
      if (kept >= 0) {
        out[e].push_back({r, kept});
        used[r].insert(kept);
      } else {
        fresh.push_back({e, r});
      }
    }
  }
  // Slots the current map fills stay untouched where possible: a GPU rank
  // loads new experts into slots the map in force leaves free.
  std::vector<std::set<int>> busy(world);
  for (int e = 0; e < E; ++e) {
    for (const ExpertLocation& at : in.current.replicas(layer, e)) busy[at.rank].insert(at.slot);
  }
  for (auto [e, r] : fresh) {
    int slot = 0;
    while (slot < in.slots_per_rank[r] && (used[r].count(slot) || busy[r].count(slot))) ++slot;
    if (slot >= in.slots_per_rank[r]) {
      slot = 0;
      while (used[r].count(slot)) ++slot;
    }
    out[e].push_back({r, slot});
    used[r].insert(slot);
  }
  return out;
}

double MeanOfLoaded(const std::vector<double>& layers) {
  double sum = 0;
  int n = 0;
  for (double v : layers) {
    if (v > 0) {
      sum += v;
      ++n;
    }
  }
  return n > 0 ? sum / n : 0;
}

}  // namespace

std::vector<double> PredictRankLoad(const ExpertMap& map, int layer,
                                    const std::vector<double>& expert_load) {
  std::vector<double> out(map.world_size(), 0);
  for (int e = 0; e < map.num_experts(); ++e) {
    const auto& reps = map.replicas(layer, e);
    for (const ExpertLocation& at : reps) out[at.rank] += expert_load[e] / reps.size();
  }
  return out;
}

absl::StatusOr<BalancerPlan> PlanRebalance(const BalancerInput& in) {
  const int L = in.current.num_layers(), E = in.current.num_experts(),
            world = in.current.world_size();
  if (in.base.num_layers() != L || in.base.num_experts() != E || in.base.world_size() != world ||
      static_cast<int>(in.load.size()) != L ||
      static_cast<int>(in.slots_per_rank.size()) != world) {
    return absl::InvalidArgumentError("balancer: maps, load and slots disagree in shape");
  }
  for (const auto& l : in.load) {
    if (static_cast<int>(l.size()) != E) {
      return absl::InvalidArgumentError("balancer: a layer's load has the wrong number of experts");
    }
  }
  BalancerPlan plan;
  uint64_t budget = in.max_bytes;
  // Layers in order of imbalance, so a tight byte bound goes where it helps most.
  std::vector<int> order(L);
  plan.layer_before.resize(L);
  for (int l = 0; l < L; ++l) {
    order[l] = l;
    plan.layer_before[l] = Imbalance(PredictRankLoad(in.current, l, in.load[l]));
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return plan.layer_before[a] > plan.layer_before[b]; });
  std::vector<Layer> layers(L);
  for (int l : order) layers[l] = PlaceLayer(in, l, PlanLayer(in, l, &budget));
  absl::StatusOr<ExpertMap> map = ExpertMap::Create(in.current.version() + 1, world, layers);
  if (!map.ok()) return map.status();
  plan.layer_after.resize(L);
  for (int l = 0; l < L; ++l) {
    plan.layer_after[l] = Imbalance(PredictRankLoad(*map, l, in.load[l]));
    for (int e = 0; e < E; ++e) {
      for (const ExpertLocation& at : map->replicas(l, e)) {
        if (!Holds(in.current.replicas(l, e), at.rank)) {
          ++plan.replicas_added;
          plan.bytes_moved += in.expert_bytes;
        }
      }
      for (const ExpertLocation& at : in.current.replicas(l, e)) {
        if (!Holds(map->replicas(l, e), at.rank)) ++plan.replicas_removed;
      }
      plan.changed |= map->replicas(l, e) != in.current.replicas(l, e);
    }
  }
  plan.imbalance_before = MeanOfLoaded(plan.layer_before);
  plan.imbalance_after = MeanOfLoaded(plan.layer_after);
  plan.map = plan.changed ? std::move(*map) : in.current;
  return plan;
}

}  // namespace flotilla::coordinator
