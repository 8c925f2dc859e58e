#include "worker/scheduler.h"

#include <gtest/gtest.h>

#include <functional>

#include "tests/worker/fake_engine.h"
#include "worker/engine/stop_rules.h"

namespace flotilla::worker {
namespace {

constexpr int32_t kEos = 1000;  // ModelConfig::Tiny()'s

cluster::SubmitSequence Submission(uint64_t id, std::vector<int32_t> prompt,
                                   uint32_t max_tokens = 0) {
  cluster::SubmitSequence s;
  s.set_request_id(id);
  for (int32_t t : prompt) s.add_prompt_ids(t);
  s.mutable_sampling()->set_max_tokens(max_tokens);
  s.mutable_sampling()->set_temperature(0.0f);
  return s;
}

// Submit, returning its prompt's logits within `credit_bytes` (0: no limit).
cluster::SubmitSequence SubmitWithLogits(uint64_t id, std::vector<int32_t> prompt,
                                         uint32_t max_tokens, uint64_t credit_bytes = 0) {
  cluster::SubmitSequence s = Submission(id, std::move(prompt), max_tokens);
  s.set_return_prompt_logits(true);
  if (credit_bytes > 0) s.set_prompt_logits_credit_bytes(credit_bytes);
  return s;
}

std::vector<int32_t> Prompt(int n, int32_t first = 10) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(first + i);
  return p;
}

class SchedulerTest : public ::testing::Test {
 protected:
  Scheduler Make(SchedulerLimits limits) {
    return Scheduler(&engine_, limits, [this] { return now_ms_; });
  }
  static SchedulerLimits Limits(int64_t batch_tokens, int64_t sequences, int64_t max_len = 0) {
    SchedulerLimits l;
    l.max_batch_tokens = batch_tokens;
    l.max_sequences = sequences;
    l.max_model_len = max_len;
    return l;
  }
  // A step of `plan` in which every item that draws a token draws `token`.
  static StepOutput Drawn(Scheduler& s, const cluster::StepPlan& plan, int32_t token) {
    StepOutput out;
    for (const cluster::PlanItem& item : plan.items()) {
      out.logits.emplace_back();
      TokenLogprob lp;
      lp.token = s.SamplerFor(item) != nullptr ? token : -1;
      out.sampled.push_back(lp);
    }
    return out;
  }
  // Plans and completes one step drawing `token`; returns the updates.
  static cluster::TokenBatch Step(Scheduler& s, int32_t token,
                                  cluster::StepPlan* plan_out = nullptr) {
    cluster::TokenBatch refused, out;
    cluster::StepPlan plan = s.Plan(&refused);
    EXPECT_EQ(refused.updates_size(), 0);
    s.Complete(plan, Drawn(s, plan, token), &out);
    if (plan_out) *plan_out = plan;
    return out;
  }

