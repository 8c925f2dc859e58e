// The balancer's plan on recorded expert counts, and the load window.
#include "coordinator/cluster/balancer.h"

#include <gtest/gtest.h>

#include "coordinator/cluster/expert_load_window.h"

namespace flotilla::coordinator {
namespace {

constexpr int kLayers = 2, kExperts = 8, kWorld = 4;

// Counts recorded from a skewed EP-4 run: experts 0 and 1 (both on rank 0)
// picked by every token, the other two of each token's top 4 spread evenly.
std::vector<std::vector<double>> HotLoad() {
  std::vector<double> layer(kExperts, 2000.0 / 6);
  layer[0] = layer[1] = 1000;
  return std::vector<std::vector<double>>(kLayers, layer);
}

BalancerInput Input(int spare_slots, uint64_t max_bytes = 0) {
  BalancerInput in;
  in.base = *ExpertMap::Contiguous(kLayers, kExperts, kWorld, 1);
  in.current = in.base;
  in.load = HotLoad();
  in.slots_per_rank.assign(kWorld, 2 + spare_slots);
  in.expert_bytes = 1000;
  in.max_bytes = max_bytes;
  return in;
}

TEST(Balancer, ReplicatesTheHotExpertsUntilTheMostLoadedRankIsNearTheMean) {
  absl::StatusOr<BalancerPlan> plan = PlanRebalance(Input(2));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NEAR(plan->imbalance_before, 2.0, 1e-9);
  EXPECT_LT(plan->imbalance_after, 1.25);
  EXPECT_TRUE(plan->changed);
  EXPECT_EQ(plan->map.version(), 2u);
  EXPECT_GT(plan->replicas_added, 0);
  EXPECT_EQ(plan->bytes_moved, plan->replicas_added * 1000u);
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_GT(plan->map.replicas(l, 0).size(), 1u);
    EXPECT_GT(plan->map.replicas(l, 1).size(), 1u);
    // Base experts stay where they were loaded; replicas use spare slots only.
    for (int e = 0; e < kExperts; ++e) {
      EXPECT_EQ(plan->map.replicas(l, e)[0], Input(2).base.replicas(l, e)[0]);
      for (size_t i = 1; i < plan->map.replicas(l, e).size(); ++i) {
        EXPECT_GE(plan->map.replicas(l, e)[i].slot, 2);
        EXPECT_LT(plan->map.replicas(l, e)[i].slot, 4);
      }
    }
  }
}

TEST(Balancer, TheByteBoundLimitsTheReplicas) {
  absl::StatusOr<BalancerPlan> plan = PlanRebalance(Input(2, /*max_bytes=*/2500));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->replicas_added, 2);
  EXPECT_LE(plan->bytes_moved, 2500u);
  EXPECT_LT(plan->imbalance_after, plan->imbalance_before);
}

TEST(Balancer, NoSpareSlotsMeansNoChange) {
  absl::StatusOr<BalancerPlan> plan = PlanRebalance(Input(0));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->changed);
  EXPECT_EQ(plan->bytes_moved, 0u);
  EXPECT_EQ(plan->map.version(), 1u);
}

TEST(Balancer, PlanningAgainFromThePlanKeepsItAndMovesNothing) {
  BalancerInput in = Input(2);
  absl::StatusOr<BalancerPlan> first = PlanRebalance(in);
  ASSERT_TRUE(first.ok());
  in.current = first->map;
  absl::StatusOr<BalancerPlan> again = PlanRebalance(in);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->changed);
  EXPECT_EQ(again->bytes_moved, 0u);
}

TEST(Balancer, NewReplicasAvoidSlotsTheCurrentMapFills) {
  // Expert 5's replica sits in rank 0's spare slot 2 now; the new plan drops
  // it, and rank 0's new replicas go elsewhere than slot 2 (a GPU rank loads
  // them while slot 2 still serves expert 5).
  BalancerInput in = Input(2);
  auto locations = in.base.locations();
  for (auto& layer : locations) layer[5].push_back({0, 2});
  in.current = *ExpertMap::Create(1, kWorld, locations);
  absl::StatusOr<BalancerPlan> plan = PlanRebalance(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (int l = 0; l < kLayers; ++l) {
    for (int e = 0; e < kExperts; ++e) {
      for (const ExpertLocation& at : plan->map.replicas(l, e)) {
        if (at.rank == 0 && at.slot == 2) {
          EXPECT_EQ(e, 5) << "layer " << l;
        }
      }
    }
  }
}

TEST(Balancer, EvenLoadNeedsNoReplicas) {
  BalancerInput in = Input(2);
  for (auto& layer : in.load) std::fill(layer.begin(), layer.end(), 100.0);
  absl::StatusOr<BalancerPlan> plan = PlanRebalance(in);
  ASSERT_TRUE(plan.ok());
  EXPECT_FALSE(plan->changed);
  EXPECT_NEAR(plan->imbalance_before, 1.0, 1e-9);
}

TEST(Balancer, RefusesInputsOfTheWrongShape) {
  BalancerInput in = Input(2);
  in.load.pop_back();
  EXPECT_FALSE(PlanRebalance(in).ok());
  in = Input(2);
  in.slots_per_rank.pop_back();
  EXPECT_FALSE(PlanRebalance(in).ok());
}

cluster::ExpertLoad Report(uint64_t version, uint64_t tokens_of_expert0) {
  cluster::ExpertLoad load;
  load.set_num_layers(kLayers);
  load.set_num_experts(kExperts);
  load.set_map_version(version);
  for (int i = 0; i < kLayers * kExperts; ++i)
    load.add_tokens(i % kExperts == 0 ? tokens_of_expert0 : 0);
  return load;
}

TEST(ExpertLoadWindow, SumsTheWindowOfOneMapVersion) {
  ExpertLoadWindow window(absl::Minutes(1));
  window.Reset(kWorld, kLayers, kExperts);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  window.Add(0, t0, Report(1, 10));
  window.Add(1, t0 + absl::Seconds(5), Report(1, 15));
  window.Add(1, t0 + absl::Milliseconds(5500), Report(1, 5));  // merged into the one before
  window.Add(0, t0 + absl::Seconds(6), Report(2, 40));
  window.Add(9, t0 + absl::Seconds(6), Report(1, 1000));  // no such rank: ignored
  ExpertLoadCounts all = window.Sum(t0 + absl::Seconds(7), absl::Seconds(10), 1);
  EXPECT_EQ(all.samples, 2);
  EXPECT_EQ(all.ExpertTotals(0)[0], 30u);
  EXPECT_EQ(all.RankTotals(1)[1], 20u);
  ExpertLoadCounts recent = window.Sum(t0 + absl::Seconds(7), absl::Seconds(3), 1);
  EXPECT_EQ(recent.ExpertTotals(0)[0], 20u);
  ExpertLoadCounts v2 = window.Sum(t0 + absl::Seconds(7), absl::Seconds(10), 2);
  EXPECT_EQ(v2.total(), 40u * kLayers);
  EXPECT_NEAR(Imbalance({2, 1, 1, 0}), 2.0, 1e-12);
  EXPECT_EQ(Imbalance({0, 0}), 0.0);
}

}  // namespace
}  // namespace flotilla::coordinator
