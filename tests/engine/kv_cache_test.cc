#include "worker/engine/kv_cache.h"

#include <gtest/gtest.h>

#include <vector>

namespace flotilla {
namespace {

// Layers 0 and 2 slide (window 8), 1 and 3 are full; 4-token blocks.
KvCacheOptions CacheOptions(int64_t blocks) {
  KvCacheOptions o;
  o.sliding = {true, false, true, false};
  o.window = 8;
  o.kv_heads = 2;
  o.head_dim = 4;
  o.block_size = 4;
  o.num_blocks = blocks;
  return o;
}

// Appends n tokens whose K row is filled with `value + position`.
void Append(KvCache& kv, KvCache::SequenceId s, int64_t n, float value) {
  const int64_t len = *kv.Length(s);
  ASSERT_TRUE(kv.Reserve(s, n).ok());
  for (int layer = 0; layer < 4; ++layer) {
    for (int64_t p = len; p < len + n; ++p) {
      if (float* k = kv.KeyRow(s, layer, p)) {
        for (int i = 0; i < 8; ++i) k[i] = value + p;
        float* v = kv.ValueRow(s, layer, p);
        for (int i = 0; i < 8; ++i) v[i] = -(value + p);
      }
    }
  }
  ASSERT_TRUE(kv.Commit(s, n).ok());
}

float KeyAt(const KvCache& kv, KvCache::SequenceId s, int layer, int64_t p) {
  kernels::cpu::KvCacheView v = kv.View(s, layer);
  const float* blk = v.arena + v.block_table[p / v.block_size] * v.block_floats;
  return blk[(p % v.block_size) * 8];
}

TEST(KvCache, BlocksAreReusedAfterFree) {
  auto kv = *KvCache::Create(CacheOptions(64));
  auto a = kv->CreateSequence();
  Append(*kv, a, 20, 0);
  EXPECT_LT(kv->free_blocks(), 64);
  ASSERT_TRUE(kv->Free(a).ok());
  EXPECT_EQ(kv->free_blocks(), 64);
  EXPECT_FALSE(kv->Contains(a));
  // Everything can be taken again by another sequence.
  auto b = kv->CreateSequence();
  Append(*kv, b, 20, 100);
  EXPECT_EQ(KeyAt(*kv, b, 1, 3), 103);
  EXPECT_EQ(kv->Free(a).code(), absl::StatusCode::kNotFound);
}

TEST(KvCache, ForkSharesBlocksAndCopiesOnWrite) {
  auto kv = *KvCache::Create(CacheOptions(64));
  auto a = kv->CreateSequence();
  Append(*kv, a, 6, 0);  // the second block of each layer is half full
  const int64_t free_before = kv->free_blocks();
  auto b = *kv->Fork(a);
  EXPECT_EQ(kv->free_blocks(), free_before);  // nothing copied yet
  EXPECT_EQ(*kv->Length(b), 6);
  EXPECT_EQ(KeyAt(*kv, b, 1, 5), 5);
  Append(*kv, b, 1, 1000);  // writes position 6 into the shared block
  EXPECT_EQ(kv->free_blocks(), free_before - 4);  // one copy per layer
  EXPECT_EQ(KeyAt(*kv, b, 1, 6), 1006);
  EXPECT_EQ(KeyAt(*kv, b, 1, 5), 5);  // the copy kept the old rows
  Append(*kv, a, 1, 2000);
  EXPECT_EQ(KeyAt(*kv, a, 1, 6), 2006);  // a's own write, b unaffected
  EXPECT_EQ(KeyAt(*kv, b, 1, 6), 1006);
  ASSERT_TRUE(kv->Free(a).ok());
  ASSERT_TRUE(kv->Free(b).ok());
  EXPECT_EQ(kv->free_blocks(), 64);
}

TEST(KvCache, SlidingLayersHoldOnlyTheWindow) {
  auto kv = *KvCache::Create(CacheOptions(128));
  auto s = kv->CreateSequence();
  for (int i = 0; i < 100; ++i) {
    Append(*kv, s, 1, 0);
    EXPECT_LE(kv->BlocksHeld(s, 0), 3) << "after " << i + 1 << " tokens";
  }
  EXPECT_EQ(kv->BlocksHeld(s, 1), 25);  // full layer: 100 / 4
  // The sliding layer still has the last window - 1 positions.
  kernels::cpu::KvCacheView v = kv->View(s, 0);
  EXPECT_EQ(v.begin, 93);
  EXPECT_EQ(v.end, 100);
  for (int64_t p = 93; p < 100; ++p) EXPECT_EQ(KeyAt(*kv, s, 0, p), p);
  // A long chunk on a sliding layer writes only what stays in the window.
  auto t = kv->CreateSequence();
  Append(*kv, t, 50, 0);
  EXPECT_LE(kv->BlocksHeld(t, 2), 3);
  EXPECT_EQ(KeyAt(*kv, t, 2, 49), 49);
  EXPECT_EQ(kv->KeyRow(t, 2, 10), nullptr);
}

TEST(KvCache, OutOfBlocksIsAClearErrorThatChangesNothing) {
  auto kv = *KvCache::Create(CacheOptions(10));
  auto a = kv->CreateSequence();
  Append(*kv, a, 8, 0);  // 2 blocks per layer = 8 blocks
  const int64_t free_before = kv->free_blocks();
  absl::Status st = kv->Reserve(a, 8);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("out of blocks"), absl::string_view::npos) << st;
  EXPECT_EQ(kv->free_blocks(), free_before);
  EXPECT_EQ(*kv->Length(a), 8);
  EXPECT_FALSE(KvCache::Create(CacheOptions(0)).ok());
}

TEST(KvCache, CapacityBoundsAreConsistent) {
  auto kv = *KvCache::Create(CacheOptions(40));
  const int64_t max = kv->MaxTokens();
  EXPECT_LE(kv->BlocksForLength(max), 40);
  EXPECT_GT(kv->BlocksForLength(max + 1), 40);
  auto s = kv->CreateSequence();
  for (int64_t i = 0; i < max; ++i) Append(*kv, s, 1, 0);
  EXPECT_EQ(*kv->Length(s), max);
}

}  // namespace
}  // namespace flotilla
