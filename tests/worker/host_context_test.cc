#include "worker/parallel/host_context.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/local/local_communicator.h"
#include "common/model_config.h"

namespace flotilla::parallel {
namespace {

constexpr int kHidden = 8;
constexpr int kTopK = 3;
constexpr int kExperts = 6;
constexpr int kLayers = 2;

// A model the layouts below are valid for (heads divisible by tp, W <= E).
ModelConfig Model() {
  ModelConfig c = ModelConfig::Tiny();
  c.num_local_experts = kExperts;
  c.num_experts_per_tok = kTopK;
  c.hidden_size = kHidden;
  return c;
}

// Context options for the model above.
ContextOptions Options() {
  ContextOptions o;
  o.hidden = kHidden;
  o.top_k = kTopK;
  return o;
}

// Uneven maps with replicas. Layer 0: expert e on rank e % W, and expert 0
// (hot) replicated on every rank. Layer 1: everything on rank 0 but the
// last expert (on the last rank), expert 2 also on rank 1, slots on rank 0
// in reverse expert order.
ExpertMap UnevenMap(int world, uint64_t version = 1) {
  std::vector<std::vector<std::vector<ExpertLocation>>> loc(kLayers);
  loc[0].resize(kExperts);
  std::vector<int> next_slot(world, 0);
  for (int e = 0; e < kExperts; ++e) {
    const int r = e % world;
    loc[0][e].push_back({r, next_slot[r]++});
  }
  for (int r = 1; r < world; ++r) loc[0][0].push_back({r, next_slot[r]++});
  loc[1].resize(kExperts);
  for (int e = 0; e < kExperts - 1; ++e) loc[1][e].push_back({0, kExperts - 2 - e});
  loc[1][kExperts - 1].push_back({world - 1, 0});
  loc[1][2].push_back({1, 1});
  return *ExpertMap::Create(version, world, std::move(loc));
}

// The map with layers 0 and 1 swapped (a rebalanced placement).
ExpertMap SwappedMap(int world) {
  auto loc = UnevenMap(world).locations();
  std::swap(loc[0], loc[1]);
  return *ExpertMap::Create(2, world, std::move(loc));
}

// The tokens a DP group runs in one step: a TP group holds identical ones.
struct GroupTokens {
  std::vector<float> x;      // [n, hidden]
  std::vector<int32_t> ids;  // [n, k]
  std::vector<float> w;      // [n, k]
  int64_t n = 0;
};

GroupTokens TokensOf(int group, int step) {
  GroupTokens g;
  // Group 1 has none; the others differ in count from step to step.
  g.n = group == 1 ? 0 : 3 + 2 * group + step;
  for (int64_t t = 0; t < g.n; ++t) {
    for (int h = 0; h < kHidden; ++h) {
      g.x.push_back(0.37f * static_cast<float>(group + 1) + 0.011f * t - 0.05f * h + 0.3f * step);
    }
    for (int j = 0; j < kTopK; ++j) {
      // Descending ids for odd tokens, so Combine must sort.
      const int first = static_cast<int>((t + group) % kExperts);
      const int e = (first + (t % 2 == 0 ? j : kTopK - 1 - j) * 2) % kExperts;
      g.ids.push_back(e);
      g.w.push_back(0.2f + 0.13f * static_cast<float>((t + j) % 5));
    }
  }
  return g;
}

// The fake expert: depends only on the expert (not on which replica runs it).
float FakeExpert(float x, int expert) { return x * static_cast<float>(expert + 1) + 0.5f * expert; }

// What Combine must give: the experts in ascending id, `+= out * w` from 0.
std::vector<float> Expected(const GroupTokens& g) {
  std::vector<float> y(g.n * kHidden, 0.0f);
  for (int64_t t = 0; t < g.n; ++t) {
    std::vector<int> order(kTopK);
    for (int j = 0; j < kTopK; ++j) order[j] = j;
    std::sort(order.begin(), order.end(),
              [&](int a, int b) { return g.ids[t * kTopK + a] < g.ids[t * kTopK + b]; });
    for (int j : order) {
      const int e = g.ids[t * kTopK + j];
      for (int h = 0; h < kHidden; ++h) {
        y[t * kHidden + h] += FakeExpert(g.x[t * kHidden + h], e) * g.w[t * kTopK + j];
      }
    }
  }
  return y;
}

// Expert id at (rank, slot) of `layer`, or -1.
int ExpertAt(const ExpertMap& map, int layer, int rank, int slot) {
  for (int e = 0; e < map.num_experts(); ++e) {
    for (const ExpertLocation& at : map.replicas(layer, e)) {
      if (at.rank == rank && at.slot == slot) return e;
    }
  }
  return -1;
}

// Runs `body(rank, context)` on every rank of a W-rank instance in threads.
void RunRanks(int world, int tp, const std::function<void(int, ParallelContext&)>& body) {
  auto config = ParallelConfig::Create(world, tp, Model());
  ASSERT_TRUE(config.ok()) << config.status();
  auto rendezvous = *comm::LocalRendezvous::Create(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      auto comm = comm::LocalCommunicator::Create(rendezvous, r, {absl::Seconds(10)});
      ASSERT_TRUE(comm.ok()) << comm.status();
      ContextOptions o = Options();
      o.max_tokens_per_step = 16;
      auto context = CreateHostContext(*config, UnevenMap(world), comm->get(), o);
      ASSERT_TRUE(context.ok()) << context.status();
      body(r, **context);
    });
  }
  for (auto& t : ranks) t.join();
}

