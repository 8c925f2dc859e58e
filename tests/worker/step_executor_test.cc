#include "worker/step_executor.h"

#include <gtest/gtest.h>

#include <array>
#include <thread>

#include "comm/local/local_communicator.h"
#include "tests/worker/fake_engine.h"

namespace flotilla::worker {
namespace {

cluster::StepPlan FirstChunk(uint64_t request_id, std::vector<int32_t> tokens,
                             std::vector<int32_t> cached = {}) {
  cluster::StepPlan plan;
  cluster::PlanItem* item = plan.add_items();
  item->set_request_id(request_id);
  item->set_first(true);
  for (int32_t t : cached) item->add_cached_prefix(t);
  for (int32_t t : tokens) item->add_tokens(t);
  item->set_logits(cluster::PLAN_LOGITS_LAST);
  return plan;
}

std::unique_ptr<Sampler> Greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  return *Sampler::Create(p, ModelConfig::Tiny().vocab_size);
}

ExpertMap Map(uint64_t version, int world) {
  const ModelConfig c = ModelConfig::Tiny();
  return *ExpertMap::Contiguous(c.num_hidden_layers, c.num_local_experts, world, version);
}

TEST(StepExecutorTest, OneRankRunsItsPlanAndFrees) {
  FakeEngine engine;
  const ParallelConfig parallel = *ParallelConfig::Create(1, 1, ModelConfig::Tiny());
  StepExecutor executor(&engine, nullptr, nullptr, parallel, 0, 1);
  EXPECT_TRUE(executor.leader());
  std::unique_ptr<Sampler> sampler = Greedy();
  auto lookup = [&](const cluster::PlanItem&) { return sampler.get(); };

  absl::StatusOr<StepExecutor::Exchanged> got = executor.Exchange(FirstChunk(7, {1, 2, 3}, {4, 5}));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->any_work);
  absl::StatusOr<std::optional<StepOutput>> out = executor.Run(got->plan, lookup);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE(out->has_value());
  ASSERT_EQ(engine.steps.size(), 1u);
  EXPECT_EQ(engine.steps[0][0].tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(engine.steps[0][0].sampler, sampler.get());
  EXPECT_EQ(engine.steps[0][0].logits, LogitsMode::kNone);  // the token is drawn on the device
  EXPECT_EQ(engine.sequences.begin()->second, (std::vector<int32_t>{4, 5, 1, 2, 3}));
  EXPECT_EQ(executor.steps(), 1u);

  // An idle instance does nothing; a plan with only frees frees and does not step.
  got = executor.Exchange(cluster::StepPlan());
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->any_work);
  cluster::StepPlan free;
  free.add_free(7);
  got = executor.Exchange(free);
  ASSERT_TRUE(got.ok());
  out = executor.Run(got->plan, lookup);
  ASSERT_TRUE(out.ok());
  EXPECT_FALSE(out->has_value());
  EXPECT_EQ(engine.freed.size(), 1u);
  EXPECT_EQ(executor.steps(), 1u);
}

TEST(StepExecutorTest, APlanItCannotRunIsRefusedWholeWithTheRequestNamed) {
  FakeEngine engine;
  const ParallelConfig parallel = *ParallelConfig::Create(1, 1, ModelConfig::Tiny());
  StepExecutor executor(&engine, nullptr, nullptr, parallel, 0, 1);
  std::unique_ptr<Sampler> sampler = Greedy();
  auto lookup = [&](const cluster::PlanItem&) { return sampler.get(); };

  // A logits mode from a newer leader: the enum value arrives as a number.
  cluster::StepPlan newer = FirstChunk(7, {1, 2, 3});
  newer.mutable_items(0)->set_logits(static_cast<cluster::PlanLogits>(7));
  cluster::StepPlan parsed;
  ASSERT_TRUE(parsed.ParseFromString(newer.SerializeAsString()));
  absl::StatusOr<std::optional<StepOutput>> out = executor.Run(parsed, lookup);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << out.status();
  EXPECT_NE(out.status().message().find("request 7 for logits 7"), std::string::npos);
  EXPECT_NE(out.status().message().find("PLAN_LOGITS_ALL"), std::string::npos);
  EXPECT_TRUE(engine.steps.empty());
  EXPECT_TRUE(engine.sequences.empty());

  // A sequence this rank never started (or frees in the same plan): a
  // status, not an exception, and nothing runs.
  cluster::StepPlan unknown;
  cluster::PlanItem* item = unknown.add_items();
  item->set_request_id(9);
  item->add_tokens(1);
  item->set_logits(cluster::PLAN_LOGITS_LAST);
  out = executor.Run(unknown, lookup);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition) << out.status();
  EXPECT_NE(out.status().message().find("request 9"), std::string::npos);
  ASSERT_TRUE(executor.Run(FirstChunk(9, {1, 2}), lookup).ok());
  unknown.add_free(9);
  out = executor.Run(unknown, lookup);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition) << out.status();
  EXPECT_EQ(engine.sequences.size(), 1u);  // the refused plan freed nothing
  EXPECT_EQ(engine.steps.size(), 1u);
}

