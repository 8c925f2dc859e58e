#include "worker/speculation_governor.h"

#include <gtest/gtest.h>

namespace flotilla::worker {
namespace {

// Feeds `steps` decisions at `decoding` sequences through a step model: a
// plain step takes `plain_us`, a drafted one `drafted_us` and accepts
// `accepted` tokens per sequence. The drafted decisions among the last
// `steps`.
int DraftedDecisions(SpeculationGovernor& g, int64_t decoding, int steps, double plain_us,
                     double drafted_us, double accepted) {
  int drafted = 0;
  for (int i = 0; i < steps; ++i) {
    const bool draft = g.ShouldDraft(decoding);
    drafted += draft ? 1 : 0;
    SpeculationGovernor::Sample s;
    s.decoding = decoding;
    s.drafted = draft ? 3 * decoding : 0;
    s.accepted = draft ? static_cast<int64_t>(accepted * static_cast<double>(decoding)) : 0;
    s.micros = draft ? drafted_us : plain_us;
    g.Record(s);
  }
  return drafted;
}

TEST(SpeculationGovernorTest, MeasuresBothKindsThenKeepsTheBetterOne) {
  SpeculationGovernor g;
  // First the drafted steps, then the plain ones, kMinSamples each.
  for (int i = 0; i < SpeculationGovernor::kMinSamples; ++i) {
    EXPECT_TRUE(g.ShouldDraft(1));
    g.Record({1, 3, 2, 3300});
  }
  for (int i = 0; i < SpeculationGovernor::kMinSamples; ++i) {
    EXPECT_FALSE(g.ShouldDraft(1));
    g.Record({1, 0, 0, 3000});
  }
  const SpeculationGovernor::Estimate e = g.EstimateAt(1);
  EXPECT_DOUBLE_EQ(e.plain_us, 3000);
  EXPECT_DOUBLE_EQ(e.drafted_us, 3300);
  EXPECT_DOUBLE_EQ(e.accepted_per_sequence, 2);
  // 3 tokens in 3.3 ms against 1 in 3 ms: drafting, but for one decision in
  // kExploreEvery that measures plain steps again.
  const int n = static_cast<int>(SpeculationGovernor::kExploreEvery) * 4;
  EXPECT_EQ(DraftedDecisions(g, 1, n, 3000, 3300, 2), n - 4);
}

TEST(SpeculationGovernorTest, LargeBatchesWhereVerifyingCostsMoreStopDrafting) {
  SpeculationGovernor g;
  // Batch 1: cheap drafts, one token accepted per step: drafting wins.
  DraftedDecisions(g, 1, 16, 3000, 3200, 1);
  // Batch 64: verifying 4 tokens a sequence doubles the step for the same
  // acceptance: plain wins.
  DraftedDecisions(g, 64, 16, 27000, 54000, 0.5);
  const int n = static_cast<int>(SpeculationGovernor::kExploreEvery);
  EXPECT_EQ(DraftedDecisions(g, 1, n, 3000, 3200, 1), n - 1);
  EXPECT_EQ(DraftedDecisions(g, 64, n, 27000, 54000, 0.5), 1);
  // Batches 64 to 127 share a bucket; batch 2 has measured nothing yet.
  EXPECT_FALSE(g.ShouldDraft(100));
  EXPECT_TRUE(g.ShouldDraft(2));
}

TEST(SpeculationGovernorTest, FollowsAcceptanceAsItChanges) {
  SpeculationGovernor g;
  DraftedDecisions(g, 8, 64, 10000, 12000, 1.5);
  EXPECT_TRUE(g.ShouldDraft(8));
  // The requests change: drafts stop being accepted. The drafted steps the
  // governor still takes (its exploring) bring the estimate down.
  DraftedDecisions(g, 8, 4 * static_cast<int>(SpeculationGovernor::kExploreEvery), 10000, 12000, 0);
  EXPECT_LT(g.EstimateAt(8).accepted_per_sequence, 0.2);
  const int n = static_cast<int>(SpeculationGovernor::kExploreEvery);
  EXPECT_EQ(DraftedDecisions(g, 8, n, 10000, 12000, 0), 1);
}

TEST(SpeculationGovernorTest, StepsOfNothingAreIgnored) {
  SpeculationGovernor g;
  g.Record({0, 0, 0, 1000});
  g.Record({4, 0, 0, 0});
  EXPECT_EQ(g.EstimateAt(4).plain_samples, 0);
  EXPECT_TRUE(g.ShouldDraft(4));
}

}  // namespace
}  // namespace flotilla::worker
