#include "worker/prefill_policy.h"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

namespace flotilla::worker {
namespace {

using Chunks = std::vector<std::pair<uint64_t, int64_t>>;  // (request id, tokens)

// The chunks as (request id, tokens), every candidate's `left` as given.
Chunks Plan(const PrefillPolicy& policy, const std::vector<PrefillCandidate>& candidates,
            int64_t budget, uint64_t now_ms = 0) {
  Chunks out;
  auto left_of = [&](size_t i) { return candidates[i].left; };
  for (const PrefillChunk& c : PlanPrefill(policy, candidates, budget, now_ms, left_of)) {
    out.emplace_back(candidates[c.candidate].request_id, c.tokens);
  }
  return out;
}

PrefillCandidate Prompt(uint64_t id, uint64_t arrived_ms, int64_t tokens) {
  return PrefillCandidate{id, arrived_ms, tokens, tokens};
}

TEST(PrefillPolicyTest, FcfsFillsTheBudgetInArrivalOrder) {
  PrefillPolicy p;
  // Request 7 arrived first although its id is larger.
  const std::vector<PrefillCandidate> c = {Prompt(3, 20, 100), Prompt(7, 10, 50), Prompt(5, 30, 8)};
  EXPECT_EQ(Plan(p, c, 120), (Chunks{{7, 50}, {3, 70}}));
  EXPECT_EQ(Plan(p, c, 1000), (Chunks{{7, 50}, {3, 100}, {5, 8}}));
  EXPECT_TRUE(Plan(p, c, 0).empty());
}

TEST(PrefillPolicyTest, ShortestPromptFirstOrdersByTokensLeft) {
  PrefillPolicy p;
  p.order = PrefillOrder::kShortestPromptFirst;
  std::vector<PrefillCandidate> c = {Prompt(1, 0, 2000), Prompt(2, 5, 300), Prompt(3, 9, 40)};
  EXPECT_EQ(Plan(p, c, 512), (Chunks{{3, 40}, {2, 300}, {1, 172}}));
  // A started prompt competes with what it has left, not its length.
  c[0].left = 10;
  EXPECT_EQ(Plan(p, c, 512), (Chunks{{1, 10}, {3, 40}, {2, 300}}));
}

TEST(PrefillPolicyTest, APromptWaitingPastTheBoundGoesFirst) {
  PrefillPolicy p;
  p.order = PrefillOrder::kShortestPromptFirst;
  p.max_prefill_wait_ms = 1000;
  const std::vector<PrefillCandidate> c = {Prompt(1, 0, 2000), Prompt(2, 500, 300),
                                           Prompt(3, 900, 40)};
  // At 999 ms nobody waited a second: shortest first.
  EXPECT_EQ(Plan(p, c, 256, 999), (Chunks{{3, 40}, {2, 216}}));
  // At 1000 ms request 1 did; at 1500 ms request 2 too (arrival order among them).
  EXPECT_EQ(Plan(p, c, 256, 1000), (Chunks{{1, 256}}));
  EXPECT_EQ(Plan(p, c, 2500, 1500), (Chunks{{1, 2000}, {2, 300}, {3, 40}}));
}

TEST(PrefillPolicyTest, LongPromptsAreCappedSoShortOnesGetIn) {
  PrefillPolicy p;
  p.long_prefill_token_threshold = 256;
  const std::vector<PrefillCandidate> c = {Prompt(1, 0, 2000), Prompt(2, 1, 100)};
  EXPECT_EQ(Plan(p, c, 1024), (Chunks{{1, 924}, {2, 100}}));
  // The cap holds while others still want the budget...
  const std::vector<PrefillCandidate> many = {Prompt(1, 0, 2000), Prompt(2, 1, 500),
                                              Prompt(3, 2, 600)};
  EXPECT_EQ(Plan(p, many, 600), (Chunks{{1, 256}, {2, 256}, {3, 88}}));
  // ...and gives way when the long prompt is alone: no budget is wasted.
  EXPECT_EQ(Plan(p, {Prompt(1, 0, 2000)}, 1024), (Chunks{{1, 1024}}));
}

TEST(PrefillPolicyTest, PartialPrefillsAreBounded) {
  PrefillPolicy p;
  p.max_partial_prefills = 2;
  const std::vector<PrefillCandidate> c = {Prompt(1, 0, 10), Prompt(2, 1, 10), Prompt(3, 2, 10)};
  EXPECT_EQ(Plan(p, c, 100), (Chunks{{1, 10}, {2, 10}}));
  p.long_prefill_token_threshold = 5;
  p.max_long_partial_prefills = 1;
  const std::vector<PrefillCandidate> mixed = {Prompt(1, 0, 10), Prompt(2, 1, 10), Prompt(3, 2, 4)};
  // Request 2 is long and one long prompt is already in the step: 3 passes it.
  EXPECT_EQ(Plan(p, mixed, 100), (Chunks{{1, 10}, {3, 4}}));
}

TEST(PrefillPolicyTest, TheRealRemainderIsAskedBeforeTheFirstChunk) {
  PrefillPolicy p;
  const std::vector<PrefillCandidate> c = {Prompt(1, 0, 100), Prompt(2, 1, 100)};
  std::vector<size_t> asked;
  // Request 1 turns out to have 90 tokens cached.
  auto left_of = [&](size_t i) {
    asked.push_back(i);
    return i == 0 ? int64_t{10} : c[i].left;
  };
  const std::vector<PrefillChunk> chunks = PlanPrefill(p, c, 50, 0, left_of);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0].tokens, 10);
  EXPECT_EQ(chunks[1].tokens, 40);
  EXPECT_EQ(asked, (std::vector<size_t>{0, 1}));
}

TEST(PrefillPolicyTest, OrderNamesParse) {
  EXPECT_EQ(*ParsePrefillOrder("fcfs"), PrefillOrder::kFcfs);
  EXPECT_EQ(*ParsePrefillOrder("shortest-prompt-first"), PrefillOrder::kShortestPromptFirst);
  absl::StatusOr<PrefillOrder> bad = ParsePrefillOrder("lifo");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("lifo"), std::string_view::npos);
  EXPECT_EQ(PrefillOrderName(PrefillOrder::kShortestPromptFirst), "shortest-prompt-first");
}

}  // namespace
}  // namespace flotilla::worker