TEST(StepExecutorTest, OneRankSwitchesToANewerExpertMapAtTheNextBoundary) {
  FakeEngine engine;
  const ParallelConfig parallel = *ParallelConfig::Create(1, 1, ModelConfig::Tiny());
  StepExecutor executor(&engine, nullptr, nullptr, parallel, 0, 3);
  executor.OfferExpertMap(Map(2, 1));  // older: ignored
  ASSERT_TRUE(executor.Exchange(cluster::StepPlan()).ok());
  EXPECT_EQ(executor.map_version(), 3u);
  executor.OfferExpertMap(Map(5, 1));
  EXPECT_EQ(executor.map_version(), 3u);
  ASSERT_TRUE(executor.Exchange(cluster::StepPlan()).ok());
  EXPECT_EQ(executor.map_version(), 5u);
}

// Two ranks in threads over a local communicator, each with a fake engine.
class TwoRanks {
 public:
  explicit TwoRanks(int tp_size) {
    auto rendezvous = *comm::LocalRendezvous::Create(2);
    const ParallelConfig parallel = *ParallelConfig::Create(2, tp_size, ModelConfig::Tiny());
    for (int r = 0; r < 2; ++r) {
      comms[r] = *comm::LocalCommunicator::Create(rendezvous, r);
      executors[r] =
          std::make_unique<StepExecutor>(&engines[r], comms[r].get(), nullptr, parallel, r, 1);
    }
  }
  // Both ranks exchange their plans (and run them when there is work),
  // offering measurements `measure[r]`.
  void Step(const cluster::StepPlan& plan0, const cluster::StepPlan& plan1,
            std::array<uint64_t, 2> measure = {0, 0}) {
    const cluster::StepPlan* plans[2] = {&plan0, &plan1};
    std::thread threads[2];
    for (int r = 0; r < 2; ++r) {
      threads[r] = std::thread([&, r] {
        absl::StatusOr<StepExecutor::Exchanged> got =
            executors[r]->Exchange(*plans[r], measure[r]);
        ASSERT_TRUE(got.ok()) << got.status();
        exchanged[r] = *got;
        if (!got->any_work) return;
        auto lookup = [&](const cluster::PlanItem&) { return sampler.get(); };
        absl::StatusOr<std::optional<StepOutput>> out = executors[r]->Run(got->plan, lookup);
        ASSERT_TRUE(out.ok()) << out.status();
      });
    }
    for (std::thread& t : threads) t.join();
  }

  FakeEngine engines[2];
  std::unique_ptr<comm::LocalCommunicator> comms[2];
  std::unique_ptr<StepExecutor> executors[2];
  StepExecutor::Exchanged exchanged[2];
  std::unique_ptr<Sampler> sampler = Greedy();
};