class HostContextLayouts : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(HostContextLayouts, DispatchAndCombineEqualTheDirectSumOnEveryRank) {
  const auto [world, tp] = GetParam();
  RunRanks(world, tp, [&](int rank, ParallelContext& context) {
    EXPECT_EQ(context.backend(), "host");
    EXPECT_EQ(context.tp().size(), tp);
    EXPECT_EQ(context.tp().rank(), rank % tp);
    const int group = rank / tp;
    for (int step = 0; step < 3; ++step) {
      // Step 2 runs on a new placement, switched at the step boundary.
      if (step == 2) context.SetExpertMap(SwappedMap(world));
      const ExpertMap& map = context.expert_map();
      GroupTokens g = TokensOf(group, step);
      context.ep().SetStepTokens(16);
      for (int layer = 0; layer < kLayers; ++layer) {
        auto rows = context.ep().Dispatch(layer, g.x.data(), g.ids.data(), g.w.data(), g.n);
        ASSERT_TRUE(rows.ok()) << rows.status();
        const float* x = static_cast<const float*>(rows->x);
        for (int64_t i = 0; i < rows->rows; ++i) {
          const int expert = ExpertAt(map, layer, rank, rows->slot[i]);
          ASSERT_GE(expert, 0) << "slot " << rows->slot[i] << " is empty on rank " << rank;
          EXPECT_EQ(rows->ones[i], 1.0f);
          for (int h = 0; h < kHidden; ++h) {
            EXPECT_EQ(rows->out[i * kHidden + h], 0.0f);
            rows->out[i * kHidden + h] = FakeExpert(x[i * kHidden + h], expert);
          }
        }
        std::vector<float> y(g.n * kHidden, -1.0f);
        ASSERT_TRUE(context.ep().Combine(layer, y.data()).ok());
        EXPECT_EQ(y, Expected(g)) << "rank " << rank << " step " << step << " layer " << layer;
      }
    }
  });
}

TEST_P(HostContextLayouts, AllReduceGivesEveryTpRankTheSameBitsInTpRankOrder) {
  const auto [world, tp] = GetParam();
  constexpr int64_t kCount = 37;
  // Values of very different magnitudes: the sum's bits depend on its order.
  auto part = [](int rank, int64_t i) {
    const float big = (i % 3 == 0 ? 1e8f : 1.0f) * (rank % 2 == 0 ? 1 : -1);
    return big + 0.1f * static_cast<float>(rank * kCount + i);
  };
  std::vector<std::vector<float>> got(world);
  RunRanks(world, tp, [&](int rank, ParallelContext& context) {
    std::vector<float> data(kCount);
    for (int64_t i = 0; i < kCount; ++i) data[i] = part(rank, i);
    ASSERT_TRUE(context.tp().AllReduce(data.data(), kCount).ok());
    // A second, shorter call reuses the workspaces.
    std::vector<float> one = {static_cast<float>(rank)};
    ASSERT_TRUE(context.tp().AllReduce(one.data(), 1).ok());
    const int first = rank / tp * tp;
    float want_one = 0.0f;
    for (int r = first; r < first + tp; ++r) want_one += static_cast<float>(r);
    EXPECT_EQ(one[0], want_one);
    got[rank] = data;
  });
  for (int rank = 0; rank < world; ++rank) {
    const int first = rank / tp * tp;
    std::vector<float> want(kCount);
    for (int64_t i = 0; i < kCount; ++i) {
      float sum = 0.0f;
      for (int r = first; r < first + tp; ++r) sum += part(r, i);
      want[i] = tp == 1 ? part(rank, i) : sum;
    }
    EXPECT_EQ(got[rank], want) << "rank " << rank;
  }
}

