// The host-memory KV tier: KvHostTier's bounded LRU, KvBlockAllocator
// restoring a prefix from it with the CUDA engine's pools, and the CPU engine
// serving a prompt whose cached blocks its arena evicted from the copies the
// tier kept, with the tokens and logits of a run that computed everything.
#include "worker/engine/kv_host_tier.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "tests/engine/consecutive_tokens.h"
#include "tests/engine/logit_diff.h"
#include "tests/engine/multi_turn.h"
#include "worker/engine/cpu_engine.h"
#include "worker/engine/kv_block_allocator.h"
#include "worker/model/synthetic_weights.h"

namespace flotilla {
namespace {

using testing_util::ConsecutiveTokens;

TEST(KvHostTier, KeepsAtMostItsSlotsAndEvictsTheLeastRecentlyUsed) {
  std::vector<uint8_t> arena(3 * 8);
  KvHostTier tier(arena.data(), 8, 3);
  const std::vector<int32_t> t = ConsecutiveTokens(4, 0);
  for (uint64_t key = 1; key <= 3; ++key) {
    uint8_t* slot = tier.Store(key, 0, 0, t, 8);
    ASSERT_NE(slot, nullptr);
    std::fill(slot, slot + 8, static_cast<uint8_t>(key));
  }
  // Key 1 is used, so key 2 is the least recently used when key 4 comes.
  ASSERT_NE(tier.Load(1, 0, 0, t), nullptr);
  ASSERT_NE(tier.Store(4, 0, 0, t, 8), nullptr);
  EXPECT_TRUE(tier.Contains(1, 0, 0, t));
  EXPECT_FALSE(tier.Contains(2, 0, 0, t));
  EXPECT_TRUE(tier.Contains(3, 0, 0, t));
  EXPECT_EQ(tier.Load(3, 0, 0, t)[0], 3);
  EXPECT_EQ(tier.stats().used_bytes, 3 * 8);
  EXPECT_EQ(tier.stats().capacity_bytes, 3 * 8);
  EXPECT_EQ(tier.stats().evicted_blocks, 1);
  EXPECT_EQ(tier.stats().stored_blocks, 4);
  EXPECT_EQ(tier.stats().hit_blocks, 2);
  EXPECT_EQ(tier.stats().bytes_to_host, 4 * 8);
  EXPECT_EQ(tier.stats().bytes_to_device, 2 * 8);
  // Storing what it holds only refreshes it; a block larger than a slot,
  // or anything while frozen, is not kept.
  EXPECT_EQ(tier.Store(3, 0, 0, t, 8), nullptr);
  EXPECT_EQ(tier.Store(5, 0, 0, t, 9), nullptr);
  tier.Freeze(true);
  EXPECT_EQ(tier.Store(6, 0, 0, t, 8), nullptr);
  tier.Freeze(false);
  EXPECT_EQ(tier.stats().stored_blocks, 4);
}

TEST(KvHostTier, AKeyWithOtherTokensOrAnotherParentOrGroupIsAMiss) {
  std::vector<uint8_t> arena(2 * 4);
  KvHostTier tier(arena.data(), 4, 2);
  ASSERT_NE(tier.Store(7, 1, 70, ConsecutiveTokens(4, 0), 4), nullptr);
  EXPECT_TRUE(tier.Contains(7, 1, 70, ConsecutiveTokens(4, 0)));
  EXPECT_FALSE(tier.Contains(7, 1, 70, ConsecutiveTokens(4, 1)));
  EXPECT_FALSE(tier.Contains(7, 1, 71, ConsecutiveTokens(4, 0)));
  EXPECT_FALSE(tier.Contains(7, 0, 70, ConsecutiveTokens(4, 0)));
  EXPECT_EQ(tier.Load(7, 1, 70, ConsecutiveTokens(4, 1)), nullptr);
}

// ---- KvBlockAllocator with a tier, as the CUDA engine drives it ----

// A device arena holding one tag per block of each group; the mover copies
// tags to and from the host tier.
class TagArena final : public KvBlockMover {
 public:
  TagArena(int groups, int64_t blocks) : tags_(groups, std::vector<uint64_t>(blocks + 1, 0)) {}
  size_t BlockBytes(int) const override { return sizeof(uint64_t); }
  void ToHost(int group, int32_t block, uint8_t* host) override {
    std::memcpy(host, &tags_[group][block], sizeof(uint64_t));
  }
  void ToDevice(int group, int32_t block, const uint8_t* host) override {
    std::memcpy(&tags_[group][block], host, sizeof(uint64_t));
  }
  uint64_t& tag(int group, int32_t block) { return tags_[group][block]; }