TEST(StepExecutorTest, TensorParallelPeerRunsItsLeadersPlanWithoutSampling) {
  TwoRanks ranks(/*tp_size=*/2);
  EXPECT_TRUE(ranks.executors[0]->leader());
  EXPECT_FALSE(ranks.executors[1]->leader());
  ranks.Step(FirstChunk(9, {3, 4, 5, 6}), cluster::StepPlan());
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(r);
    EXPECT_TRUE(ranks.exchanged[r].any_work);
    ASSERT_EQ(ranks.engines[r].steps.size(), 1u);
    ASSERT_EQ(ranks.engines[r].steps[0].size(), 1u);
    EXPECT_EQ(ranks.engines[r].steps[0][0].tokens, (std::vector<int32_t>{3, 4, 5, 6}));
    EXPECT_EQ(ranks.engines[r].instance_step_tokens, (std::vector<int64_t>{4}));
  }
  EXPECT_EQ(ranks.engines[0].steps[0][0].sampler, ranks.sampler.get());
  EXPECT_EQ(ranks.engines[1].steps[0][0].sampler, nullptr);
}

cluster::StepPlan Decodes(int items, cluster::PlanLogits logits = cluster::PLAN_LOGITS_LAST) {
  cluster::StepPlan plan;
  for (int i = 0; i < items; ++i) {
    cluster::PlanItem* item = plan.add_items();
    item->set_request_id(100 + i);
    item->set_first(true);
    item->add_tokens(5 + i);
    item->set_logits(logits);
  }
  return plan;
}

TEST(StepExecutorTest, GroupLogitsFitLastPositionStepsOfAFewItems) {
  EXPECT_TRUE(GroupLogitsFit(Decodes(1)));
  EXPECT_TRUE(GroupLogitsFit(Decodes(kMaxGroupLogitRows)));
  EXPECT_FALSE(GroupLogitsFit(Decodes(kMaxGroupLogitRows + 1)));
  EXPECT_FALSE(GroupLogitsFit(cluster::StepPlan()));
  EXPECT_FALSE(GroupLogitsFit(Decodes(2, cluster::PLAN_LOGITS_ALL)));
  EXPECT_FALSE(GroupLogitsFit(Decodes(2, cluster::PLAN_LOGITS_NONE)));
  cluster::StepPlan mixed = Decodes(2);
  mixed.mutable_items(1)->set_logits(cluster::PLAN_LOGITS_NONE);  // a prompt's middle chunk
  EXPECT_FALSE(GroupLogitsFit(mixed));
  cluster::StepPlan drafted = Decodes(1);
  drafted.mutable_items(0)->add_tokens(9);
  drafted.mutable_items(0)->set_draft_tokens(1);
  EXPECT_FALSE(GroupLogitsFit(drafted));
}

TEST(StepExecutorTest, TensorParallelRanksMarkTheSameItemsForGroupLogits) {
  TwoRanks ranks(/*tp_size=*/2);
  for (FakeEngine& e : ranks.engines) e.splits_group_logits = true;
  ranks.Step(Decodes(2), cluster::StepPlan());
  cluster::StepPlan prompt = Decodes(1);
  prompt.mutable_items(0)->set_request_id(200);
  prompt.mutable_items(0)->set_logits(cluster::PLAN_LOGITS_ALL);  // prompt logits: not split
  ranks.Step(prompt, cluster::StepPlan());
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(r);
    ASSERT_EQ(ranks.engines[r].steps.size(), 2u);
    ASSERT_EQ(ranks.engines[r].steps[0].size(), 2u);
    for (const StepItem& it : ranks.engines[r].steps[0]) EXPECT_TRUE(it.group_logits);
    EXPECT_FALSE(ranks.engines[r].steps[1][0].group_logits);
  }
  // Only the leader samples; the peer takes part without a sampler.
  EXPECT_NE(ranks.engines[0].steps[0][0].sampler, nullptr);
  EXPECT_EQ(ranks.engines[1].steps[0][0].sampler, nullptr);
}

TEST(StepExecutorTest, GroupLogitsNeedEveryRanksEngineAndOffer) {
  TwoRanks ranks(/*tp_size=*/2);  // fake engines that do not split
  ranks.Step(Decodes(1), cluster::StepPlan());
  for (int r = 0; r < 2; ++r) EXPECT_FALSE(ranks.engines[r].steps[0][0].group_logits);
  ranks.engines[0].splits_group_logits = true;  // one of the two: still not
  ranks.Step(Decodes(1), cluster::StepPlan());
  for (int r = 0; r < 2; ++r) EXPECT_FALSE(ranks.engines[r].steps[1][0].group_logits);
  ranks.engines[1].splits_group_logits = true;
  ranks.executors[1]->SetGroupLogits(false);  // --group-logits off on one rank
  ranks.Step(Decodes(1), cluster::StepPlan());
  for (int r = 0; r < 2; ++r) EXPECT_FALSE(ranks.engines[r].steps[2][0].group_logits);
  ranks.executors[1]->SetGroupLogits(true);
  ranks.Step(Decodes(1), cluster::StepPlan());
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(ranks.engines[r].steps[3][0].group_logits);
}

