#include "coordinator/placement.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

namespace flotilla::coordinator {
namespace {

std::vector<WorkerDesc> Workers(std::vector<std::pair<std::string, int>> nodes) {
  std::vector<WorkerDesc> out;
  for (auto& [node, n] : nodes) {
    for (int d = 0; d < n; ++d) out.push_back({node + "-gpu" + std::to_string(d), node, d, 0});
  }
  return out;
}

TEST(ParallelConfig, RejectsImpossibleLayoutsWithReason) {
  ModelConfig m = ModelConfig::Gptoss120b();
  EXPECT_TRUE(ParallelConfig::Create(8, 8, m).ok());
  auto s = ParallelConfig::Create(6, 4, m);
  EXPECT_NE(s.status().message().find("does not divide"), std::string::npos) << s.status();
  s = ParallelConfig::Create(12, 3, m);
  EXPECT_NE(s.status().message().find("kv heads"), std::string::npos) << s.status();
  s = ParallelConfig::Create(256, 1, m);
  EXPECT_NE(s.status().message().find("experts"), std::string::npos) << s.status();
  auto ok = ParallelConfig::Create(16, 4, m);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->dp_size(), 4);
  EXPECT_EQ(ok->dp_group_of(9), 2);
  EXPECT_EQ(ok->tp_rank_of(9), 1);
  EXPECT_EQ(ok->leader_of_group(2), 8);
}

TEST(ExpertMap, ContiguousSpreadsRemainderAndCoversAll) {
  auto m = ExpertMap::Contiguous(3, 10, 4);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->ExpertsOnRank(0, 0), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(m->ExpertsOnRank(2, 1), (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(m->ExpertsOnRank(1, 3), (std::vector<int>{8, 9}));
  EXPECT_EQ(m->SlotsOnRank(0, 3), 2);
  EXPECT_EQ(m->replicas(0, 7)[0], (ExpertLocation{2, 1}));
}

TEST(ExpertMap, ValidatesExplicitMaps) {
  using L = std::vector<std::vector<std::vector<ExpertLocation>>>;
  // Expert 1 replicated on both ranks.
  auto ok = ExpertMap::Create(2, 2, L{{{{0, 0}}, {{0, 1}, {1, 1}}, {{1, 0}}}});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->replicas(0, 1).size(), 2u);
  EXPECT_EQ(ok->version(), 2u);
  EXPECT_FALSE(ExpertMap::Create(2, 2, L{{{{0, 0}}, {}}}).ok());                 // no replica
  EXPECT_FALSE(ExpertMap::Create(2, 2, L{{{{0, 0}}, {{0, 0}}}}).ok());           // slot twice
  EXPECT_FALSE(ExpertMap::Create(2, 2, L{{{{0, 0}}, {{2, 0}}}}).ok());           // bad rank
  EXPECT_FALSE(ExpertMap::Create(2, 2, L{{{{0, 0}}, {{1, 0}}}, {{{0, 0}}}}).ok());  // ragged
}

TEST(Placement, KeepsTpGroupsInsideNodes) {
  // Two nodes of 4 GPUs, tp 4: each group on one node.
  auto p = PlanPlacement(ModelConfig::Gptoss120b(), Workers({{"b", 4}, {"a", 4}}), {4, 0});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->groups_spanning_nodes, 0);
  for (const RankPlacement& r : p->ranks) {
    EXPECT_EQ(r.node, r.dp_group == 0 ? "a" : "b") << r.rank;
    EXPECT_EQ(r.tp_rank, r.rank % 4);
  }
  EXPECT_EQ(p->expert_map.SlotsOnRank(0, 7), 16);
}

TEST(Placement, GroupsCrossNodesOnlyWhenUnavoidable) {
  // Nodes of 3 and 1 workers with tp 2: one group on node a, one across a and b.
  auto p = PlanPlacement(ModelConfig::Gptoss120b(), Workers({{"a", 3}, {"b", 1}}), {2, 0});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->groups_spanning_nodes, 1);
  EXPECT_EQ(p->ranks[0].node, "a");
  EXPECT_EQ(p->ranks[1].node, "a");
}

TEST(Placement, AutomaticTpFitsSmallestNode) {
  auto p = PlanPlacement(ModelConfig::Gptoss120b(), Workers({{"a", 8}, {"b", 8}}), {});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->parallel.tp_size(), 8);
  p = PlanPlacement(ModelConfig::Gptoss120b(), Workers({{"a", 2}, {"b", 4}}), {});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->parallel.tp_size(), 2);
  EXPECT_EQ(p->groups_spanning_nodes, 0);
  p = PlanPlacement(ModelConfig::Tiny(), Workers({{"a", 3}}), {});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->parallel.tp_size(), 1);  // 3 does not divide 2 kv heads
  p = PlanPlacement(ModelConfig::Gptoss120b(), Workers({{"a", 4}}), {0, 2});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->parallel.tp_size(), 2);
}

TEST(Placement, RefusesImpossibleLayouts) {
  ModelConfig m = ModelConfig::Gptoss120b();
  EXPECT_EQ(PlanPlacement(m, {}, {}).status().code(), absl::StatusCode::kFailedPrecondition);
  auto s = PlanPlacement(m, Workers({{"a", 4}}), {2, 3});
  EXPECT_NE(s.status().message().find("4 workers"), std::string::npos) << s.status();
  s = PlanPlacement(m, Workers({{"a", 6}}), {4, 0});
  EXPECT_FALSE(s.ok());
  std::vector<WorkerDesc> dup = Workers({{"a", 2}});
  dup[1].worker_id = dup[0].worker_id;
  EXPECT_NE(PlanPlacement(m, dup, {}).status().message().find("twice"), std::string::npos);
}

TEST(Placement, RefusesShardsThatDoNotFit) {
  // 120b on one 80 GB GPU: ~65 GB of weights fits; on two 24 GB GPUs it cannot.
  ModelConfig m = ModelConfig::Gptoss120b();
  std::vector<WorkerDesc> one = Workers({{"a", 1}});
  one[0].memory_bytes = 80ull << 30;
  auto p = PlanPlacement(m, one, {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_GT(p->bytes_per_rank[0], 55ull << 30);
  EXPECT_LT(p->bytes_per_rank[0], 70ull << 30);
  std::vector<WorkerDesc> two = Workers({{"a", 2}});
  for (auto& w : two) w.memory_bytes = 24ull << 30;
  auto s = PlanPlacement(m, two, {});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.status().message().find("MiB"), std::string::npos) << s.status();
}

}  // namespace
}  // namespace flotilla::coordinator
