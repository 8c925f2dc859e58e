// PrefixIndex: matches from KvEvents, and the same figures as a worker's own
// prefix cache (KvBlockAllocator::MatchPrefix) fed by the events it reports.
#include "coordinator/cluster/prefix_index.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <vector>

#include "common/prefix_hash.h"
#include "worker/engine/kv_block_allocator.h"
#include "worker/kv_events_report.h"

namespace flotilla::coordinator {
namespace {

constexpr int64_t kBlock = 16;

std::vector<int32_t> Tokens(int n, int32_t from = 1000) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

cluster::KvEvents EmptyEvents(bool reset, uint32_t dp_group = 0, int64_t window = 0) {
  cluster::KvEvents e;
  e.set_reset(reset);
  e.set_dp_group(dp_group);
  e.set_block_size(kBlock);
  e.set_sliding_window(static_cast<uint32_t>(window));
  return e;
}

cluster::KvGroupEvents* Group(cluster::KvEvents& e, cluster::KvGroupKind kind) {
  cluster::KvGroupEvents* g = e.add_groups();
  g->set_kind(kind);
  return g;
}

// Reports the first `blocks` blocks of `tokens` (domain `domain`) as held by
// the full-attention layers.
cluster::KvEvents StoredFull(const std::vector<int32_t>& tokens, int64_t blocks,
                             uint64_t domain = 0, bool reset = true, uint32_t dp_group = 0) {
  cluster::KvEvents e = EmptyEvents(reset, dp_group);
  for (uint64_t key : PrefixBlockKeys(domain, tokens, kBlock, blocks)) {
    Group(e, cluster::KV_GROUP_FULL_ATTENTION)->add_stored(key);
  }
  return e;
}

TEST(PrefixIndex, MatchesTheLeadingBlocksAnInstanceReported) {
  PrefixIndex index;
  const std::vector<int32_t> prompt = Tokens(100);
  ASSERT_TRUE(index.Apply(1, StoredFull(prompt, 3)).ok());
  EXPECT_EQ(index.MatchedTokens(1, 0, prompt), 3 * kBlock);
  EXPECT_EQ(index.MatchedTokens(2, 0, prompt), 0);  // reported nothing
  // Another prompt sharing two blocks.
  std::vector<int32_t> other = prompt;
  other[40] = 7;
  EXPECT_EQ(index.MatchedTokens(1, 0, other), 2 * kBlock);
  EXPECT_EQ(index.entries(), 3u);
}

TEST(PrefixIndex, TheLastPromptTokenIsAlwaysComputed) {
  PrefixIndex index;
  const std::vector<int32_t> prompt = Tokens(2 * kBlock);
  ASSERT_TRUE(index.Apply(1, StoredFull(prompt, 2)).ok());
  EXPECT_EQ(index.MatchedTokens(1, 0, prompt), kBlock);
  EXPECT_EQ(index.MatchedTokens(1, 0, Tokens(2 * kBlock + 1)), 2 * kBlock);
  EXPECT_EQ(index.MatchedTokens(1, 0, Tokens(1)), 0);
}

TEST(PrefixIndex, CacheDomainsDoNotShare) {
  PrefixIndex index;
  const std::vector<int32_t> prompt = Tokens(100);
  ASSERT_TRUE(index.Apply(1, StoredFull(prompt, 4, /*domain=*/77)).ok());
  EXPECT_EQ(index.MatchedTokens(1, 77, prompt), 4 * kBlock);
  EXPECT_EQ(index.MatchedTokens(1, 0, prompt), 0);
  EXPECT_EQ(index.MatchedTokens(1, 78, prompt), 0);
}

TEST(PrefixIndex, AnEvictedBlockEndsTheMatch) {
  PrefixIndex index;
  const std::vector<int32_t> prompt = Tokens(100);
  ASSERT_TRUE(index.Apply(1, StoredFull(prompt, 5)).ok());
  cluster::KvEvents removed = EmptyEvents(false);
  Group(removed, cluster::KV_GROUP_FULL_ATTENTION)
      ->add_removed(PrefixBlockKeys(0, prompt, kBlock, 5)[2]);
  ASSERT_TRUE(index.Apply(1, removed).ok());
  EXPECT_EQ(index.MatchedTokens(1, 0, prompt), 2 * kBlock);
  EXPECT_EQ(index.entries(), 4u);
}

TEST(PrefixIndex, SlidingLayersNeedOnlyTheWindowBeforeTheEnd) {
  // A window of 32 tokens: a match of k blocks needs the window kind for
  // blocks [(16k - 31) / 16, k), i.e. the last two.
  PrefixIndex index;
  const std::vector<int32_t> prompt = Tokens(5 * kBlock + 1);
  const std::vector<uint64_t> keys = PrefixBlockKeys(0, prompt, kBlock, 5);
  cluster::KvEvents e = EmptyEvents(true, 0, /*window=*/32);
  cluster::KvGroupEvents* full = Group(e, cluster::KV_GROUP_FULL_ATTENTION);
  cluster::KvGroupEvents* window = Group(e, cluster::KV_GROUP_SLIDING_WINDOW);
  for (uint64_t key : keys) full->add_stored(key);
  window->add_stored(keys[2]);
  window->add_stored(keys[3]);
  ASSERT_TRUE(index.Apply(1, e).ok());
  EXPECT_EQ(index.MatchedTokens(1, 0, prompt), 4 * kBlock);  // block 4's window part is gone

  cluster::KvEvents lost = EmptyEvents(false, 0, 32);
  Group(lost, cluster::KV_GROUP_SLIDING_WINDOW)->add_removed(keys[2]);
  ASSERT_TRUE(index.Apply(1, lost).ok());
  EXPECT_EQ(index.MatchedTokens(1, 0, prompt), 0);  // no match has its window now
}

TEST(PrefixIndex, AResetReplacesWhatTheGroupReported) {
  PrefixIndex index;
  const std::vector<int32_t> a = Tokens(100, 0), b = Tokens(100, 5000);
  ASSERT_TRUE(index.Apply(1, StoredFull(a, 4)).ok());
  ASSERT_TRUE(index.Apply(1, StoredFull(b, 2)).ok());  // reset: a is gone
  EXPECT_EQ(index.MatchedTokens(1, 0, a), 0);
  EXPECT_EQ(index.MatchedTokens(1, 0, b), 2 * kBlock);
  EXPECT_EQ(index.entries(), 2u);
}

TEST(PrefixIndex, AnInstanceMatchesItsBestDpGroup) {
  PrefixIndex index;
  const std::vector<int32_t> prompt = Tokens(100);
  ASSERT_TRUE(index.Apply(1, StoredFull(prompt, 2, 0, true, /*dp_group=*/0)).ok());
  ASSERT_TRUE(index.Apply(1, StoredFull(prompt, 5, 0, true, /*dp_group=*/1)).ok());
  ASSERT_TRUE(index.Apply(2, StoredFull(prompt, 1)).ok());
  EXPECT_EQ(index.MatchedTokens(1, 0, prompt), 5 * kBlock);
  const std::map<int, int64_t> all = index.MatchedTokensByInstance(0, prompt);
  EXPECT_EQ(all, (std::map<int, int64_t>{{1, 5 * kBlock}, {2, kBlock}}));
  // Group 0's reset leaves group 1's blocks alone.
  ASSERT_TRUE(index.Apply(1, EmptyEvents(true, 0)).ok());
  EXPECT_EQ(index.MatchedTokens(1, 0, prompt), 5 * kBlock);
}

TEST(PrefixIndex, ForgetDropsAnInstance) {
  PrefixIndex index;
  const std::vector<int32_t> prompt = Tokens(100);
  ASSERT_TRUE(index.Apply(1, StoredFull(prompt, 3, 0, true, 0)).ok());
  ASSERT_TRUE(index.Apply(1, StoredFull(prompt, 3, 0, true, 1)).ok());
  ASSERT_TRUE(index.Apply(2, StoredFull(prompt, 3)).ok());
  index.Forget(1);
  EXPECT_EQ(index.MatchedTokens(1, 0, prompt), 0);
  EXPECT_EQ(index.MatchedTokens(2, 0, prompt), 3 * kBlock);
  EXPECT_EQ(index.entries(), 3u);
}

TEST(PrefixIndex, KeepsAtMostMaxEntriesDroppingTheOldest) {
  PrefixIndex index(/*max_entries=*/4);
  const std::vector<int32_t> a = Tokens(100, 0), b = Tokens(100, 5000);
  ASSERT_TRUE(index.Apply(1, StoredFull(a, 3)).ok());
  ASSERT_TRUE(index.Apply(2, StoredFull(b, 3)).ok());
  EXPECT_EQ(index.entries(), 4u);
  EXPECT_EQ(index.MatchedTokens(1, 0, a), 0);  // a's first two blocks went first
  EXPECT_EQ(index.MatchedTokens(2, 0, b), 3 * kBlock);
}

TEST(PrefixIndex, RefusesAKindItDoesNotKnowByName) {
  PrefixIndex index;
  cluster::KvEvents e = EmptyEvents(true);
  Group(e, cluster::KV_GROUP_KIND_UNSPECIFIED)->add_stored(1);
  absl::Status st = index.Apply(1, e);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("KV_GROUP_KIND_UNSPECIFIED"), std::string::npos) << st;
  e.mutable_groups(0)->set_kind(static_cast<cluster::KvGroupKind>(9));
  st = index.Apply(1, e);
  EXPECT_NE(st.message().find("kind 9"), std::string::npos) << st;
  cluster::KvEvents no_size = StoredFull(Tokens(40), 1);
  no_size.set_block_size(0);
  EXPECT_EQ(index.Apply(1, no_size).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(index.entries(), 0u);
}

// ---- against the worker's prefix cache ----

// A worker's KV blocks (one full-attention and one sliding-window group, as
// the CUDA engine keeps them) running random conversations over a few shared
// system prompts, small enough that blocks are evicted all the time; after
// every sequence its reports go to the index, which must then find exactly
// the prefix the worker would reuse, for every prompt. Both layouts: one
// pool of blocks for both groups, and a pool per group (each evicting on its
// own, as the CUDA engine's pools do).
void RunConversationsAgainstTheIndex(const std::vector<int64_t>& pool_blocks) {
  KvBlockAllocatorOptions o;
  o.sliding = {false, true};
  o.window = 24;
  o.block_size = 4;
  o.pool_blocks = pool_blocks;
  if (pool_blocks.size() == 2) o.group_pools = {0, 1};
  o.prefix_cache = true;
  auto kv = KvBlockAllocator::Create(o);
  ASSERT_TRUE(kv.ok()) << kv.status();
  KvBlockAllocator& blocks = **kv;
  PrefixIndex index;
  auto report = [&] {
    for (;;) {
      const KvEventBatch batch = blocks.TakeEvents(/*max_keys=*/7);  // several reports
      if (batch.empty()) return;
      ASSERT_TRUE(index.Apply(3, worker::KvEventsMessage(batch, 0)).ok());
    }
  };
  report();
  std::mt19937_64 rng(7);
  std::vector<std::vector<int32_t>> system(4);
  for (size_t i = 0; i < system.size(); ++i) system[i] = Tokens(20 + 6 * i, 100 * i);
  auto random_prompt = [&] {
    std::vector<int32_t> p = system[rng() % system.size()];
    const int extra = static_cast<int>(rng() % 30);
    for (int i = 0; i < extra; ++i) p.push_back(static_cast<int32_t>(rng() % 3));
    return p;
  };
  int matched_somewhere = 0;
  for (int round = 0; round < 300; ++round) {
    const uint64_t domain = rng() % 2;
    const std::vector<int32_t> prompt = random_prompt();
    const int64_t max_blocks = (static_cast<int64_t>(prompt.size()) - 1) / o.block_size;
    const int64_t cached = blocks.MatchPrefix(prompt, max_blocks, domain) * o.block_size;
    ASSERT_EQ(index.MatchedTokens(3, domain, prompt), cached) << "round " << round;
    matched_somewhere += cached > 0;
    // Run it: the cached prefix, then the rest in chunks, then a few outputs.
    auto seq = blocks.CreateSequenceFromPrefix(
        absl::MakeConstSpan(prompt).subspan(0, static_cast<size_t>(cached)), domain);
    ASSERT_TRUE(seq.ok()) << seq.status();
    std::vector<int32_t> rest(prompt.begin() + cached, prompt.end());
    for (int i = 0; i < 5; ++i) rest.push_back(static_cast<int32_t>(rng() % 3));
    bool fits = true;
    for (size_t at = 0; at < rest.size() && fits;) {
      const size_t n = std::min<size_t>(rest.size() - at, 1 + rng() % 9);
      fits = blocks.Reserve(*seq, static_cast<int64_t>(n), [](int, int32_t, int32_t) {}).ok();
      if (fits) {
        ASSERT_TRUE(blocks.Commit(*seq, static_cast<int64_t>(n), &rest[at]).ok());
      }
      at += n;
    }
    ASSERT_TRUE(blocks.Free(*seq).ok());
    report();
  }
  EXPECT_GT(matched_somewhere, 50);  // the test exercised real hits
}

TEST(PrefixIndex, AgreesWithTheWorkersPrefixCache) { RunConversationsAgainstTheIndex({96}); }

TEST(PrefixIndex, AgreesWithTheWorkersPrefixCacheWithAPoolPerGroup) {
  RunConversationsAgainstTheIndex({56, 40});
}

}  // namespace
}  // namespace flotilla::coordinator
