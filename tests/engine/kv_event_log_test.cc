// KvEventLog's reports, and the prefix cache's events that feed them.
#include "worker/engine/kv_event_log.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "common/prefix_hash.h"
#include "worker/engine/prefix_cache.h"

namespace flotilla {
namespace {

constexpr int kFull = static_cast<int>(KvGroupKind::kFullAttention);
constexpr int kWindow = static_cast<int>(KvGroupKind::kSlidingWindow);

std::vector<uint64_t> Sorted(std::vector<uint64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

KvEventLog ArmedLog(size_t max_pending, std::vector<uint64_t> full = {}) {
  KvEventLog log(max_pending);
  std::vector<uint64_t> held[kKvGroupKinds] = {std::move(full), {}};
  log.Resync(held);
  return log;
}

TEST(KvEventLog, RecordsNothingBeforeTheFirstResync) {
  KvEventLog log(16);
  EXPECT_FALSE(log.recording());
  EXPECT_TRUE(log.needs_snapshot());
  log.Record(KvGroupKind::kFullAttention, 5, true);
  std::vector<uint64_t> held[kKvGroupKinds] = {{1, 2}, {2}};
  log.Resync(held);
  KvEventBatch first = log.Take(100);
  EXPECT_TRUE(first.reset);
  EXPECT_EQ(Sorted(first.stored[kFull]), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(first.stored[kWindow], (std::vector<uint64_t>{2}));
  EXPECT_TRUE(log.Take(100).empty());  // key 5 came before recording started
}

TEST(KvEventLog, ChangesThatCancelOutAreNotSent) {
  KvEventLog log = ArmedLog(16, {7});
  (void)log.Take(100);
  log.Record(KvGroupKind::kFullAttention, 1, true);
  log.Record(KvGroupKind::kFullAttention, 1, false);  // stored and evicted: nothing
  log.Record(KvGroupKind::kFullAttention, 7, false);
  log.Record(KvGroupKind::kFullAttention, 7, true);   // evicted and stored again: nothing
  log.Record(KvGroupKind::kSlidingWindow, 7, false);
  log.Record(KvGroupKind::kFullAttention, 2, true);
  KvEventBatch batch = log.Take(100);
  EXPECT_FALSE(batch.reset);
  EXPECT_EQ(batch.stored[kFull], (std::vector<uint64_t>{2}));
  EXPECT_TRUE(batch.removed[kFull].empty());
  EXPECT_EQ(batch.removed[kWindow], (std::vector<uint64_t>{7}));
  EXPECT_TRUE(log.Take(100).empty());
}

TEST(KvEventLog, TakesAtMostMaxKeysAndKeepsTheRest) {
  KvEventLog log = ArmedLog(16);
  (void)log.Take(100);
  for (uint64_t key = 1; key <= 5; ++key) log.Record(KvGroupKind::kFullAttention, key, true);
  KvEventBatch a = log.Take(3);
  KvEventBatch b = log.Take(3);
  EXPECT_EQ(a.keys(), 3u);
  EXPECT_EQ(b.keys(), 2u);
  std::vector<uint64_t> all = a.stored[kFull];
  all.insert(all.end(), b.stored[kFull].begin(), b.stored[kFull].end());
  EXPECT_EQ(Sorted(all), (std::vector<uint64_t>{1, 2, 3, 4, 5}));
}

TEST(KvEventLog, ASnapshotSpansReportsAndChangesFollowIt) {
  KvEventLog log = ArmedLog(16, {1, 2, 3, 4, 5});
  log.Record(KvGroupKind::kFullAttention, 3, false);  // after the snapshot
  KvEventBatch a = log.Take(2);
  KvEventBatch b = log.Take(2);
  KvEventBatch c = log.Take(2);
  KvEventBatch d = log.Take(2);
  EXPECT_TRUE(a.reset);
  EXPECT_FALSE(b.reset);
  EXPECT_EQ(a.stored[kFull].size() + b.stored[kFull].size() + c.stored[kFull].size(), 5u);
  EXPECT_TRUE(c.removed[kFull].empty());  // no change in a report with snapshot keys
  EXPECT_EQ(d.removed[kFull], (std::vector<uint64_t>{3}));
}

TEST(KvEventLog, TooManyUnsentChangesBecomeAResync) {
  KvEventLog log = ArmedLog(3);
  (void)log.Take(100);
  for (uint64_t key = 1; key <= 4; ++key) log.Record(KvGroupKind::kFullAttention, key, true);
  EXPECT_FALSE(log.recording());
  EXPECT_TRUE(log.needs_snapshot());
}

// ---- the prefix cache's events ----

// Two slots per token block: slot 0 full attention, slot 1 sliding window.
std::unique_ptr<PrefixCache> TwoKindCache(int32_t blocks) {
  PrefixCacheOptions o;
  o.block_size = 4;
  o.num_blocks = blocks;
  o.slots = 2;
  o.window_slots = {false, true};
  auto cache = PrefixCache::Create(o);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return std::move(*cache);
}

TEST(PrefixCacheEvents, ReportsTheKeysTheCoordinatorComputes) {
  auto cache = TwoKindCache(8);
  EXPECT_TRUE(cache->TakeEvents(100).reset);  // starts recording
  std::vector<int32_t> tokens(8);
  std::iota(tokens.begin(), tokens.end(), 100);
  std::vector<int32_t> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(*cache->Allocate());
  PrefixCache::Chain chain;
  chain.link = PrefixCache::Root(9);
  cache->Extend(&chain, tokens, [&](int64_t block, std::vector<int32_t>* slots) {
    (*slots)[0] = blocks[2 * block];
    (*slots)[1] = blocks[2 * block + 1];
  });
  const std::vector<uint64_t> keys = PrefixBlockKeys(9, tokens, 4, 2);
  KvEventBatch stored = cache->TakeEvents(100);
  EXPECT_FALSE(stored.reset);
  EXPECT_EQ(Sorted(stored.stored[kFull]), Sorted(keys));
  EXPECT_EQ(Sorted(stored.stored[kWindow]), Sorted(keys));

  // The first block's window slot leaves the window, is freed and evicted:
  // the window kind loses it, the full kind keeps it.
  cache->Release(blocks[1]);
  EXPECT_TRUE(cache->TakeEvents(100).empty());  // freed but still cached
  for (int i = 0; i < 4; ++i) (void)cache->Allocate();  // the uncached free blocks
  (void)cache->Allocate();                               // evicts blocks[1]
  KvEventBatch evicted = cache->TakeEvents(100);
  EXPECT_TRUE(evicted.stored[kFull].empty());
  EXPECT_TRUE(evicted.removed[kFull].empty());
  EXPECT_EQ(evicted.removed[kWindow], (std::vector<uint64_t>{keys[0]}));
}

TEST(PrefixCacheEvents, AResyncListsWhatIsHeld) {
  auto cache = TwoKindCache(8);
  std::vector<int32_t> blocks = {*cache->Allocate(), *cache->Allocate()};
  PrefixCache::Chain chain;
  cache->Extend(&chain, std::vector<int32_t>{1, 2, 3, 4}, [&](int64_t, std::vector<int32_t>* slots) {
    (*slots)[0] = blocks[0];  // the window slot is not kept
  });
  KvEventBatch first = cache->TakeEvents(100);  // recording starts here, from a snapshot
  EXPECT_TRUE(first.reset);
  EXPECT_EQ(first.stored[kFull], PrefixBlockKeys(0, std::vector<int32_t>{1, 2, 3, 4}, 4, 1));
  EXPECT_TRUE(first.stored[kWindow].empty());
}

TEST(PrefixCacheEvents, ABlockWhoseParentWentIsReportedGone) {
  // One slot per block, 4 blocks: a chain of two, freed parent first, so the
  // parent is evicted while its child stays cached: the child can never be
  // matched again (a new parent gets a new serial) and is reported so.
  PrefixCacheOptions o;
  o.block_size = 4;
  o.num_blocks = 4;
  auto made = PrefixCache::Create(o);
  ASSERT_TRUE(made.ok());
  PrefixCache& cache = **made;
  (void)cache.TakeEvents(100);
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<int32_t> blocks = {*cache.Allocate(), *cache.Allocate()};
  PrefixCache::Chain chain;
  cache.Extend(&chain, tokens, [&](int64_t block, std::vector<int32_t>* slots) {
    (*slots)[0] = blocks[block];
  });
  const std::vector<uint64_t> keys = PrefixBlockKeys(0, tokens, 4, 2);
  EXPECT_EQ(Sorted(cache.TakeEvents(100).stored[kFull]), Sorted(keys));
  cache.Release(blocks[0]);
  cache.Release(blocks[1]);
  (void)cache.Allocate();
  (void)cache.Allocate();  // the free uncached blocks
  (void)cache.Allocate();  // evicts the parent
  EXPECT_EQ(cache.entries(), 1);
  EXPECT_EQ(Sorted(cache.TakeEvents(100).removed[kFull]), Sorted(keys));
  EXPECT_EQ(cache.Walk(tokens, 2).size(), 0u);
}

}  // namespace
}  // namespace flotilla
