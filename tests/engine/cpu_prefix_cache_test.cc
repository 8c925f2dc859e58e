// The CPU engine's prefix cache: greedy tokens (and logits) identical with
// the cache on and off over multi-turn prompts longer than the sliding
// window, prefill work cut by the shared prefix, sliding layers' windows
// checked, and eviction under memory pressure.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/engine/logit_diff.h"
#include "tests/engine/multi_turn.h"
#include "worker/engine/cpu_engine.h"
#include "worker/model/synthetic_weights.h"

namespace flotilla {
namespace {

using testing::MultiTurnOptions;
using testing::RunTurns;
using testing::TurnResult;

struct Layout {
  int64_t window;
  int64_t block_size;
};

std::unique_ptr<CpuEngine> MakeEngine(kernels::cpu::ThreadPool* pool, Layout layout,
                                      bool prefix_cache, int64_t blocks = 0) {
  ModelConfig c = ModelConfig::Tiny();
  c.sliding_window = layout.window;
  auto w = MakeSyntheticWeights(c, 3);
  EXPECT_TRUE(w.ok()) << w.status();
  CpuEngineOptions o;
  o.kv_block_size = layout.block_size;
  o.kv_num_blocks = blocks > 0 ? blocks
                               : CpuEngine::KvBlocksFor(c, c.num_key_value_heads,
                                                        layout.block_size, 4, 1024);
  o.prefix_cache = prefix_cache;
  auto e = CpuEngine::Create(std::move(*w), o, pool);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(*e);
}

double MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  return testing_golden::MaxAbsDiff(a, b);
}

void ExpectSameTurns(const std::vector<TurnResult>& cached, const std::vector<TurnResult>& plain) {
  ASSERT_EQ(cached.size(), plain.size());
  for (size_t t = 0; t < cached.size(); ++t) {
    SCOPED_TRACE("turn " + std::to_string(t));
    EXPECT_EQ(cached[t].tokens, plain[t].tokens);
    EXPECT_LE(MaxDiff(cached[t].first_logits, plain[t].first_logits), 1e-4);
    EXPECT_EQ(plain[t].cached, 0);
    EXPECT_EQ(cached[t].computed, plain[t].computed - cached[t].cached);
  }
}

int64_t AlignDown(int64_t n, int64_t block) { return n / block * block; }

class CpuPrefixCache : public ::testing::TestWithParam<std::tuple<Layout, bool>> {};

TEST_P(CpuPrefixCache, MultiTurnGreedyTokensMatchWithoutTheCache) {
  const auto [layout, keep_answers] = GetParam();
  kernels::cpu::ThreadPool pool(2);
  MultiTurnOptions o;
  o.keep_answers = keep_answers;
  o.first_prompt = static_cast<int>(2 * layout.window + 5);  // past the window from turn 0
  o.prefill_chunk = static_cast<int>(layout.window + 3);     // chunks past the window too
  auto with = MakeEngine(&pool, layout, true);
  auto without = MakeEngine(&pool, layout, false);
  const std::vector<TurnResult> cached = RunTurns(*with, o);
  const std::vector<TurnResult> plain = RunTurns(*without, o);
  ExpectSameTurns(cached, plain);
  int64_t computed_with = 0, computed_without = 0;
  for (size_t t = 1; t < cached.size(); ++t) {
    // Everything the previous turn's sequence held, in whole blocks.
    const int64_t held = cached[t - 1].prompt.size() + (keep_answers ? o.generate - 1 : 0);
    EXPECT_EQ(cached[t].cached, AlignDown(held, layout.block_size)) << "turn " << t;
    computed_with += cached[t].computed;
    computed_without += plain[t].computed;
  }
  // Each later turn computes its new tokens (and a partial block), not the history.
  EXPECT_LT(computed_with * 2, computed_without);
  EXPECT_EQ(with->KvFreeBlocks(), with->KvTotalBlocks());  // cached blocks count as free
  EXPECT_GT(with->kv_cache().prefix_cache().cached_free_blocks(), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, CpuPrefixCache,
    ::testing::Combine(::testing::Values(Layout{8, 4}, Layout{128, 16}, Layout{16, 16}),
                       ::testing::Bool()));

TEST(CpuPrefixCacheSliding, AMatchNeedsTheSlidingWindowBeforeIt) {
  kernels::cpu::ThreadPool pool(2);
  const Layout layout{8, 4};
  const std::vector<int32_t> a = testing::TurnTokens(100, 5, 1024);
  std::vector<int32_t> b(a.begin(), a.begin() + 60);
  const std::vector<int32_t> tail = testing::TurnTokens(9, 6, 1024);
  b.insert(b.end(), tail.begin(), tail.end());
  for (int chunk : {100, 4}) {
    SCOPED_TRACE("first prompt in chunks of " + std::to_string(chunk));
    MultiTurnOptions o;
    o.prefill_chunk = chunk;
    auto with = MakeEngine(&pool, layout, true);
    auto without = MakeEngine(&pool, layout, false);
    testing::RunTurn(*with, a, o);
    // One chunk of 100 wrote sliding layers only for its last window: position
    // 60's window is not cached and a match cannot start there (nor earlier).
    // Chunks of 4 wrote every position's window.
    EXPECT_EQ(with->CachedPrefixLength(b, 0), chunk == 100 ? 0 : 60);
    const TurnResult got = testing::RunTurn(*with, b, o);
    const TurnResult want = testing::RunTurn(*without, b, o);
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_LE(MaxDiff(got.first_logits, want.first_logits), 1e-4);
    // The whole of `a` plus more matches up to a's last full block.
    std::vector<int32_t> longer = a;
    longer.insert(longer.end(), tail.begin(), tail.end());
    EXPECT_EQ(with->CachedPrefixLength(longer, 0), 100);
  }
}

TEST(CpuPrefixCacheSliding, ThePromptsLastTokenIsAlwaysComputed) {
  kernels::cpu::ThreadPool pool(2);
  auto e = MakeEngine(&pool, Layout{8, 4}, true);
  const std::vector<int32_t> a = testing::TurnTokens(32, 7, 1024);
  testing::RunTurn(*e, a, MultiTurnOptions{});
  EXPECT_EQ(e->CachedPrefixLength(a, 0), 28);  // 32 are cached; 31 may be used, in whole blocks
  EXPECT_EQ(e->CachedPrefixLength({a.begin(), a.begin() + 1}, 0), 0);
  auto bad = e->NewSequenceWithPrefix({a.begin(), a.begin() + 6}, 0);  // not whole blocks
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  std::vector<int32_t> other = a;
  other[0] += 1;
  EXPECT_EQ(e->NewSequenceWithPrefix({other.begin(), other.begin() + 8}, 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// Tenants do not share cached blocks: a prompt cached in one domain is a miss
// in every other (the shared domain 0 included), a hit in its own, and a
// domain's sequences add their blocks to that domain only.
TEST(CpuPrefixCacheDomains, BlocksAreSharedOnlyWithinADomain) {
  kernels::cpu::ThreadPool pool(2);
  auto e = MakeEngine(&pool, Layout{8, 4}, true);
  const std::vector<int32_t> a = testing::TurnTokens(32, 7, 1024);
  MultiTurnOptions in_a;
  in_a.cache_domain = 0x1234;
  testing::RunTurn(*e, a, in_a);
  EXPECT_EQ(e->CachedPrefixLength(a, 0x1234), 28);
  EXPECT_EQ(e->CachedPrefixLength(a, 0x1235), 0);
  EXPECT_EQ(e->CachedPrefixLength(a, 0), 0);
  EXPECT_EQ(e->NewSequenceWithPrefix({a.begin(), a.begin() + 8}, 0x1235).status().code(),
            absl::StatusCode::kFailedPrecondition);
  MultiTurnOptions in_b;
  in_b.cache_domain = 0x1235;
  const TurnResult b = testing::RunTurn(*e, a, in_b);
  EXPECT_EQ(b.cached, 0);
  EXPECT_EQ(e->CachedPrefixLength(a, 0x1235), 28);  // now cached in b's domain too
  EXPECT_EQ(e->CachedPrefixLength(a, 0), 0);
  EXPECT_EQ(testing::RunTurn(*e, a, in_a).cached, 28);
  EXPECT_EQ(testing::RunTurn(*e, a, in_b).tokens, b.tokens);
}

TEST(CpuPrefixCacheEviction, TokensStayTheSameWhenTheArenaIsShort) {
  kernels::cpu::ThreadPool pool(2);
  const Layout layout{8, 4};
  MultiTurnOptions o;
  o.turns = 5;
  ModelConfig c = ModelConfig::Tiny();
  c.sliding_window = layout.window;
  // Room for the last turn's sequence and a little more: every turn evicts.
  const int64_t longest = o.first_prompt + (o.turns - 1) * (o.new_tokens + o.generate) + o.generate;
  const int64_t blocks =
      CpuEngine::KvBlocksFor(c, c.num_key_value_heads, layout.block_size, 1, longest) + 8;
  auto with = MakeEngine(&pool, layout, true, blocks);
  auto without = MakeEngine(&pool, layout, false, blocks);
  ExpectSameTurns(RunTurns(*with, o), RunTurns(*without, o));

  // An unrelated prompt that needs the whole arena evicts every cached block:
  // the conversation's next turn computes everything again, with the same tokens.
  const std::vector<TurnResult> before = RunTurns(*with, o);
  EXPECT_GT(before.back().cached, 0);
  MultiTurnOptions big = o;
  big.seed = 99;
  testing::RunTurn(*with, testing::TurnTokens(static_cast<int>(longest), 99, 1024), big);
  const TurnResult again = testing::RunTurn(*with, before.back().prompt, o);
  EXPECT_LT(again.cached, before.back().cached);
  EXPECT_EQ(again.tokens, before.back().tokens);
}

}  // namespace
}  // namespace flotilla
