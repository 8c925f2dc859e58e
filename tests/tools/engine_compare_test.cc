#include "tools/cli/engine_compare.h"

#include <gtest/gtest.h>

namespace flotilla::cli {
namespace {

TEST(EngineCompare, MeasuresBatchOneTheBatchAndThePowersOfTwoAroundIt) {
  EXPECT_EQ(CompareBatchSizes(1), (std::vector<uint32_t>{1}));
  EXPECT_EQ(CompareBatchSizes(8), (std::vector<uint32_t>{1, 8}));
  EXPECT_EQ(CompareBatchSizes(12), (std::vector<uint32_t>{1, 8, 12, 16}));
  EXPECT_EQ(CompareBatchSizes(0), (std::vector<uint32_t>{1}));
}

cluster::EngineMeasurement Measured() {
  cluster::EngineMeasurement m;
  for (auto [batch, ms] : {std::pair{1u, 2.0}, std::pair{4u, 4.0}}) {
    cluster::DecodeTiming* d = m.add_decode();
    d->set_batch(batch);
    d->set_step_ms_p50(ms);
  }
  cluster::PrefillTiming* p = m.add_prefill();
  p->set_prompt_tokens(1024);
  p->set_ms_p50(50);
  return m;
}

TEST(EngineCompare, EngineRateIsOutputOverDecodeStepsAndPrefills) {
  ServedLoad load;
  load.batch = 4;
  load.output_tokens = 400;  // 4 requests of 100 tokens: 1 from prefill, 99 decoded
  load.prompts = 4;
  load.elapsed_s = 1.0;
  load.itl_p50_ms = 5;
  load.ttft_p50_ms = 60;
  nlohmann::json j = EngineComparison(load, Measured());
  const nlohmann::json& c = j["engine_compare"];
  EXPECT_EQ(c["batch"], 4);
  EXPECT_DOUBLE_EQ(c["decode_steps"].get<double>(), 99.0);
  // 99 steps x 4 ms + 4 prefills x 50 ms = 0.596 s for 400 tokens.
  EXPECT_NEAR(c["engine_output_tokens_per_s"].get<double>(), 400 / 0.596, 1e-9);
  EXPECT_NEAR(c["served_over_engine"].get<double>(), 400 / (400 / 0.596), 1e-9);
  EXPECT_DOUBLE_EQ(c["itl_over_engine_step"].get<double>(), 1.25);
  EXPECT_DOUBLE_EQ(c["ttft_minus_engine_prefill_ms"].get<double>(), 10);
  EXPECT_EQ(j["engine"]["decode"].size(), 2u);
}

TEST(EngineCompare, ABatchPastMaxSequencesUsesTheLargestMeasured) {
  ServedLoad load;
  load.batch = 64;  // the instance measured at most batch 4 (its max_sequences)
  load.output_tokens = 10;
  load.prompts = 1;
  load.elapsed_s = 1;
  EXPECT_EQ(EngineComparison(load, Measured())["engine_compare"]["batch"], 4);
}

// A sharded instance's measurement is one DP group's: the groups split the
// served batch and step together, so the instance runs groups x that rate.
TEST(EngineCompare, ShardedInstancesCompareAGroupsBatchAndScaleByTheGroups) {
  ServedLoad load;
  load.batch = 8;  // over 2 DP groups: 4 each
  load.dp_groups = 2;
  load.output_tokens = 800;  // 8 requests of 100 tokens
  load.prompts = 8;
  load.elapsed_s = 1.0;
  load.itl_p50_ms = 5;
  const cluster::MeasureEngineRequest r = CompareRequest(load, 64, 8);
  EXPECT_EQ(std::vector<uint32_t>(r.batch_sizes().begin(), r.batch_sizes().end()),
            (std::vector<uint32_t>{1, 4}));
  cluster::EngineMeasurement m = Measured();
  m.set_dp_groups(2);
  m.set_tp_size(2);
  m.set_world_size(4);
  nlohmann::json j = EngineComparison(load, m);
  const nlohmann::json& c = j["engine_compare"];
  EXPECT_EQ(c["dp_groups"], 2);
  EXPECT_EQ(c["batch"], 4);
  EXPECT_DOUBLE_EQ(c["decode_steps"].get<double>(), 99.0);  // per group
  // Each group: 99 steps x 4 ms + 4 prefills x 50 ms = 0.596 s for 400 of the 800 tokens.
  EXPECT_NEAR(c["engine_output_tokens_per_s"].get<double>(), 800 / 0.596, 1e-9);
  EXPECT_NEAR(c["engine_output_tokens_per_s_per_dp_group"].get<double>(), 400 / 0.596, 1e-9);
  EXPECT_NEAR(c["served_over_engine"].get<double>(), 800 / (800 / 0.596), 1e-9);
  EXPECT_EQ(j["engine"]["dp_groups"], 2);
  EXPECT_EQ(j["engine"]["world_size"], 4);
  EXPECT_EQ(GroupBatch(9, 2), 5);
  EXPECT_EQ(GroupBatch(1, 4), 1);
}

}  // namespace
}  // namespace flotilla::cli
