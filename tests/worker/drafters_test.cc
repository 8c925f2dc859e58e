// The drafters behind speculative decoding's suffix and replay methods, on
// their own: suffix matching over a request and recent outputs
// (suffix_drafter.h), the benchmark-only replay drafter and the relation of
// its error rate to the acceptance length (replay_drafter.h), and one
// request's drafter over both (speculative_drafter.h).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "worker/replay_drafter.h"
#include "worker/speculative_drafter.h"
#include "worker/suffix_drafter.h"

namespace flotilla::worker {
namespace {

std::vector<int32_t> Draft(const SuffixIndex& own, const SuffixIndex* recent,
                           const std::vector<int32_t>& context, int k) {
  const SuffixIndex* indexes[] = {&own, recent};
  return ProposeSuffixDraft(indexes, context, k);
}

TEST(SuffixDraftTest, FollowsTheLongestMatchingPlace) {
  // "5 6" occurs twice; only the second is preceded by "4", as the context's end is.
  const std::vector<int32_t> context = {1, 5, 6, 7, 8, 4, 5, 6, 9, 9, 2, 4, 5, 6};
  SuffixIndex own;
  own.Add(context);
  EXPECT_EQ(Draft(own, nullptr, context, 3), (std::vector<int32_t>{9, 9, 2}));
  EXPECT_EQ(Draft(own, nullptr, context, 1), (std::vector<int32_t>{9}));
}

TEST(SuffixDraftTest, FollowsTheContinuationMostPlacesShare) {
  // Three places end with "3 4": two go on with 7 8, one with 9.
  const std::vector<int32_t> context = {3, 4, 7, 8, 1, 3, 4, 9, 2, 3, 4, 7, 8, 0, 3, 4};
  SuffixIndex own;
  own.Add(context);
  EXPECT_EQ(Draft(own, nullptr, context, 2), (std::vector<int32_t>{7, 8}));
}

TEST(SuffixDraftTest, RecentOutputsAreSearchedBesideTheRequest) {
  SuffixIndex recent;
  recent.Add(std::vector<int32_t>{50, 51, 52, 53, 54, 55});
  SuffixIndex own;
  const std::vector<int32_t> context = {9, 8, 51, 52};
  own.Add(context);
  EXPECT_EQ(Draft(own, &recent, context, 3), (std::vector<int32_t>{53, 54, 55}));
  // Longer than what follows: what there is.
  EXPECT_EQ(Draft(own, &recent, context, 8), (std::vector<int32_t>{53, 54, 55}));
  EXPECT_TRUE(Draft(own, nullptr, context, 3).empty());
  EXPECT_TRUE(Draft(own, &recent, std::vector<int32_t>{52}, 3).empty())
      << "one token matches nothing";
}

TEST(SuffixDraftTest, TheIndexGrowsWithTheRequest) {
  SuffixIndex own;
  own.Add(std::vector<int32_t>{1, 2, 3});
  std::vector<int32_t> context = {1, 2, 3, 1, 2};
  own.Extend(std::vector<int32_t>{1, 2});
  EXPECT_EQ(Draft(own, nullptr, context, 2), (std::vector<int32_t>{3, 1}));
}

TEST(SuffixDraftTest, TheOldestOutputsAreForgottenPastTheBound) {
  SuffixIndex recent(/*max_tokens=*/8);
  recent.Add(std::vector<int32_t>{1, 2, 3, 4});
  recent.Add(std::vector<int32_t>{5, 6, 7, 8});
  recent.Add(std::vector<int32_t>{9, 10, 11});
  EXPECT_LE(recent.tokens(), 8);
  SuffixIndex own;
  own.Add(std::vector<int32_t>{1, 2});
  EXPECT_TRUE(Draft(own, &recent, std::vector<int32_t>{1, 2}, 2).empty()) << "forgotten";
  own.Add(std::vector<int32_t>{9, 10});
  EXPECT_EQ(Draft(own, &recent, std::vector<int32_t>{9, 10}, 2), (std::vector<int32_t>{11}));
}

TEST(ReplayDraftTest, ProposesTheRecordingAfterWhatWasGenerated) {
  const std::vector<int32_t> recorded = {10, 11, 12, 13, 14};
  EXPECT_EQ(ProposeReplayDraft(recorded, std::vector<int32_t>{10, 11}, 2, 0.0, 1, 100),
            (std::vector<int32_t>{12, 13}));
  EXPECT_EQ(ProposeReplayDraft(recorded, std::vector<int32_t>{10, 11, 12, 13}, 3, 0.0, 1, 100),
            (std::vector<int32_t>{14}));
  EXPECT_TRUE(ProposeReplayDraft(recorded, std::vector<int32_t>{10, 99}, 2, 0.0, 1, 100).empty())
      << "the request left the recording";
  EXPECT_TRUE(ProposeReplayDraft(recorded, recorded, 2, 0.0, 1, 100).empty());
  // Error rate 1: every drafted token is another one, in the vocabulary.
  const std::vector<int32_t> wrong =
      ProposeReplayDraft(recorded, std::vector<int32_t>{}, 5, 1.0, 7, 16);
  ASSERT_EQ(wrong.size(), 5u);
  for (size_t j = 0; j < wrong.size(); ++j) {
    EXPECT_NE(wrong[j], recorded[j]);
    EXPECT_GE(wrong[j], 0);
    EXPECT_LT(wrong[j], 16);
  }
  // Reproducible for a salt.
  EXPECT_EQ(ProposeReplayDraft(recorded, std::vector<int32_t>{}, 5, 0.5, 3, 100),
            ProposeReplayDraft(recorded, std::vector<int32_t>{}, 5, 0.5, 3, 100));
}

TEST(ReplayDraftTest, RecordingsAreKeyedByPromptAndDeterministicSampling) {
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SamplingParams unseeded;
  unseeded.temperature = 1.0f;
  SamplingParams seeded = unseeded;
  seeded.seed = 4;
  const std::vector<int32_t> prompt = {1, 2, 3};
  EXPECT_NE(ReplayKey(prompt, greedy), 0u);
  EXPECT_EQ(ReplayKey(prompt, unseeded), 0u) << "its output is not reproducible";
  EXPECT_NE(ReplayKey(prompt, seeded), ReplayKey(prompt, greedy));
  SamplingParams other_seed = seeded;
  other_seed.seed = 5;
  EXPECT_NE(ReplayKey(prompt, seeded), ReplayKey(prompt, other_seed));
  EXPECT_NE(ReplayKey(prompt, greedy), ReplayKey(std::vector<int32_t>{1, 2, 4}, greedy));
  SamplingParams biased = greedy, reordered = greedy;
  biased.logit_bias = {{1, 2.0f}, {5, -1.0f}};
  reordered.logit_bias = {{5, -1.0f}, {1, 2.0f}};
  EXPECT_EQ(ReplayKey(prompt, biased), ReplayKey(prompt, reordered));
}

TEST(ReplayDraftTest, RecordingsStayWithinTheirBound) {
  ReplayRecordings r(/*max_tokens=*/10);
  r.Record(1, std::vector<int32_t>{1, 2, 3, 4});
  r.Record(2, std::vector<int32_t>{5, 6, 7, 8});
  r.Record(0, std::vector<int32_t>{9});  // not recorded
  EXPECT_EQ(r.size(), 2u);
  r.Record(3, std::vector<int32_t>{9, 9, 9, 9});
  EXPECT_LE(r.tokens(), 10);
  EXPECT_EQ(r.Find(1), nullptr) << "the oldest goes first";
  ASSERT_NE(r.Find(3), nullptr);
  r.Record(2, std::vector<int32_t>{1});  // replaced
  EXPECT_EQ(*r.Find(2), std::vector<int32_t>{1});
  EXPECT_EQ(r.tokens(), 5);
}

TEST(ReplayDraftTest, TheErrorRateSetsTheAcceptanceLength) {
  EXPECT_DOUBLE_EQ(ExpectedReplayAcceptanceLength(0.0, 3), 4.0);
  EXPECT_DOUBLE_EQ(ExpectedReplayAcceptanceLength(1.0, 3), 1.0);
  for (double length : {1.5, 2.0, 2.5, 3.0}) {
    const double rate = ReplayErrorRateFor(length, 3);
    EXPECT_NEAR(ExpectedReplayAcceptanceLength(rate, 3), length, 1e-9);
  }
  EXPECT_NEAR(ReplayErrorRateFor(2.5, 3), 0.3086, 1e-3);
  // Measured: verification accepts a recorded draft up to its first wrong
  // token (the recording is the model's own output), over many steps.
  std::vector<int32_t> recorded(12000);
  std::mt19937 rng(1);
  for (int32_t& t : recorded) t = static_cast<int32_t>(rng() % 1000);
  for (double length : {1.5, 2.0, 2.5, 3.0}) {
    SCOPED_TRACE(length);
    const double rate = ReplayErrorRateFor(length, 3);
    size_t at = 0;
    int64_t steps = 0, tokens = 0;
    while (at + 4 < recorded.size()) {
      const std::vector<int32_t> draft = ProposeReplayDraft(
          recorded, absl::MakeConstSpan(recorded).subspan(0, at), 3, rate, 11, 1000);
      size_t accepted = 0;
      while (accepted < draft.size() && draft[accepted] == recorded[at + accepted]) ++accepted;
      at += accepted + 1;  // and the model's own token after them
      tokens += static_cast<int64_t>(accepted) + 1;
      ++steps;
    }
    EXPECT_NEAR(static_cast<double>(tokens) / steps, length, 0.05);
  }
}

TEST(SpeculativeDrafterTest, EachMethodDraftsFromItsSource) {
  DraftMemory memory;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const std::vector<int32_t> prompt = {1, 2, 3, 1, 2};
  SpeculativeConfig config;
  config.num_tokens = 2;
  config.method = SpeculativeMethod::kNgram;
  SpeculativeDrafter ngram(config, &memory, prompt, greedy, 1, 100);
  EXPECT_EQ(ngram.Propose({}, 8), (std::vector<int32_t>{3, 1}));
  EXPECT_EQ(ngram.Propose({}, 1), (std::vector<int32_t>{3}));
  config.method = SpeculativeMethod::kSuffix;
  SpeculativeDrafter suffix(config, &memory, prompt, greedy, 1, 100);
  EXPECT_EQ(suffix.Propose(std::vector<int32_t>{3}, 8), (std::vector<int32_t>{1, 2}));
  suffix.Finish(std::vector<int32_t>{3, 40, 41, 42});
  EXPECT_GT(memory.recent_outputs.tokens(), 0);
  // Replay: recorded when allowed, whatever the method; then replayed.
  config.allow_replay = true;
  config.method = SpeculativeMethod::kOff;
  SpeculativeDrafter recording(config, &memory, prompt, greedy, 1, 100);
  EXPECT_TRUE(recording.Propose({}, 8).empty());
  recording.Finish(std::vector<int32_t>{7, 8, 9});
  config.method = SpeculativeMethod::kReplay;
  SpeculativeDrafter replay(config, &memory, prompt, greedy, 2, 100);
  EXPECT_EQ(replay.Propose(std::vector<int32_t>{7}, 8), (std::vector<int32_t>{8, 9}));
  SpeculativeDrafter other(config, &memory, std::vector<int32_t>{5}, greedy, 2, 100);
  EXPECT_TRUE(other.Propose({}, 8).empty()) << "nothing recorded for that prompt";
}

}  // namespace
}  // namespace flotilla::worker