 private:
  std::vector<std::vector<uint64_t>> tags_;
};

// What the steps of prompt `seed` write into logical block b of `group`.
uint64_t Tag(uint32_t seed, int group, int64_t b) {
  return (uint64_t{seed} << 32) | static_cast<uint64_t>(b << 1) | static_cast<uint64_t>(group);
}

// testing::RunTurn on the allocator alone, as the CUDA engine drives it: the
// cached prefix (whole blocks, short of the last token), the rest in chunks
// of `chunk` tokens, then 5 decoded tokens; every block a step reserves gets
// the prompt's tag. The blocks taken from the cache must hold their tags.
// Returns the cached length.
int64_t RunTaggedPrompt(KvBlockAllocator& kv, TagArena& arena, const std::vector<int32_t>& prompt,
                        uint32_t seed, int64_t chunk) {
  const int64_t bs = kv.options().block_size;
  const int64_t n = static_cast<int64_t>(prompt.size());
  const int64_t cached = kv.MatchPrefix(prompt, (n - 1) / bs) * bs;
  auto seq = kv.CreateSequenceFromPrefix({prompt.data(), static_cast<size_t>(cached)});
  EXPECT_TRUE(seq.ok()) << "CreateSequenceFromPrefix(" << cached << " tokens): " << seq.status();
  if (!seq.ok()) return cached;
  for (int g = 0; g < 2; ++g) {
    const std::vector<int32_t>& table = kv.Table(*seq, g);
    for (size_t b = 0; b < table.size(); ++b) {
      if (table[b] >= 0) {
        EXPECT_EQ(arena.tag(g, table[b]), Tag(seed, g, b)) << "group " << g << " block " << b;
      }
    }
  }
  auto step = [&](const int32_t* tokens, int64_t count) {
    const absl::Status reserved =
        kv.Reserve(*seq, count, [](int, int32_t, int32_t) { FAIL() << "no block is shared"; });
    ASSERT_TRUE(reserved.ok()) << reserved;
    for (int g = 0; g < 2; ++g) {
      const std::vector<int32_t>& table = kv.Table(*seq, g);
      for (size_t b = 0; b < table.size(); ++b) {
        if (table[b] >= 0) arena.tag(g, table[b]) = Tag(seed, g, b);
      }
    }
    ASSERT_TRUE(kv.Commit(*seq, count, tokens).ok());
  };
  for (int64_t b = cached; b < n; b += chunk) step(prompt.data() + b, std::min(chunk, n - b));
  for (int32_t t = 3; t < 8; ++t) step(&t, 1);
  EXPECT_TRUE(kv.Free(*seq).ok());
  return cached;
}

TEST(KvBlockAllocatorHostTier, APrefixComesBackWhileThePoolsEvictTheBlocksBeforeItsWindow) {
  // The CUDA engine's arena in cuda_host_tier_test: a full-attention and a
  // sliding-window pool of 14 blocks each (block 0 is scratch), 16-token
  // blocks, a window of 32, steps of up to 64 tokens.
  constexpr int64_t kPool = 14;
  KvBlockAllocatorOptions o;
  o.sliding = {false, true};
  o.window = 32;
  o.block_size = 16;
  o.first_block = 1;
  o.group_pools = {0, 1};
  o.pool_blocks = {kPool, kPool};
  o.prefix_cache = true;
  o.write_whole_chunk = true;
  o.max_chunk_tokens = 64;
  std::vector<uint8_t> host(sizeof(uint64_t) * 256);
  KvHostTier tier(host.data(), sizeof(uint64_t), 256);
  TagArena arena(2, kPool);
  o.host_tier = &tier;
  o.mover = &arena;
  auto kv = KvBlockAllocator::Create(o);
  ASSERT_TRUE(kv.ok()) << kv.status();
  const std::vector<int32_t> prompt = testing::TurnTokens(200, 5, 1024);
  const std::vector<int32_t> other = testing::TurnTokens(200, 77, 1024);
  EXPECT_EQ(RunTaggedPrompt(**kv, arena, prompt, 5, 64), 0);
  EXPECT_EQ(RunTaggedPrompt(**kv, arena, other, 77, 64), 0);
  EXPECT_GT(tier.stats().stored_blocks, 0);
  // The prompt's first block is still in the pools (its sliding block too,
  // though the sequence does not take it: it is before the window); the
  // rest comes from the tier, and the allocations that copy it back evict
  // that sliding block. Before the fix the restore registered its id, now
  // another token block's, under the first block, and the prefix failed.
  EXPECT_EQ(RunTaggedPrompt(**kv, arena, prompt, 5, 64), 192);
  EXPECT_GT(tier.stats().hit_blocks, 0);
  // Every block the index keeps for the prompt holds that block's KV.
  const std::vector<PrefixCache::Hit> hits = (*kv)->prefix_cache().Walk(prompt, 12);
  EXPECT_EQ(hits.size(), 12u);
  for (size_t b = 0; b < hits.size(); ++b) {
    for (int g = 0; g < 2; ++g) {
      const int32_t block = hits[b].slots[g];
      if (block < 0) continue;
      EXPECT_EQ(arena.tag(g, block), Tag(5, g, b)) << "group " << g << " block " << b;
    }
  }
  EXPECT_EQ((*kv)->free_blocks(), 2 * kPool);
}

// ---- the CPU engine ----

constexpr int64_t kBlockSize = 4;
constexpr int64_t kWindowTokens = 8;

ModelConfig Config() {
  ModelConfig c = ModelConfig::Tiny();
  c.sliding_window = kWindowTokens;
  return c;
}

// Bytes of one layer's block in the CPU engine's f32 arena.
int64_t LayerBlockBytes(const ModelConfig& c) {
  return 2 * kBlockSize * c.num_key_value_heads * c.head_dim * static_cast<int64_t>(sizeof(float));
}

std::unique_ptr<CpuEngine> MakeEngine(kernels::cpu::ThreadPool* pool, int64_t blocks,
                                      bool prefix_cache, int64_t host_bytes) {
  auto w = MakeSyntheticWeights(Config(), 3);
  EXPECT_TRUE(w.ok()) << w.status();
  CpuEngineOptions o;
  o.kv_block_size = kBlockSize;
  o.kv_num_blocks = blocks;
  o.prefix_cache = prefix_cache;
  o.kv_host_cache_bytes = host_bytes;
  auto e = CpuEngine::Create(std::move(*w), o, pool);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(*e);
}

struct HostTierRun {
  testing::TurnResult cold;   // every token computed, no cache
  testing::TurnResult first;  // the prompt's first run on the cached engine
  testing::TurnResult again;  // after another prompt took the whole arena
  KvHostTierStats stats;      // the cached engine's tier at the end
};

// The prompt once on an engine without a cache, then twice on one whose
// arena holds one such sequence, with an unrelated prompt that needs the
// whole arena in between.
HostTierRun RunEvictedPrompt(int64_t host_bytes) {
  kernels::cpu::ThreadPool pool(2);
  const ModelConfig c = Config();
  testing::MultiTurnOptions o;
  o.generate = 6;
  o.prefill_chunk = 16;
  const std::vector<int32_t> prompt = testing::TurnTokens(61, 5, 1024);
  const int64_t length = static_cast<int64_t>(prompt.size()) + o.generate;
  const int64_t blocks = CpuEngine::KvBlocksFor(c, c.num_key_value_heads, kBlockSize, 1, length);
  HostTierRun r;
  auto cold = MakeEngine(&pool, blocks, false, 0);
  r.cold = testing::RunTurn(*cold, prompt, o);
  auto cached = MakeEngine(&pool, blocks, true, host_bytes);
  r.first = testing::RunTurn(*cached, prompt, o);
  testing::RunTurn(*cached, testing::TurnTokens(static_cast<int>(length - o.generate), 77, 1024),
                   o);
  r.again = testing::RunTurn(*cached, prompt, o);
  r.stats = cached->KvHostStats();
  return r;
}

void ExpectSameAsCold(const testing::TurnResult& run, const testing::TurnResult& cold) {
  EXPECT_EQ(run.tokens, cold.tokens);
  ASSERT_EQ(run.logits.size(), cold.logits.size());
  for (size_t i = 0; i < run.logits.size(); ++i) {
    EXPECT_LE(testing_golden::MaxAbsDiff(run.logits[i], cold.logits[i]), 1e-4) << "token " << i;
  }
}

TEST(CpuEngineHostTier, AnEvictedPromptIsServedFromTheHostTier) {
  const ModelConfig c = Config();
  // Room for every block the arena evicts.
  const HostTierRun r = RunEvictedPrompt(LayerBlockBytes(c) * c.num_hidden_layers * 40);
  EXPECT_EQ(r.first.cached, 0);
  // 61 tokens: 15 whole blocks, all but the last token cached; the blocks
  // came back from the host tier, none was computed again.
  EXPECT_EQ(r.again.cached, 60);
  EXPECT_EQ(r.again.computed, 1 + 5);
  EXPECT_GT(r.stats.hit_blocks, 0);
  EXPECT_EQ(r.stats.bytes_to_device, r.stats.hit_blocks * LayerBlockBytes(c));
  EXPECT_GT(r.stats.bytes_to_host, 0);
  ExpectSameAsCold(r.again, r.cold);
  ExpectSameAsCold(r.first, r.cold);
}

TEST(CpuEngineHostTier, WithoutTheTierTheEvictedPromptIsComputedAgain) {
  const HostTierRun r = RunEvictedPrompt(0);
  // Only what the other prompt left in the arena (its first blocks, freed
  // last, go last) is found.
  EXPECT_LT(r.again.cached, 60);
  EXPECT_EQ(r.stats.hit_blocks, 0);
  EXPECT_EQ(r.stats.capacity_bytes, 0);
  ExpectSameAsCold(r.again, r.cold);
}

TEST(CpuEngineHostTier, ASmallTierStaysWithinItsBytesAndEvictsItsOldest) {
  const ModelConfig c = Config();
  // Room for 5 token blocks of every layer: the tier keeps only the blocks
  // the arena evicted last.
  const int64_t capacity = LayerBlockBytes(c) * c.num_hidden_layers * 5;
  const HostTierRun r = RunEvictedPrompt(capacity);
  EXPECT_EQ(r.stats.capacity_bytes, capacity);
  EXPECT_LE(r.stats.used_bytes, capacity);
  EXPECT_GT(r.stats.evicted_blocks, 0);
  // Only part of the prompt is found; the tokens are those of the cold run.
  EXPECT_LT(r.again.cached, 60);
  ExpectSameAsCold(r.again, r.cold);
}

}  // namespace
}  // namespace flotilla
