// The CUDA engine's host-memory KV tier: a prompt whose cached blocks the
// device pools evicted is served from the pinned host copies (cudaMemcpyAsync
// back into fresh blocks) with the tokens and logits (within the MoE's
// run-to-run rounding) of a run that hit the same prefix on the device, and
// the tier's counters move.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cuda/device.h"
#include "tests/engine/multi_turn.h"
#include "tests/engine/small_cuda_options.h"
#include "worker/engine/cuda_engine.h"
#include "worker/model/synthetic_weights.h"

namespace flotilla {
namespace {

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(double{a[i]} - b[i]));
  return d;
}

TEST(CudaEngineHostTier, AnEvictedPromptIsServedFromPinnedHostCopies) {
  if (kernels::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device present";
  ModelConfig c = ModelConfig::Tiny();
  c.sliding_window = 32;
  auto w = MakeSyntheticWeights(c, 5);
  ASSERT_TRUE(w.ok()) << w.status();
  testing::MultiTurnOptions o;
  o.generate = 6;
  o.prefill_chunk = 64;
  const std::vector<int32_t> prompt = testing::TurnTokens(200, 5, 1024);
  const std::vector<int32_t> other = testing::TurnTokens(200, 77, 1024);

  // The reference: the same prefix hit on the device (room for everything).
  CudaEngineOptions roomy = testing_util::SmallCudaOptions(64, 512, 64, 4);
  auto big = CudaEngine::Create(*w, roomy);
  ASSERT_TRUE(big.ok()) << big.status();
  testing::RunTurn(**big, prompt, o);
  const testing::TurnResult hit = testing::RunTurn(**big, prompt, o);
  ASSERT_EQ(hit.cached, 192);

  // Pools of 14 blocks hold one such sequence: the other prompt evicts the
  // first one's blocks, which go to the host tier.
  CudaEngineOptions small = testing_util::SmallCudaOptions(14, 512, 64, 4);
  small.kv_host_cache_bytes = 64 << 20;
  auto e = CudaEngine::Create(*w, small);
  ASSERT_TRUE(e.ok()) << e.status();
  CudaEngine& engine = **e;
  EXPECT_EQ(testing::RunTurn(engine, prompt, o).cached, 0);
  testing::RunTurn(engine, other, o);
  EXPECT_GT(engine.KvHostStats().stored_blocks, 0);
  const testing::TurnResult again = testing::RunTurn(engine, prompt, o);
  EXPECT_EQ(again.cached, 192);
  EXPECT_EQ(again.computed, 8 + 5);
  const KvHostTierStats stats = engine.KvHostStats();
  EXPECT_GT(stats.hit_blocks, 0);
  EXPECT_GT(stats.bytes_to_device, 0);
  EXPECT_LE(stats.used_bytes, stats.capacity_bytes);
  EXPECT_EQ(again.tokens, hit.tokens);
  ASSERT_EQ(again.logits.size(), hit.logits.size());
  // The same logits up to the MoE's float atomics, which add a token's
  // expert outputs in no fixed order (two runs differed by up to 6e-3 on an
  // H200); a wrong or stale block moves them by the logits' own scale.
  for (size_t i = 0; i < hit.logits.size(); ++i) {
    const double scale =
        std::max(1.0, MaxAbsDiff(hit.logits[i], std::vector<float>(hit.logits[i].size(), 0.f)));
    EXPECT_LE(MaxAbsDiff(again.logits[i], hit.logits[i]), 0.01 * scale) << "token " << i;
  }
  // Every block is back in the pools.
  EXPECT_EQ(engine.free_kv_blocks(), engine.num_kv_blocks());
}

}  // namespace
}  // namespace flotilla