  FakeEngine engine_{ModelConfig::Tiny(), /*total_blocks=*/64, /*block_size=*/4,
                     /*max_length=*/256};
  uint64_t now_ms_ = 1000;
};

TEST(StopRulesTest, StopTokenBeforeLength) {
  StopRules rules({7, 9}, 3);
  EXPECT_EQ(rules.Check(9, 0), StopDecision::kStop);
  EXPECT_EQ(rules.Check(5, 0), StopDecision::kContinue);
  EXPECT_EQ(rules.Check(5, 1), StopDecision::kContinue);
  EXPECT_EQ(rules.Check(5, 2), StopDecision::kLength);
  EXPECT_EQ(rules.Check(7, 2), StopDecision::kStop);
}

TEST_F(SchedulerTest, FullQueueRefusesWithResourceExhausted) {
  Scheduler s = Make(Limits(16, 1));
  cluster::TokenBatch refused;
  for (uint64_t id = 1; id <= 4; ++id) s.Enqueue(Submission(id, Prompt(3)), &refused);
  EXPECT_EQ(refused.updates_size(), 0);
  EXPECT_EQ(s.queued(), 4u);
  s.Enqueue(Submission(5, Prompt(3)), &refused);
  ASSERT_EQ(refused.updates_size(), 1);
  EXPECT_EQ(refused.updates(0).request_id(), 5u);
  EXPECT_EQ(refused.updates(0).finish_reason(), common::ERROR);
  EXPECT_EQ(refused.updates(0).error_code(),
            static_cast<int>(absl::StatusCode::kResourceExhausted));
}

TEST_F(SchedulerTest, AdmissionRefusesBadRequests) {
  Scheduler s = Make(Limits(64, 8, /*max_len=*/32));
  cluster::TokenBatch refused;
  s.Enqueue(Submission(1, {}), &refused);
  s.Enqueue(Submission(2, {5, 1024}), &refused);   // outside the vocabulary
  s.Enqueue(Submission(3, Prompt(32)), &refused);  // no room left in the context
  cluster::SubmitSequence late = Submission(4, Prompt(3));
  late.set_deadline_unix_ms(now_ms_ - 1);
  s.Enqueue(late, &refused);
  cluster::SubmitSequence bad_sampling = Submission(5, Prompt(3));
  bad_sampling.mutable_sampling()->set_top_p(2.0f);
  s.Enqueue(bad_sampling, &refused);
  ASSERT_EQ(refused.updates_size(), 0);
  cluster::StepPlan plan = s.Plan(&refused);
  EXPECT_EQ(plan.items_size(), 0);
  std::map<uint64_t, int> codes;
  for (const cluster::SequenceUpdate& u : refused.updates()) {
    EXPECT_EQ(u.finish_reason(), common::ERROR);
    codes[u.request_id()] = u.error_code();
  }
  const int invalid = static_cast<int>(absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(codes[1], invalid);
  EXPECT_EQ(codes[2], invalid);
  EXPECT_EQ(codes[3], invalid);
  EXPECT_EQ(codes[4], static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(codes[5], invalid);
  EXPECT_EQ(s.running(), 0u);
  EXPECT_EQ(s.queued(), 0u);
  EXPECT_EQ(s.kv_reserved(), 0);
}

TEST_F(SchedulerTest, RefusesARequestNeedingMoreBlocksThanTheEngineHas) {
  engine_ = FakeEngine(ModelConfig::Tiny(), /*total_blocks=*/8, /*block_size=*/4);
  Scheduler s = Make(Limits(64, 8));
  cluster::TokenBatch refused;
  s.Enqueue(Submission(1, Prompt(8), /*max_tokens=*/32), &refused);  // 40 tokens: 10 blocks
  s.Plan(&refused);
  ASSERT_EQ(refused.updates_size(), 1);
  EXPECT_EQ(refused.updates(0).error_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(refused.updates(0).error().find("KV blocks"), std::string::npos);
}

TEST_F(SchedulerTest, ChunksThePromptWithinTheTokenBudget) {
  Scheduler s = Make(Limits(4, 8));
  cluster::TokenBatch refused;
  s.Enqueue(Submission(1, Prompt(10), 5), &refused);
  std::vector<int> sizes;
  std::vector<cluster::PlanLogits> logits;
  for (int i = 0; i < 3; ++i) {
    cluster::StepPlan plan;
    cluster::TokenBatch out = Step(s, 50, &plan);
    ASSERT_EQ(plan.items_size(), 1);
    EXPECT_EQ(plan.items(0).first(), i == 0);
    sizes.push_back(plan.items(0).tokens_size());
    logits.push_back(plan.items(0).logits());
    // Only the chunk that ends the prompt draws a token.
    EXPECT_EQ(out.updates_size(), i == 2 ? 1 : 0);
  }
  EXPECT_EQ(sizes, (std::vector<int>{4, 4, 2}));
  EXPECT_EQ(logits,
            (std::vector<cluster::PlanLogits>{cluster::PLAN_LOGITS_NONE, cluster::PLAN_LOGITS_NONE,
                                              cluster::PLAN_LOGITS_LAST}));
}

TEST_F(SchedulerTest, DecodeTokensComeFirstThenPromptChunks) {
  Scheduler s = Make(Limits(4, 8));
  cluster::TokenBatch refused;
  s.Enqueue(Submission(1, Prompt(2), 10), &refused);
  Step(s, 50);  // prompt of request 1, which draws its first token
  s.Enqueue(Submission(2, Prompt(8), 8), &refused);
  cluster::StepPlan plan = s.Plan(&refused);
  ASSERT_EQ(plan.items_size(), 2);
  EXPECT_EQ(plan.items(0).request_id(), 1u);
  EXPECT_EQ(plan.items(0).tokens_size(), 1);
  EXPECT_EQ(plan.items(0).tokens(0), 50);
  EXPECT_EQ(plan.items(1).request_id(), 2u);
  EXPECT_EQ(plan.items(1).tokens_size(), 3);  // what the decode token left of 4
}

// --idle-prefill-tokens: a step with nothing decoding takes the larger
// budget; once a sequence decodes, prompts share the step budget again.
TEST_F(SchedulerTest, IdleStepsPrefillWithinTheIdleBudget) {
  SchedulerLimits limits = Limits(4, 8);
  limits.idle_prefill_tokens = 12;
  Scheduler s = Make(limits);
  cluster::TokenBatch refused;
  s.Enqueue(Submission(1, Prompt(20), 4), &refused);
  s.Enqueue(Submission(2, Prompt(30), 4), &refused);
  cluster::StepPlan plan;
  Step(s, 50, &plan);  // idle: 12 tokens, all of them request 1's (first come)
  ASSERT_EQ(plan.items_size(), 1);
  EXPECT_EQ(plan.items(0).request_id(), 1u);
  EXPECT_EQ(plan.items(0).tokens_size(), 12);
  Step(s, 50, &plan);  // still idle: request 1's last 8, then 4 of request 2's
  ASSERT_EQ(plan.items_size(), 2);
  EXPECT_EQ(plan.items(0).tokens_size(), 8);
  EXPECT_EQ(plan.items(0).logits(), cluster::PLAN_LOGITS_LAST);
  EXPECT_EQ(plan.items(1).tokens_size(), 4);
  Step(s, 50, &plan);  // request 1 decodes: one token, and 3 of request 2's
  ASSERT_EQ(plan.items_size(), 2);
  EXPECT_EQ(plan.items(0).request_id(), 1u);
  EXPECT_EQ(plan.items(0).tokens_size(), 1);
  EXPECT_EQ(plan.items(1).request_id(), 2u);
  EXPECT_EQ(plan.items(1).tokens_size(), 3);
}

TEST_F(SchedulerTest, IdleBudgetBelowTheStepBudgetChangesNothing) {
  SchedulerLimits limits = Limits(8, 8);
  limits.idle_prefill_tokens = 2;
  Scheduler s = Make(limits);
  cluster::TokenBatch refused;
  s.Enqueue(Submission(1, Prompt(20), 4), &refused);
  cluster::StepPlan plan;
  Step(s, 50, &plan);
  ASSERT_EQ(plan.items_size(), 1);
  EXPECT_EQ(plan.items(0).tokens_size(), 8);
}

// The steps until request `id` draws its first token, stepping `s`.
int StepsToFirstToken(Scheduler& s, uint64_t id, cluster::StepPlan* first_plan,
                      const std::function<cluster::TokenBatch(Scheduler&, cluster::StepPlan*)>& step) {
  for (int n = 1; n <= 64; ++n) {
    cluster::StepPlan plan;
    cluster::TokenBatch out = step(s, &plan);
    if (n == 1) *first_plan = plan;
    for (const cluster::SequenceUpdate& u : out.updates()) {
      if (u.request_id() == id && u.token_ids_size() > 0) return n;
    }
  }
  return -1;
}

TEST_F(SchedulerTest, ShortestPromptFirstLetsAShortPromptPassALongOne) {
  auto step = [](Scheduler& s, cluster::StepPlan* plan) { return Step(s, 50, plan); };
  for (PrefillOrder order : {PrefillOrder::kFcfs, PrefillOrder::kShortestPromptFirst}) {
    SchedulerLimits limits = Limits(8, 8);
    limits.prefill.order = order;
    Scheduler s = Make(limits);
    cluster::TokenBatch refused;
    s.Enqueue(Submission(1, Prompt(40), 4), &refused);
    now_ms_ += 1;
    s.Enqueue(Submission(2, Prompt(4, 100), 4), &refused);
    cluster::StepPlan first;
    const int steps = StepsToFirstToken(s, 2, &first, step);
    if (order == PrefillOrder::kFcfs) {
      // Behind all 40 tokens of request 1 at 8 a step: five steps, then its own.
      EXPECT_EQ(steps, 6) << PrefillOrderName(order);
      EXPECT_EQ(first.items(0).request_id(), 1u);
    } else {
      EXPECT_EQ(steps, 1) << PrefillOrderName(order);
      ASSERT_EQ(first.items_size(), 2);
      EXPECT_EQ(first.items(0).request_id(), 2u);
      EXPECT_EQ(first.items(0).tokens_size(), 4);
      EXPECT_EQ(first.items(1).request_id(), 1u);
      EXPECT_EQ(first.items(1).tokens_size(), 4);
    }
  }
}

TEST_F(SchedulerTest, AWaitBoundKeepsShortPromptsFromStarvingALongOne) {
  SchedulerLimits limits = Limits(8, 16);
  limits.prefill.order = PrefillOrder::kShortestPromptFirst;
  limits.prefill.max_prefill_wait_ms = 100;
  Scheduler s = Make(limits);
  cluster::TokenBatch refused;
  s.Enqueue(Submission(1, Prompt(16), 1), &refused);
  // A new 8-token prompt every step would take the whole budget forever.
  uint64_t next_id = 2;
  int long_tokens = 0;
  for (int i = 0; i < 12; ++i) {
    s.Enqueue(Submission(next_id++, Prompt(8, 200), 1), &refused);
    cluster::StepPlan plan;
    Step(s, 50, &plan);
    for (const cluster::PlanItem& item : plan.items()) {
      if (item.request_id() == 1) long_tokens += item.tokens_size();
    }
    now_ms_ += 20;
  }
  // Overdue from 100 ms (the sixth step): it then goes first until done.
  EXPECT_EQ(long_tokens, 16);
}

TEST_F(SchedulerTest, ALongPromptsChunkIsCappedWhileAShortOneWaits) {
  SchedulerLimits limits = Limits(16, 8);
  limits.prefill.long_prefill_token_threshold = 8;
  Scheduler s = Make(limits);
  cluster::TokenBatch refused;
  s.Enqueue(Submission(1, Prompt(40), 4), &refused);
  cluster::StepPlan plan;
  Step(s, 50, &plan);
  ASSERT_EQ(plan.items_size(), 1);
  EXPECT_EQ(plan.items(0).tokens_size(), 16);  // alone: the whole budget
  s.Enqueue(Submission(2, Prompt(6, 100), 4), &refused);
  cluster::TokenBatch out = Step(s, 50, &plan);
  ASSERT_EQ(plan.items_size(), 2);
  EXPECT_EQ(plan.items(0).request_id(), 1u);
  EXPECT_EQ(plan.items(0).tokens_size(), 10);  // 8, plus what request 2 left
  EXPECT_EQ(plan.items(1).request_id(), 2u);
  EXPECT_EQ(plan.items(1).tokens_size(), 6);
  ASSERT_EQ(out.updates_size(), 1);
  EXPECT_EQ(out.updates(0).request_id(), 2u);
}

TEST_F(SchedulerTest, StopTokenEndsWithStopAndIsNotOutput) {
  Scheduler s = Make(Limits(16, 8));
  cluster::TokenBatch refused;
  s.Enqueue(Submission(1, Prompt(3), 10), &refused);
  cluster::TokenBatch first = Step(s, 50);
  ASSERT_EQ(first.updates_size(), 1);
  EXPECT_EQ(first.updates(0).token_ids_size(), 1);
  EXPECT_EQ(first.updates(0).finish_reason(), common::FINISH_REASON_UNSPECIFIED);
  cluster::TokenBatch last = Step(s, kEos);
  ASSERT_EQ(last.updates_size(), 1);
  const cluster::SequenceUpdate& u = last.updates(0);
  EXPECT_EQ(u.finish_reason(), common::STOP);
  EXPECT_EQ(u.stop_token(), kEos);
  EXPECT_EQ(u.token_ids_size(), 0);
  EXPECT_EQ(u.completion_tokens(), 2u);
  EXPECT_EQ(u.prompt_tokens(), 3u);
  EXPECT_EQ(s.running(), 0u);
  EXPECT_EQ(s.kv_reserved(), 0);
  // The next plan frees it on every rank.
  cluster::StepPlan next = s.Plan(&refused);
  ASSERT_EQ(next.free_size(), 1);
  EXPECT_EQ(next.free(0), 1u);
}

TEST_F(SchedulerTest, IgnoreEosKeepsTheEosToken) {
  Scheduler s = Make(Limits(16, 8));
  cluster::TokenBatch refused;
  cluster::SubmitSequence sub = Submission(1, Prompt(3), 2);
  sub.mutable_sampling()->set_ignore_eos(true);
  s.Enqueue(sub, &refused);
  cluster::TokenBatch out = Step(s, kEos);
  ASSERT_EQ(out.updates_size(), 1);
  EXPECT_EQ(out.updates(0).token_ids_size(), 1);
  EXPECT_EQ(out.updates(0).finish_reason(), common::FINISH_REASON_UNSPECIFIED);
}

TEST_F(SchedulerTest, MaxTokensEndsWithLength) {
  Scheduler s = Make(Limits(16, 8));
  cluster::TokenBatch refused;
  s.Enqueue(Submission(1, Prompt(3), 3), &refused);
  std::vector<common::FinishReason> reasons;
  int tokens = 0;
  for (int i = 0; i < 3; ++i) {
    cluster::TokenBatch out = Step(s, 50 + i);
    ASSERT_EQ(out.updates_size(), 1);
    tokens += out.updates(0).token_ids_size();
    reasons.push_back(out.updates(0).finish_reason());
  }
  EXPECT_EQ(tokens, 3);
  EXPECT_EQ(reasons.back(), common::LENGTH);
  EXPECT_EQ(reasons[0], common::FINISH_REASON_UNSPECIFIED);
  EXPECT_EQ(s.running(), 0u);
}

TEST_F(SchedulerTest, TheContextLimitEndsWithLength) {
  Scheduler s = Make(Limits(16, 8, /*max_len=*/8));
  cluster::TokenBatch refused;
  s.Enqueue(Submission(1, Prompt(6)), &refused);  // max_tokens 0: what the context leaves
  EXPECT_EQ(Step(s, 50).updates(0).finish_reason(), common::FINISH_REASON_UNSPECIFIED);
  cluster::TokenBatch out = Step(s, 51);
  EXPECT_EQ(out.updates(0).finish_reason(), common::LENGTH);
  EXPECT_EQ(out.updates(0).completion_tokens(), 2u);
}

TEST_F(SchedulerTest, DeadlineWhileRunningEndsWithDeadlineExceeded) {
  Scheduler s = Make(Limits(16, 8));
  cluster::TokenBatch refused;
  cluster::SubmitSequence sub = Submission(1, Prompt(3), 10);
  sub.set_deadline_unix_ms(now_ms_ + 5);
  s.Enqueue(sub, &refused);
  Step(s, 50);
  now_ms_ += 10;
  cluster::TokenBatch out = Step(s, 51);
  ASSERT_EQ(out.updates_size(), 1);
  EXPECT_EQ(out.updates(0).finish_reason(), common::ERROR);
  EXPECT_EQ(out.updates(0).error_code(), static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(s.running(), 0u);
}

TEST_F(SchedulerTest, QueuesWhileKvIsReservedAndAdmitsWhenItFrees) {
  // 16 tokens = 4 blocks each; 10 blocks hold two such requests.
  engine_ = FakeEngine(ModelConfig::Tiny(), /*total_blocks=*/10, /*block_size=*/4);
  Scheduler s = Make(Limits(64, 8));
  cluster::TokenBatch refused;
  for (uint64_t id = 1; id <= 3; ++id) s.Enqueue(Submission(id, Prompt(4), 12), &refused);
  cluster::StepPlan plan;
  Step(s, 50, &plan);
  EXPECT_EQ(plan.items_size(), 2);
  EXPECT_EQ(s.running(), 2u);
  EXPECT_EQ(s.queued(), 1u);
  EXPECT_EQ(s.kv_reserved(), 8);
  s.Cancel(1);
  EXPECT_EQ(s.kv_reserved(), 4);
  plan = s.Plan(&refused);
  ASSERT_EQ(plan.free_size(), 1);
  EXPECT_EQ(plan.free(0), 1u);
  EXPECT_EQ(s.running(), 2u);
  EXPECT_EQ(s.queued(), 0u);
}

TEST_F(SchedulerTest, AdmissionFitsEveryKvPoolOnItsOwn) {
  // The first pool holds all three requests (4 blocks each of 100); the
  // second, 2 blocks per sequence of 5, only two: the third waits although
  // the pools' sum would hold it.
  engine_ = FakeEngine(ModelConfig::Tiny(), /*total_blocks=*/100, /*block_size=*/4);
  engine_.window_pool_blocks = 5;
  Scheduler s = Make(Limits(64, 8));
  cluster::TokenBatch refused;
  for (uint64_t id = 1; id <= 3; ++id) s.Enqueue(Submission(id, Prompt(4), 12), &refused);
  cluster::StepPlan plan;
  Step(s, 50, &plan);
  EXPECT_EQ(s.running(), 2u);
  EXPECT_EQ(s.queued(), 1u);
  EXPECT_EQ(s.kv_reserved(), 2 * (4 + 2));
  s.Cancel(1);
  plan = s.Plan(&refused);
  EXPECT_EQ(s.running(), 2u);
  EXPECT_EQ(s.queued(), 0u);
  EXPECT_EQ(refused.updates_size(), 0);
}

TEST_F(SchedulerTest, ARequestLargerThanOneKvPoolIsRefused) {
  engine_ = FakeEngine(ModelConfig::Tiny(), /*total_blocks=*/100, /*block_size=*/4);
  engine_.window_pool_blocks = 1;  // every sequence needs 2 blocks there
  Scheduler s = Make(Limits(64, 8));
  cluster::TokenBatch refused;
  s.Enqueue(Submission(1, Prompt(4), 12), &refused);
  s.Plan(&refused);
  ASSERT_EQ(refused.updates_size(), 1);
  EXPECT_EQ(refused.updates(0).error_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(refused.updates(0).error().find("per pool"), std::string::npos)
      << refused.updates(0).error();
  EXPECT_EQ(s.running(), 0u);
}

TEST_F(SchedulerTest, StartsAfterTheCachedPrefixUnlessPromptLogitsAreWanted) {
  engine_.cached_prefix = 4;
  Scheduler s = Make(Limits(64, 8));
  cluster::TokenBatch refused;
  cluster::SubmitSequence first = Submission(1, Prompt(6), 4);
  first.set_cache_domain(77);
  s.Enqueue(first, &refused);
  cluster::SubmitSequence logits = SubmitWithLogits(2, Prompt(6), 4);
  s.Enqueue(logits, &refused);
  cluster::StepPlan plan = s.Plan(&refused);
  ASSERT_EQ(plan.items_size(), 2);
  // The lookup and every rank's new sequence are in the request's cache domain.
  EXPECT_EQ(engine_.prefix_queries, std::vector<uint64_t>{77});
  EXPECT_EQ(plan.items(0).cache_domain(), 77u);
  EXPECT_EQ(plan.items(1).cache_domain(), 0u);
  EXPECT_EQ(plan.items(0).cached_prefix_size(), 4);
  EXPECT_EQ(plan.items(0).tokens_size(), 2);
  EXPECT_EQ(plan.items(0).tokens(0), 14);
  EXPECT_EQ(plan.items(1).cached_prefix_size(), 0);
  EXPECT_EQ(plan.items(1).tokens_size(), 6);
  EXPECT_EQ(plan.items(1).logits(), cluster::PLAN_LOGITS_ALL);
  EXPECT_EQ(s.prefix_queries_tokens(), 12u);
  EXPECT_EQ(s.prefix_hits_tokens(), 4u);
}

// Prompt logits under credit: a sequence plans no more rows than its credit
// allows (whole rows, the last passing it by less than one), pauses while it
// has none and goes on from where it stopped when the credit grows; others
// run meanwhile.
TEST_F(SchedulerTest, PromptLogitsPauseAtTheirCreditAndGoOnWhenItGrows) {
  const uint64_t row = static_cast<uint64_t>(ModelConfig::Tiny().vocab_size) * sizeof(float);
  Scheduler s = Make(Limits(64, 8));
  cluster::TokenBatch refused;
  cluster::SubmitSequence logits = SubmitWithLogits(1, Prompt(8), 2, 2 * row + 1);
  s.Enqueue(logits, &refused);
  cluster::StepPlan plan;
  Step(s, 5, &plan);
  ASSERT_EQ(plan.items_size(), 1);
  EXPECT_EQ(plan.items(0).tokens_size(), 3);  // 2 rows and a part of a third: 3 rows
  EXPECT_EQ(plan.items(0).tokens(0), 10);
  EXPECT_EQ(plan.items(0).logits(), cluster::PLAN_LOGITS_ALL);

  // Paused: nothing planned for it, and a request without prompt logits runs.
  s.Enqueue(Submission(2, Prompt(4), 2), &refused);
  Step(s, 5, &plan);
  ASSERT_EQ(plan.items_size(), 1);
  EXPECT_EQ(plan.items(0).request_id(), 2u);
  s.GrantPromptLogits(1, 2 * row);     // lower than before: changes nothing
  s.GrantPromptLogits(99, 100 * row);  // unknown: ignored
  Step(s, 5, &plan);
  for (const cluster::PlanItem& item : plan.items()) EXPECT_NE(item.request_id(), 1u);

  // Credit for two more rows: the next two prompt tokens.
  s.GrantPromptLogits(1, 5 * row);
  Step(s, 5, &plan);
  const cluster::PlanItem* mine = nullptr;
  for (const cluster::PlanItem& item : plan.items()) {
    if (item.request_id() == 1) mine = &item;
  }
  ASSERT_NE(mine, nullptr);
  ASSERT_EQ(mine->tokens_size(), 2);
  EXPECT_EQ(mine->tokens(0), 13);
  EXPECT_EQ(mine->tokens(1), 14);

  // The rest of the prompt once the credit covers it; then it decodes.
  s.GrantPromptLogits(1, 100 * row);
  cluster::TokenBatch out = Step(s, 5, &plan);
  bool drew = false;
  for (const cluster::SequenceUpdate& u : out.updates()) {
    if (u.request_id() == 1 && u.token_ids_size() == 1) drew = true;
  }
  EXPECT_TRUE(drew) << "the chunk that ends the prompt draws the first token";
}

// A credit that comes while the request still waits in the queue is its
// window when it starts; without a window (0) nothing limits it.
TEST_F(SchedulerTest, CreditForAQueuedRequestCountsAndNoWindowMeansNoLimit) {
  const uint64_t row = static_cast<uint64_t>(ModelConfig::Tiny().vocab_size) * sizeof(float);
  Scheduler s = Make(Limits(64, 8));
  cluster::TokenBatch refused;
  cluster::SubmitSequence small = SubmitWithLogits(1, Prompt(8), 2, row);
  s.Enqueue(small, &refused);
  s.GrantPromptLogits(1, 4 * row);
  cluster::SubmitSequence unlimited = SubmitWithLogits(2, Prompt(8), 2);
  s.Enqueue(unlimited, &refused);
  cluster::StepPlan plan;
  Step(s, 5, &plan);
  ASSERT_EQ(plan.items_size(), 2);
  EXPECT_EQ(plan.items(0).tokens_size(), 4);
  EXPECT_EQ(plan.items(1).tokens_size(), 8);
}

TEST_F(SchedulerTest, FailAllEndsRunningAndQueuedRequests) {
  Scheduler s = Make(Limits(64, 1));
  cluster::TokenBatch refused, failed;
  s.Enqueue(Submission(1, Prompt(3)), &refused);
  s.Enqueue(Submission(2, Prompt(3)), &refused);
  s.Plan(&refused);
  s.FailAll(absl::UnavailableError("gone"), &failed);
  ASSERT_EQ(failed.updates_size(), 2);
  for (const cluster::SequenceUpdate& u : failed.updates()) {
    EXPECT_EQ(u.error_code(), static_cast<int>(absl::StatusCode::kUnavailable));
    EXPECT_EQ(u.error(), "gone");
  }
}

// The last update of a finished sequence carries the leader's timings for
// the coordinator's queue, prefill and decode histograms.
TEST_F(SchedulerTest, TheLastUpdateCarriesQueuePrefillAndDecodeTimes) {
  Scheduler s = Make(Limits(16, 1));
  cluster::TokenBatch refused;
  s.Enqueue(Submission(1, Prompt(3), /*max_tokens=*/1), &refused);
  s.Enqueue(Submission(2, Prompt(3), /*max_tokens=*/3), &refused);
  now_ms_ += 5;
  cluster::TokenBatch first = Step(s, 7);  // request 1: admitted, prefilled, its one token
  ASSERT_EQ(first.updates_size(), 1);
  EXPECT_EQ(first.updates(0).finish_reason(), common::LENGTH);
  EXPECT_EQ(first.updates(0).queue_time_ms(), 5u);
  now_ms_ += 20;  // request 2 waited for the only slot
  Step(s, 7);     // frees 1, admits 2: prefill and its first token
  now_ms_ += 10;
  Step(s, 7);
  now_ms_ += 10;
  cluster::TokenBatch last = Step(s, 7);
  ASSERT_EQ(last.updates_size(), 1);
  const cluster::SequenceUpdate& u = last.updates(0);
  EXPECT_EQ(u.request_id(), 2u);
  EXPECT_EQ(u.finish_reason(), common::LENGTH);
  EXPECT_EQ(u.queue_time_ms(), 25u);
  EXPECT_EQ(u.prefill_time_ms(), 0u);  // the clock did not move within its first step
  EXPECT_EQ(u.decode_time_ms(), 20u);
}

// An engine that verifies drafts and draws at most 6 rows a step on its
// device (as CudaEngine's sampling buffers bound them).
class RowBoundEngine : public FakeEngine {
 public:
  bool VerifiesDrafts() const override { return true; }
  int64_t MaxDeviceSampledRows() const override { return 6; }
};

// Three decoding sequences drafting 3 tokens each would take 12 rows: the
// drafts are trimmed from the last item back until the step takes 6, so it
// keeps the device's draws.
TEST(SchedulerRowsTest, DraftsAreTrimmedToTheDeviceSampledRows) {
  RowBoundEngine engine;
  SchedulerLimits limits;
  limits.max_batch_tokens = 256;
  limits.max_sequences = 8;
  limits.speculative.method = SpeculativeMethod::kNgram;
  limits.speculative.num_tokens = 3;
  Scheduler s(&engine, limits, [] { return uint64_t{1000}; });
  cluster::TokenBatch refused, out;
  // Prompts that repeat, so that prompt lookup drafts after their first
  // token (10, which follows 12 in them).
  for (uint64_t id = 1; id <= 3; ++id) {
    s.Enqueue(Submission(id, {10, 11, 12, 10, 11, 12, 10, 11, 12}, 20), &refused);
  }
  cluster::StepPlan prefill = s.Plan(&refused);
  ASSERT_EQ(prefill.items_size(), 3);
  StepOutput drawn;
  for (int i = 0; i < 3; ++i) {
    drawn.logits.emplace_back();
    TokenLogprob lp;
    lp.token = 10;
    drawn.sampled.push_back(lp);
  }
  s.Complete(prefill, drawn, &out);
  const cluster::StepPlan plan = s.Plan(&refused);
  ASSERT_EQ(plan.items_size(), 3);
  int64_t rows = 0;
  for (const cluster::PlanItem& it : plan.items()) {
    rows += 1 + it.draft_tokens();
    EXPECT_EQ(it.tokens_size(), 1 + static_cast<int>(it.draft_tokens()));
  }
  EXPECT_EQ(rows, 6);
  EXPECT_EQ(plan.items(0).draft_tokens(), 3u);  // the first item keeps its draft
  EXPECT_EQ(plan.items(2).draft_tokens(), 0u);
}

}  // namespace
}  // namespace flotilla::worker