TEST(HostContext, AHotExpertsRowsAreSpreadOverItsReplicas) {
  constexpr int kWorld = 4;
  constexpr int64_t kTokens = 8;
  std::vector<int> rows_of_hot(kWorld, 0);  // rows of expert 0 (a replica on every rank)
  RunRanks(kWorld, 1, [&](int rank, ParallelContext& context) {
    std::vector<float> x(kTokens * kHidden, 1.0f), w(kTokens * kTopK, 0.5f);
    std::vector<int32_t> ids;
    for (int64_t t = 0; t < kTokens; ++t) ids.insert(ids.end(), {0, 1, 2});
    auto rows = context.ep().Dispatch(0, x.data(), ids.data(), w.data(), kTokens);
    ASSERT_TRUE(rows.ok()) << rows.status();
    for (int64_t i = 0; i < rows->rows; ++i) {
      if (ExpertAt(context.expert_map(), 0, rank, rows->slot[i]) == 0) ++rows_of_hot[rank];
    }
    std::vector<float> y(kTokens * kHidden);
    ASSERT_TRUE(context.ep().Combine(0, y.data()).ok());
  });
  EXPECT_EQ(std::accumulate(rows_of_hot.begin(), rows_of_hot.end(), 0), kWorld * kTokens);
  EXPECT_GT(std::count_if(rows_of_hot.begin(), rows_of_hot.end(), [](int n) { return n > 0; }), 1);
}

INSTANTIATE_TEST_SUITE_P(Layouts, HostContextLayouts,
                         ::testing::Values(std::pair{2, 1}, std::pair{2, 2}, std::pair{4, 1},
                                           std::pair{4, 2}),
                         [](const auto& info) {
                           return absl::StrCat("W", info.param.first, "_TP", info.param.second);
                         });

TEST(HostContext, CreateRefusesWhatCannotWork) {
  const ModelConfig model = Model();
  auto rendezvous = *comm::LocalRendezvous::Create(2);
  auto comm = *comm::LocalCommunicator::Create(rendezvous, 0);
  const ContextOptions o = Options();
  // The communicator spans 2 ranks, the layout 4.
  auto four = *ParallelConfig::Create(4, 1, model);
  EXPECT_EQ(CreateHostContext(four, UnevenMap(4), comm.get(), o).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto two = *ParallelConfig::Create(2, 1, model);
  EXPECT_EQ(CreateHostContext(two, UnevenMap(4), comm.get(), o).status().code(),
            absl::StatusCode::kInvalidArgument);
  ContextOptions device = o;
  device.memory = Memory::kDevice;
  EXPECT_EQ(CreateHostContext(two, UnevenMap(2), comm.get(), device).status().code(),
            absl::StatusCode::kInvalidArgument);
  ContextOptions too_many = o;
  too_many.top_k = kExperts + 1;
  EXPECT_EQ(CreateHostContext(two, UnevenMap(2), comm.get(), too_many).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(HostContext, BadCallsFailBeforeAnythingIsSent) {
  const ModelConfig model = Model();
  auto rendezvous = *comm::LocalRendezvous::Create(2);
  auto comm = *comm::LocalCommunicator::Create(rendezvous, 0);
  const ContextOptions o = Options();
  auto context =
      *CreateHostContext(*ParallelConfig::Create(2, 1, model), UnevenMap(2), comm.get(), o);
  std::vector<float> x(kHidden), w(kTopK, 0.5f), y(kHidden);
  std::vector<int32_t> bad_ids = {0, 1, kExperts};
  EXPECT_EQ(context->ep().Dispatch(0, x.data(), bad_ids.data(), w.data(), 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> ids = {0, 1, 2};
  EXPECT_EQ(context->ep().Dispatch(kLayers, x.data(), ids.data(), w.data(), 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(context->ep().Combine(0, y.data()).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace flotilla::parallel
