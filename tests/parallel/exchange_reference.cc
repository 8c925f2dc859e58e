#include "tests/parallel/exchange_reference.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "common/bf16.h"
#include "kernels/cuda/ep_exchange.h"
#include "tests/parallel/fake_experts.h"

namespace flotilla::parallel::testing {
namespace {

std::mt19937_64 Rng(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  std::seed_seq seq{a, b, c, d};
  return std::mt19937_64(seq);
}

}  // namespace

ExpertMap ScenarioMap(const Scenario& s) {
  std::vector<std::vector<std::vector<ExpertLocation>>> layers(static_cast<size_t>(s.layers));
  for (int l = 0; l < s.layers; ++l) {
    std::vector<int> next_slot(static_cast<size_t>(s.world), 0);
    auto& layer = layers[static_cast<size_t>(l)];
    layer.resize(static_cast<size_t>(s.experts));
    for (int e = 0; e < s.experts; ++e) {
      const int primary = l == 0 ? e * s.world / s.experts : (e * 7 + 3) % s.world;
      layer[e].push_back({primary, next_slot[primary]++});
      if (l > 0 && s.world > 1 && e % 3 == 0) {
        const int second = (primary + 1) % s.world;
        layer[e].push_back({second, next_slot[second]++});
      }
    }
  }
  return *ExpertMap::Create(1, s.world, std::move(layers));
}

int GroupTokens(const Scenario& s, uint64_t step, int group) {
  if (step % 4 == 1) return group % 2 == 0 ? 0 : static_cast<int>(s.max_tokens);
  auto rng = Rng(step, group, 17, 0);
  // Two steps in four stay within 8 tokens, so their combines go as
  // flagged lines (at most kEpLlMaxCap rows per segment at top-4).
  const int64_t most = step % 4 >= 2 ? std::min<int64_t>(s.max_tokens, 8) : s.max_tokens;
  return static_cast<int>(rng() % static_cast<uint64_t>(most + 1));
}

GroupData MakeGroupData(const Scenario& s, uint64_t step, int layer, int group, int tokens) {
  GroupData d;
  d.tokens = tokens;
  auto rng = Rng(step, layer, group, 29);
  std::uniform_real_distribution<float> value(-2.f, 2.f), weight(0.f, 1.f);
  d.x.resize(static_cast<size_t>(tokens) * s.hidden);
  for (auto& v : d.x) v = FloatToBf16(value(rng));
  std::vector<int32_t> experts(static_cast<size_t>(s.experts));
  std::iota(experts.begin(), experts.end(), 0);
  for (int t = 0; t < tokens; ++t) {
    std::shuffle(experts.begin(), experts.end(), rng);
    for (int j = 0; j < s.top_k; ++j) {
      d.ids.push_back(experts[static_cast<size_t>(j)]);
      d.w.push_back(weight(rng));
    }
  }
  return d;
}

std::vector<std::vector<ExpectedRow>> ExpectedRows(const Scenario& s, const ExpertMap& map,
                                                   int layer, int rank,
                                                   const std::vector<GroupData>& groups) {
  std::vector<std::vector<ExpectedRow>> rows(static_cast<size_t>(s.world));
  for (int source = 0; source < s.world; ++source) {
    const GroupData& g = groups[static_cast<size_t>(source / s.tp)];
    for (int t = source % s.tp; t < g.tokens; t += s.tp) {
      for (int j = 0; j < s.top_k; ++j) {
        const auto& replicas = map.replicas(layer, g.ids[static_cast<size_t>(t) * s.top_k + j]);
        const ExpertLocation& at = replicas[static_cast<size_t>(
            kernels::cuda::EpReplicaIndex(t, j, static_cast<int>(replicas.size())))];
        if (at.rank == rank) rows[static_cast<size_t>(source)].push_back({t, at.slot});
      }
    }
  }
  return rows;
}

std::vector<int32_t> ExpertOfSlot(const ExpertMap& map, int layer, int rank) {
  std::vector<int32_t> of(static_cast<size_t>(std::max(map.SlotsOnRank(layer, rank), 1)), -1);
  for (int e = 0; e < map.num_experts(); ++e) {
    for (const ExpertLocation& loc : map.replicas(layer, e)) {
      if (loc.rank == rank) of[static_cast<size_t>(loc.slot)] = e;
    }
  }
  return of;
}

std::vector<float> ExpectedY(const Scenario& s, const GroupData& d) {
  std::vector<float> y(static_cast<size_t>(d.tokens) * s.hidden);
  for (int t = 0; t < d.tokens; ++t) {
    std::vector<int> order(static_cast<size_t>(s.top_k));
    std::iota(order.begin(), order.end(), 0);
    const int32_t* ids = &d.ids[static_cast<size_t>(t) * s.top_k];
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return ids[a] < ids[b]; });
    for (int h = 0; h < s.hidden; ++h) {
      const float x = Bf16ToFloat(d.x[static_cast<size_t>(t) * s.hidden + h]);
      float acc = 0.f;
      for (size_t r = 0; r < order.size(); ++r) {
        const int j = order[r];
        const float out = SyntheticAdd(0.f, SyntheticMul(1.f, FakeExpert(x, ids[j], h)));
        const float p = SyntheticMul(d.w[static_cast<size_t>(t) * s.top_k + j], out);
        acc = r == 0 ? p : SyntheticAdd(acc, p);
      }
      y[static_cast<size_t>(t) * s.hidden + h] = acc;
    }
  }
  return y;
}

std::vector<float> ReduceInput(uint64_t seed, int rank, int64_t count) {
  auto rng = Rng(seed, rank, 43, 0);
  std::uniform_real_distribution<float> value(-1.f, 1.f);
  std::vector<float> v(static_cast<size_t>(count));
  for (auto& e : v) e = value(rng);
  return v;
}

std::vector<float> ExpectedReduce(const Scenario& s, uint64_t seed, int rank, int64_t count) {
  const int first = rank - rank % s.tp;
  std::vector<float> sum = ReduceInput(seed, first, count);
  for (int q = 1; q < s.tp; ++q) {
    const std::vector<float> part = ReduceInput(seed, first + q, count);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = SyntheticAdd(sum[i], part[i]);
  }
  return sum;
}

}  // namespace flotilla::parallel::testing