TEST(StepExecutorTest, IdleGroupsRunEmptyStepsBesideBusyOnes) {
  TwoRanks ranks(/*tp_size=*/1);  // two DP groups, each its own leader
  ranks.Step(cluster::StepPlan(), cluster::StepPlan());
  EXPECT_FALSE(ranks.exchanged[0].any_work);
  EXPECT_FALSE(ranks.exchanged[1].any_work);
  EXPECT_TRUE(ranks.engines[0].steps.empty());

  ranks.Step(cluster::StepPlan(), FirstChunk(4, {7, 8}));
  ASSERT_EQ(ranks.engines[0].steps.size(), 1u);
  EXPECT_TRUE(ranks.engines[0].steps[0].empty());  // lockstep: an empty step
  ASSERT_EQ(ranks.engines[1].steps.size(), 1u);
  EXPECT_EQ(ranks.engines[1].steps[0].size(), 1u);
  EXPECT_EQ(ranks.engines[0].instance_step_tokens.back(), 2);
  EXPECT_EQ(ranks.engines[1].instance_step_tokens.back(), 2);
}

TEST(StepExecutorTest, ExpertMapSwitchesWhenEveryRankHasIt) {
  TwoRanks ranks(/*tp_size=*/2);
  ranks.executors[0]->OfferExpertMap(Map(2, 2));
  ranks.Step(cluster::StepPlan(), cluster::StepPlan());
  EXPECT_EQ(ranks.executors[0]->map_version(), 1u);
  EXPECT_EQ(ranks.executors[1]->map_version(), 1u);
  ranks.executors[1]->OfferExpertMap(Map(2, 2));
  ranks.Step(cluster::StepPlan(), cluster::StepPlan());
  EXPECT_EQ(ranks.executors[0]->map_version(), 2u);
  EXPECT_EQ(ranks.executors[1]->map_version(), 2u);
}

TEST(StepExecutorTest, AMeasurementStartsWhenEveryRankOffersIt) {
  TwoRanks ranks(/*tp_size=*/2);
  ranks.Step(cluster::StepPlan(), cluster::StepPlan(), {7, 0});  // rank 1 has not got it yet
  EXPECT_EQ(ranks.exchanged[0].measure_id, 0u);
  EXPECT_EQ(ranks.exchanged[1].measure_id, 0u);
  ranks.Step(FirstChunk(3, {1, 2}), cluster::StepPlan(), {7, 7});
  EXPECT_EQ(ranks.exchanged[0].measure_id, 7u);
  EXPECT_EQ(ranks.exchanged[1].measure_id, 7u);
  EXPECT_TRUE(ranks.exchanged[1].any_work);  // the step still runs its plan
  ASSERT_EQ(ranks.engines[1].steps.size(), 1u);
}

TEST(StepExecutorTest, ProbeStepsAgreeOnTheLargestTokensAndTheSmallestValue) {
  TwoRanks ranks(/*tp_size=*/1);
  std::thread threads[2];
  absl::StatusOr<uint64_t> least[2];
  for (int r = 0; r < 2; ++r) {
    threads[r] = std::thread([&, r] {
      ASSERT_TRUE(ranks.executors[r]->AgreeStepTokens(r == 0 ? 5 : 9).ok());
      least[r] = ranks.executors[r]->AgreeMin(r == 0 ? 40 : 12);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks.engines[r].instance_step_tokens, (std::vector<int64_t>{9}));
    ASSERT_TRUE(least[r].ok());
    EXPECT_EQ(*least[r], 12u);
  }
}

}  // namespace
}  // namespace flotilla::worker
