#include "worker/engine/prefix_cache.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace flotilla {
namespace {

std::unique_ptr<PrefixCache> MakeCache(int32_t blocks, int slots = 1,
                                       PrefixCacheOptions o = PrefixCacheOptions{}) {
  o.block_size = 4;
  o.num_blocks = blocks;
  o.slots = slots;
  auto cache = PrefixCache::Create(o);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return std::move(*cache);
}

std::vector<int32_t> Iota(int n, int32_t from = 0) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

// A sequence of `tokens` as an engine keeps it: one block allocated per
// started token block (slot 0), registered as the blocks complete.
struct Seq {
  PrefixCache::Chain chain;
  std::vector<int32_t> blocks;
};

Seq RunSequence(PrefixCache& cache, const std::vector<int32_t>& tokens) {
  Seq s;
  for (size_t b = 0; b < (tokens.size() + 3) / 4; ++b) s.blocks.push_back(*cache.Allocate());
  cache.Extend(&s.chain, tokens, [&](int64_t block, std::vector<int32_t>* slots) {
    (*slots)[0] = s.blocks[block];
  });
  return s;
}

void Free(PrefixCache& cache, const Seq& s) {
  for (size_t b = s.blocks.size(); b-- > 0;) cache.Release(s.blocks[b]);
}

TEST(PrefixCache, AllocatesAndCountsReferences) {
  auto cache = MakeCache(3);
  EXPECT_EQ(cache->free_blocks(), 3);
  const int32_t a = *cache->Allocate();
  EXPECT_EQ(a, 0);  // low numbers first
  cache->Hold(a);
  EXPECT_EQ(cache->refcount(a), 2);
  cache->Release(a);
  EXPECT_EQ(cache->free_blocks(), 2);
  cache->Release(a);
  EXPECT_EQ(cache->free_blocks(), 3);
  ASSERT_TRUE(cache->Allocate().has_value());
  ASSERT_TRUE(cache->Allocate().has_value());
  ASSERT_TRUE(cache->Allocate().has_value());
  EXPECT_FALSE(cache->Allocate().has_value());
}

TEST(PrefixCache, MatchesWholeBlocksOfTheSamePrefix) {
  auto cache = MakeCache(16);
  const std::vector<int32_t> first = Iota(10);  // two full blocks and a partial one
  Seq s = RunSequence(*cache, first);
  EXPECT_EQ(cache->entries(), 2);
  EXPECT_EQ(s.chain.blocks, 2);
  std::vector<int32_t> other = Iota(12);
  auto hits = cache->Walk(other, 3);
  ASSERT_EQ(hits.size(), 2u);  // the third block was never complete
  EXPECT_EQ(hits[0].slots[0], s.blocks[0]);
  EXPECT_EQ(hits[1].slots[0], s.blocks[1]);
  other[5] = 99;  // differs in the second block
  EXPECT_EQ(cache->Walk(other, 3).size(), 1u);
  other[0] = 99;
  EXPECT_TRUE(cache->Walk(other, 3).empty());
  EXPECT_EQ(cache->Walk(first, 1).size(), 1u);  // max_blocks caps the walk
}

TEST(PrefixCache, TheSameTokensAfterAnotherPrefixDoNotMatch) {
  auto cache = MakeCache(16);
  std::vector<int32_t> a = Iota(8);
  RunSequence(*cache, a);
  std::vector<int32_t> b = a;
  b[0] = 50;  // same second block, another first block
  EXPECT_TRUE(cache->Walk(b, 2).empty());
}

TEST(PrefixCache, FreedBlocksStayCachedUntilTheAllocatorNeedsThem) {
  auto cache = MakeCache(4);
  const std::vector<int32_t> tokens = Iota(8);
  Seq s = RunSequence(*cache, tokens);
  Free(*cache, s);
  EXPECT_EQ(cache->free_blocks(), 4);  // cached blocks count as free
  EXPECT_EQ(cache->cached_free_blocks(), 2);
  ASSERT_EQ(cache->Walk(tokens, 2).size(), 2u);

  // A hit holds them again: no longer free.
  for (const auto& hit : cache->Walk(tokens, 2)) cache->Hold(hit.slots[0]);
  EXPECT_EQ(cache->free_blocks(), 2);
  EXPECT_EQ(cache->cached_free_blocks(), 0);
  Free(*cache, s);  // the hit's holders, last block first

  // Uncached blocks go first; then the least recently freed cached block,
  // the chain's last one (freed first).
  const int32_t a = *cache->Allocate(), b = *cache->Allocate();
  EXPECT_FALSE(cache->cached(a));
  EXPECT_FALSE(cache->cached(b));
  EXPECT_EQ(cache->Walk(tokens, 2).size(), 2u);
  const int32_t c = *cache->Allocate();
  EXPECT_EQ(c, s.blocks[1]);
  EXPECT_EQ(cache->Walk(tokens, 2).size(), 1u);
  EXPECT_EQ(cache->entries(), 1);
  const int32_t d = *cache->Allocate();
  EXPECT_EQ(d, s.blocks[0]);
  EXPECT_TRUE(cache->Walk(tokens, 2).empty());
  EXPECT_EQ(cache->entries(), 0);
  EXPECT_FALSE(cache->Allocate().has_value());
}

TEST(PrefixCache, LeastRecentlyUsedPrefixIsEvictedFirst) {
  auto cache = MakeCache(4);
  const std::vector<int32_t> x = Iota(8, 0), y = Iota(8, 100);
  Seq sx = RunSequence(*cache, x);
  Seq sy = RunSequence(*cache, y);
  Free(*cache, sx);
  Free(*cache, sy);
  // Reuse x: it becomes the most recently freed.
  for (const auto& hit : cache->Walk(x, 2)) cache->Hold(hit.slots[0]);
  Free(*cache, sx);
  ASSERT_TRUE(cache->Allocate().has_value());
  ASSERT_TRUE(cache->Allocate().has_value());
  EXPECT_EQ(cache->Walk(x, 2).size(), 2u);
  EXPECT_TRUE(cache->Walk(y, 2).empty());
}

TEST(PrefixCache, RefreshMovesAFreeCachedBlockToTheRecentEnd) {
  auto cache = MakeCache(4);
  const std::vector<int32_t> x = Iota(4, 0), y = Iota(4, 100);
  Seq sx = RunSequence(*cache, x);
  Seq sy = RunSequence(*cache, y);
  const uint64_t x_key = cache->cached_key(sx.blocks[0]);
  ASSERT_NE(x_key, 0u);
  EXPECT_EQ(cache->cached_key(sy.blocks[0]), cache->Walk(y, 1)[0].link.key);
  cache->Refresh(sx.blocks[0], x_key);  // held: nothing to move
  EXPECT_EQ(cache->refcount(sx.blocks[0]), 1);
  Free(*cache, sx);
  Free(*cache, sy);
  cache->Refresh(sx.blocks[0], x_key + 1);  // another key: left alone
  cache->Refresh(sx.blocks[0], x_key);      // x is now the most recently freed
  EXPECT_EQ(cache->free_blocks(), 4);
  ASSERT_TRUE(cache->Allocate().has_value());
  ASSERT_TRUE(cache->Allocate().has_value());
  const int32_t evicted = *cache->Allocate();
  EXPECT_EQ(evicted, sy.blocks[0]);
  EXPECT_EQ(cache->cached_key(evicted), 0u);
  EXPECT_EQ(cache->Walk(x, 1).size(), 1u);
  EXPECT_TRUE(cache->Walk(y, 1).empty());
  // An evicted block that caches nothing now is not put back.
  cache->Release(evicted);
  cache->Refresh(evicted, x_key);
  EXPECT_FALSE(cache->cached(evicted));
}

TEST(PrefixCache, HashCollisionsAreNeverTrusted) {
  PrefixCacheOptions o;
  o.hash = [](uint64_t, absl::Span<const int32_t>) { return uint64_t{42}; };  // every key collides
  auto cache = MakeCache(8, 1, o);
  const std::vector<int32_t> x = Iota(4, 0), y = Iota(4, 100);
  Seq sx = RunSequence(*cache, x);
  EXPECT_EQ(cache->Walk(x, 1).size(), 1u);
  EXPECT_TRUE(cache->Walk(y, 1).empty());  // same key, other tokens: a miss
  // While x's block is held, y cannot take the key: its chain stops.
  Seq sy = RunSequence(*cache, y);
  EXPECT_TRUE(sy.chain.broken);
  EXPECT_TRUE(cache->Walk(y, 1).empty());
  EXPECT_EQ(cache->Walk(x, 1).size(), 1u);
  // Once nobody holds x's block, y's replaces it.
  Free(*cache, sx);
  Seq sy2 = RunSequence(*cache, y);
  EXPECT_FALSE(sy2.chain.broken);
  EXPECT_EQ(cache->Walk(y, 1).size(), 1u);
  EXPECT_TRUE(cache->Walk(x, 1).empty());
  EXPECT_EQ(cache->cached_free_blocks(), 0);
  // A chained collision: the second block of x has the key of its first block.
  Free(*cache, sy);
  Free(*cache, sy2);
  const std::vector<int32_t> xx = Iota(8, 0);
  Seq sxx = RunSequence(*cache, xx);
  EXPECT_EQ(cache->Walk(xx, 2).size(), 1u);
}

TEST(PrefixCache, MissingSlotsAreFilledByALaterSequence) {
  auto cache = MakeCache(16, 2);
  const std::vector<int32_t> tokens = Iota(4);
  PrefixCache::Chain first;
  const int32_t a = *cache->Allocate();
  cache->Extend(&first, tokens, [&](int64_t, std::vector<int32_t>* slots) { (*slots)[0] = a; });
  auto hits = cache->Walk(tokens, 1);
  ASSERT_EQ(hits.size(), 1u);
  EXPECT_EQ(hits[0].slots[1], -1);
  PrefixCache::Chain second;
  const int32_t b = *cache->Allocate(), c = *cache->Allocate();
  cache->Extend(&second, tokens, [&](int64_t, std::vector<int32_t>* slots) {
    (*slots)[0] = b;
    (*slots)[1] = c;
  });
  hits = cache->Walk(tokens, 1);
  ASSERT_EQ(hits.size(), 1u);
  EXPECT_EQ(hits[0].slots[0], a);  // the first registration stays
  EXPECT_EQ(hits[0].slots[1], c);
  EXPECT_FALSE(cache->cached(b));
  EXPECT_EQ(second.link.serial, first.link.serial);
}

TEST(PrefixCache, DisabledIsAPlainAllocator) {
  PrefixCacheOptions o;
  o.enabled = false;
  auto cache = MakeCache(4, 1, o);
  const std::vector<int32_t> tokens = Iota(8);
  Seq s = RunSequence(*cache, tokens);
  EXPECT_EQ(cache->entries(), 0);
  Free(*cache, s);
  EXPECT_TRUE(cache->Walk(tokens, 2).empty());
  EXPECT_EQ(cache->cached_free_blocks(), 0);
}

TEST(PrefixCache, PoolsHaveTheirOwnBlocksFreeListsAndLru) {
  PrefixCacheOptions o;
  o.pool_blocks = {2, 3};
  o.slot_pools = {0, 1};
  auto cache = MakeCache(0, /*slots=*/2, o);
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->num_pools(), 2);
  EXPECT_EQ(cache->free_blocks(), 5);
  // A token block of two slots: block 0 of pool 0 and block 0 of pool 1.
  const int32_t a0 = *cache->Allocate(0), a1 = *cache->Allocate(1);
  EXPECT_EQ(a0, 0);
  EXPECT_EQ(a1, 0);
  PrefixCache::Chain chain;
  cache->Extend(&chain, Iota(4), [&](int64_t, std::vector<int32_t>* slots) { *slots = {a0, a1}; });
  EXPECT_TRUE(cache->cached(a0, 0));
  EXPECT_TRUE(cache->cached(a1, 1));
  cache->Release(a1, 1);
  cache->Release(a0, 0);
  EXPECT_EQ(cache->cached_free_blocks(0), 1);
  EXPECT_EQ(cache->cached_free_blocks(1), 1);
  // Pool 0 runs dry first: its second allocation evicts its cached block;
  // pool 1's stays cached, so the entry keeps its pool-1 slot.
  EXPECT_EQ(*cache->Allocate(0), 1);
  EXPECT_EQ(*cache->Allocate(0), 0);
  EXPECT_FALSE(cache->Allocate(0).has_value());
  EXPECT_FALSE(cache->cached(0, 0));
  EXPECT_TRUE(cache->cached(0, 1));
  std::vector<PrefixCache::Hit> hits = cache->Walk(Iota(4), 1);
  ASSERT_EQ(hits.size(), 1u);
  EXPECT_EQ(hits[0].slots, (std::vector<int32_t>{-1, 0}));
  EXPECT_EQ(cache->free_blocks(0), 0);
  EXPECT_EQ(cache->free_blocks(1), 3);
  // A slot naming a pool that does not exist is refused.
  PrefixCacheOptions bad = o;
  bad.block_size = 4;
  bad.slots = 2;
  bad.slot_pools = {0, 2};
  EXPECT_EQ(PrefixCache::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace flotilla
