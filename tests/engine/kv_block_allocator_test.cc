// KvBlockAllocator as the CUDA engine drives it: two layer groups (full and
// sliding), every new position of a step written (whole chunks).
#include "worker/engine/kv_block_allocator.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "tests/engine/consecutive_tokens.h"

namespace flotilla {
namespace {

constexpr int kFullGroup = 0, kSlidingGroup = 1;

// Window 8, 4-token blocks, chunks of up to 16 tokens.
KvBlockAllocatorOptions AllocatorOptions(int64_t blocks, bool prefix_cache = false) {
  KvBlockAllocatorOptions o;
  o.sliding = {false, true};
  o.window = 8;
  o.block_size = 4;
  o.first_block = 1;  // block 0 is the engine's scratch
  o.num_blocks = blocks;
  o.prefix_cache = prefix_cache;
  o.write_whole_chunk = true;
  o.max_chunk_tokens = 16;
  return o;
}

void FailOnCopy(int, int32_t, int32_t) { FAIL() << "no block is shared while written"; }

int64_t Sum(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t{0});
}

using testing_util::ConsecutiveTokens;

// Reserves and commits `tokens` as one step.
void Step(KvBlockAllocator& kv, KvBlockAllocator::SequenceId s, const std::vector<int32_t>& tokens) {
  ASSERT_TRUE(kv.Reserve(s, static_cast<int64_t>(tokens.size()), FailOnCopy).ok());
  ASSERT_TRUE(kv.Commit(s, static_cast<int64_t>(tokens.size()), tokens.data()).ok());
}

TEST(KvBlockAllocator, SlidingGroupHoldsAWholeChunkThenOnlyTheWindow) {
  auto kv = *KvBlockAllocator::Create(AllocatorOptions(64));
  auto s = kv->CreateSequence();
  // A 16-token chunk needs every one of its positions in both groups.
  EXPECT_EQ(Sum(*kv->BlocksNeeded(s, 16)), 4 + 4);
  ASSERT_TRUE(kv->Reserve(s, 16, FailOnCopy).ok());
  EXPECT_EQ(kv->BlocksHeld(s, kFullGroup), 4);
  EXPECT_EQ(kv->BlocksHeld(s, kSlidingGroup), 4);
  const std::vector<int32_t>& sliding = kv->Table(s, kSlidingGroup);
  for (int b = 0; b < 4; ++b) EXPECT_GE(sliding[b], 1) << "block 0 is never handed out";
  const std::vector<int32_t> t = ConsecutiveTokens(16);
  ASSERT_TRUE(kv->Commit(s, 16, t.data()).ok());
  // The next query (position 16) sees positions 9..16: blocks 2 and 3 stay.
  EXPECT_EQ(kv->KeepBegin(kSlidingGroup, 16), 9);
  EXPECT_EQ(kv->BlocksHeld(s, kFullGroup), 4);
  EXPECT_EQ(kv->BlocksHeld(s, kSlidingGroup), 2);
  EXPECT_EQ(kv->Table(s, kSlidingGroup)[0], -1);
  EXPECT_EQ(kv->Table(s, kSlidingGroup)[1], -1);
  EXPECT_EQ(kv->free_blocks(), 64 - 6);
  EXPECT_FALSE(kv->Keeps(kSlidingGroup, 16, 8));
  EXPECT_TRUE(kv->Keeps(kSlidingGroup, 16, 9));
  EXPECT_TRUE(kv->Keeps(kFullGroup, 16, 0));
}

TEST(KvBlockAllocator, DecodeKeepsTheSlidingGroupBoundedAndAdmissionCoversEveryStep) {
  auto kv = *KvBlockAllocator::Create(AllocatorOptions(256));
  auto s = kv->CreateSequence();
  Step(*kv, s, ConsecutiveTokens(13));
  for (int i = 0; i < 200; ++i) {
    const int64_t length = *kv->Length(s);
    ASSERT_TRUE(kv->Reserve(s, 1, FailOnCopy).ok());
    // What admission reserves for the final length covers what is held.
    const int64_t held = kv->BlocksHeld(s, kFullGroup) + kv->BlocksHeld(s, kSlidingGroup);
    EXPECT_LE(held, kv->BlocksForLength(length + 1)) << "at length " << length;
    EXPECT_LE(kv->BlocksHeld(s, kSlidingGroup), 3);  // 8 positions over at most 3 blocks
    const int32_t token = 7;
    ASSERT_TRUE(kv->Commit(s, 1, &token).ok());
  }
  EXPECT_EQ(kv->BlocksHeld(s, kFullGroup), (213 + 3) / 4);
  ASSERT_TRUE(kv->Free(s).ok());
  EXPECT_EQ(kv->free_blocks(), 256);
}

TEST(KvBlockAllocator, ChunkedPrefillStaysWithinTheAdmissionBound) {
  auto kv = *KvBlockAllocator::Create(AllocatorOptions(512));
  auto s = kv->CreateSequence();
  const int64_t total = 16 * 9 + 5;
  // A chunk's own blocks beyond the window come from the step reserve: 16
  // tokens of 4-token blocks.
  const int64_t reserve = kv->pool_blocks(0) - kv->admission_blocks(0);
  EXPECT_EQ(reserve, 4);
  for (int64_t done = 0; done < total;) {
    const int64_t n = std::min<int64_t>(16, total - done);
    ASSERT_TRUE(kv->Reserve(s, n, FailOnCopy).ok());
    const int64_t held = kv->BlocksHeld(s, kFullGroup) + kv->BlocksHeld(s, kSlidingGroup);
    EXPECT_LE(held, kv->BlocksForLength(total) + reserve);
    const std::vector<int32_t> t = ConsecutiveTokens(static_cast<int>(n), static_cast<int>(done));
    ASSERT_TRUE(kv->Commit(s, n, t.data()).ok());
    done += n;
  }
  // Full layers hold everything, sliding ones the window's blocks.
  EXPECT_EQ(kv->BlocksHeld(s, kFullGroup), (total + 3) / 4);
  EXPECT_LE(kv->BlocksHeld(s, kSlidingGroup), 3);
}

TEST(KvBlockAllocator, SlidingWindowMakesLongSequencesFit) {
  KvBlockAllocatorOptions all_full = AllocatorOptions(200);
  all_full.sliding = {false, false};
  const int64_t without = (*KvBlockAllocator::Create(all_full))->MaxTokens();
  const int64_t with = (*KvBlockAllocator::Create(AllocatorOptions(200)))->MaxTokens();
  // All full: no step reserve (nothing slides).
  EXPECT_EQ(without, 100 * 4);
  // The sliding group's bound: the window and what a chunk may straddle, 4
  // blocks; 4 more are the step reserve.
  EXPECT_EQ(with, (200 - 4 - 4) * 4);
}

TEST(KvBlockAllocator, PrefixMatchNeedsTheWindowOfTheSlidingGroup) {
  auto kv = *KvBlockAllocator::Create(AllocatorOptions(64, /*prefix_cache=*/true));
  const std::vector<int32_t> prompt = ConsecutiveTokens(16);
  auto a = kv->CreateSequence();
  Step(*kv, a, prompt);
  // Blocks 0 and 1 left a's window but stay cached while nothing evicts them.
  EXPECT_EQ(kv->BlocksHeld(a, kSlidingGroup), 2);
  std::vector<int32_t> longer = prompt;
  longer.push_back(1);
  EXPECT_EQ(kv->MatchPrefix(longer, 4), 4);
  ASSERT_TRUE(kv->Free(a).ok());
  EXPECT_EQ(kv->MatchPrefix(longer, 4), 4);
  auto b = *kv->CreateSequenceFromPrefix(prompt);
  EXPECT_EQ(*kv->Length(b), 16);
  EXPECT_EQ(kv->BlocksHeld(b, kFullGroup), 4);
  // Only the window before position 16 is taken: blocks 2 and 3.
  EXPECT_EQ(kv->BlocksHeld(b, kSlidingGroup), 2);
  EXPECT_EQ(kv->Table(b, kSlidingGroup)[1], -1);
  // b decodes on from there, writing only fresh blocks.
  for (int i = 0; i < 10; ++i) Step(*kv, b, {3});
  EXPECT_EQ(*kv->Length(b), 26);
}

TEST(KvBlockAllocator, PrefixWithAnEvictedWindowIsNotMatched) {
  // 12 blocks: a takes 4 full + 4 sliding during its step, keeps 6.
  auto kv = *KvBlockAllocator::Create(AllocatorOptions(12, /*prefix_cache=*/true));
  const std::vector<int32_t> prompt = ConsecutiveTokens(16);
  auto a = kv->CreateSequence();
  Step(*kv, a, prompt);
  // The full group's blocks stay held; the sliding window's last blocks
  // are evicted by another sequence's allocations.
  ASSERT_TRUE(kv->Free(a).ok());
  auto other = kv->CreateSequence();
  ASSERT_TRUE(kv->Reserve(other, 16, FailOnCopy).ok());  // 8 blocks: the uncached 4, then 4 cached
  std::vector<int32_t> longer = prompt;
  longer.push_back(1);
  const int64_t match = kv->MatchPrefix(longer, 4);
  EXPECT_LT(match, 4);
  if (match > 0) {
    auto c = kv->CreateSequenceFromPrefix(std::vector<int32_t>(prompt.begin(), prompt.begin() + match * 4));
    EXPECT_TRUE(c.ok()) << c.status();
  }
}

// A prompt longer than the window, then decoding on past it: the window
// before the prompt's end leaves the sliding group during decode. Once the
// sequence is freed, that window must stay cached as long as the prompt's
// full-group blocks, or no later request with the same prompt can hit.
TEST(KvBlockAllocator, PromptWindowLeftDuringDecodeIsEvictedNoSoonerThanItsFullBlocks) {
  // 14 blocks: a ends holding 7 full blocks and has used 7 sliding ones.
  auto kv = *KvBlockAllocator::Create(AllocatorOptions(14, /*prefix_cache=*/true));
  const std::vector<int32_t> prompt = ConsecutiveTokens(16);
  auto a = kv->CreateSequence();
  Step(*kv, a, prompt);
  std::vector<int32_t> history = prompt;
  for (int i = 0; i < 12; ++i) {
    const std::vector<int32_t> token = {static_cast<int32_t>(500 + i)};
    Step(*kv, a, token);
    history.push_back(token[0]);
  }
  // Decoding moved past the prompt: its window (blocks 2 and 3) left.
  EXPECT_EQ(kv->Table(a, kSlidingGroup)[2], -1);
  EXPECT_EQ(kv->Table(a, kSlidingGroup)[3], -1);
  ASSERT_TRUE(kv->Free(a).ok());
  EXPECT_EQ(kv->free_blocks(), 14);
  EXPECT_EQ(kv->prefix_cache().cached_free_blocks(), 14);

  // Another request needs 4 blocks: all are cached, so 4 are evicted. They
  // must be the end of a's history, not the prompt's window.
  auto other = kv->CreateSequence();
  Step(*kv, other, ConsecutiveTokens(8, 900));
  std::vector<int32_t> again = prompt;
  again.push_back(7);
  EXPECT_EQ(kv->MatchPrefix(again, 4), 4);
  history.push_back(7);
  EXPECT_EQ(kv->MatchPrefix(history, 7), 5);  // blocks 5 and 6 went
  auto b = kv->CreateSequenceFromPrefix(prompt);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(kv->BlocksHeld(*b, kFullGroup), 4);
  EXPECT_EQ(kv->BlocksHeld(*b, kSlidingGroup), 2);
}

// A sequence that started from a cached prefix refreshes, when freed, the
// prefix's sliding blocks it never took (those before its window) too.
TEST(KvBlockAllocator, PrefixHitRefreshesTheBlocksBeforeItsWindowWhenFreed) {
  auto kv = *KvBlockAllocator::Create(AllocatorOptions(12, /*prefix_cache=*/true));
  const std::vector<int32_t> prompt = ConsecutiveTokens(16);
  auto a = kv->CreateSequence();
  Step(*kv, a, prompt);
  ASSERT_TRUE(kv->Free(a).ok());
  // A short sequence of other tokens takes the 4 uncached blocks, then b
  // hits the prompt: blocks 0 and 1 of the sliding group stay in the
  // cache's LRU, untaken.
  auto other = kv->CreateSequence();
  Step(*kv, other, ConsecutiveTokens(8, 900));
  auto b = kv->CreateSequenceFromPrefix(prompt);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(kv->Table(*b, kSlidingGroup)[0], -1);
  EXPECT_EQ(kv->Table(*b, kSlidingGroup)[1], -1);
  ASSERT_TRUE(kv->Free(other).ok());
  ASSERT_TRUE(kv->Free(*b).ok());
  EXPECT_EQ(kv->prefix_cache().cached_free_blocks(), 12);
  // A request of 8 blocks evicts other's 4, then b's end (full and sliding
  // blocks 3 and 2): blocks 0 and 1 of both groups stay, so the first 2
  // blocks (whose window is blocks 0 and 1) still match.
  auto c = kv->CreateSequence();
  ASSERT_TRUE(kv->Reserve(c, 16, FailOnCopy).ok());
  std::vector<int32_t> again = prompt;
  again.push_back(7);
  EXPECT_EQ(kv->MatchPrefix(again, 4), 2);
}

TEST(KvBlockAllocator, OutOfBlocksChangesNothing) {
  auto kv = *KvBlockAllocator::Create(AllocatorOptions(6));
  auto s = kv->CreateSequence();
  const absl::Status st = kv->Reserve(s, 16, FailOnCopy);  // needs 8
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(kv->free_blocks(), 6);
  EXPECT_EQ(kv->BlocksHeld(s, kFullGroup), 0);
  EXPECT_EQ(*kv->Length(s), 0);
}

TEST(KvBlockAllocator, RejectsBadOptions) {
  KvBlockAllocatorOptions o = AllocatorOptions(8);
  o.max_chunk_tokens = 0;
  EXPECT_EQ(KvBlockAllocator::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = AllocatorOptions(8);
  o.window = 0;
  EXPECT_EQ(KvBlockAllocator::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = AllocatorOptions(0);
  EXPECT_EQ(KvBlockAllocator::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

// ---- a pool per group (the CUDA engine's layout) ----

// AllocatorOptions(…) with the full group in pool 0 of `full` blocks and the sliding
// group in pool 1 of `sliding` blocks.
KvBlockAllocatorOptions TwoPools(int64_t full, int64_t sliding, bool prefix_cache = false) {
  KvBlockAllocatorOptions o = AllocatorOptions(0, prefix_cache);
  o.group_pools = {0, 1};
  o.pool_blocks = {full, sliding};
  return o;
}

TEST(KvBlockAllocatorPools, EachGroupTakesItsOwnBlockIds) {
  auto kv = *KvBlockAllocator::Create(TwoPools(40, 12));
  EXPECT_EQ(kv->num_pools(), 2);
  EXPECT_STREQ(kv->pool_name(0), "full-attention");
  EXPECT_STREQ(kv->pool_name(1), "sliding-window");
  EXPECT_EQ(kv->num_blocks(), 52);
  // The step reserve is kept in the sliding pool only.
  EXPECT_EQ(kv->admission_blocks(0), 40);
  EXPECT_EQ(kv->admission_blocks(1), 12 - 4);
  auto s = kv->CreateSequence();
  EXPECT_EQ(*kv->BlocksNeeded(s, 16), (std::vector<int64_t>{4, 4}));
  Step(*kv, s, ConsecutiveTokens(16));
  // Both pools hand out their own low ids: the same numbers, other memory.
  EXPECT_EQ(kv->Table(s, kFullGroup), (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(kv->Table(s, kSlidingGroup), (std::vector<int32_t>{-1, -1, 3, 4}));
  EXPECT_EQ(kv->free_blocks(0), 40 - 4);
  EXPECT_EQ(kv->free_blocks(1), 12 - 2);
  EXPECT_EQ(kv->free_blocks(), 52 - 6);
  ASSERT_TRUE(kv->Free(s).ok());
  EXPECT_EQ(kv->free_blocks(0), 40);
  EXPECT_EQ(kv->free_blocks(1), 12);
}

TEST(KvBlockAllocatorPools, AShortPoolRefusesAndNamesItselfChangingNothing) {
  // Plenty of full blocks, but a 16-token chunk needs 4 sliding blocks of 3.
  auto kv = *KvBlockAllocator::Create(TwoPools(64, 7));
  auto a = kv->CreateSequence();
  Step(*kv, a, ConsecutiveTokens(12));  // holds 3 sliding blocks, keeps 2 (positions 5..11)
  EXPECT_EQ(kv->free_blocks(1), 5);
  auto b = kv->CreateSequence();
  Step(*kv, b, ConsecutiveTokens(8, 300));  // 2 sliding blocks, keeps 2
  EXPECT_EQ(kv->free_blocks(1), 3);
  auto c = kv->CreateSequence();
  const absl::Status st = kv->Reserve(c, 16, FailOnCopy);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("sliding-window"), std::string::npos) << st;
  EXPECT_EQ(kv->free_blocks(0), 64 - 3 - 2);
  EXPECT_EQ(kv->free_blocks(1), 3);
  EXPECT_EQ(kv->BlocksHeld(c, kFullGroup), 0);
}

TEST(KvBlockAllocatorPools, AdmissionAndMaxTokensCountEachPool) {
  auto kv = *KvBlockAllocator::Create(TwoPools(40, 12));
  // The full pool: every block; the sliding pool: the window's bound.
  EXPECT_EQ(kv->PoolBlocksForLength(6), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(kv->PoolBlocksForLength(100), (std::vector<int64_t>{25, 4}));
  EXPECT_EQ(kv->BlocksForLength(100), 29);
  // 40 full blocks of 4 tokens; the sliding pool is not the limit.
  EXPECT_EQ(kv->MaxTokens(), 160);
  // A sliding pool with no room beside its step reserve is refused.
  EXPECT_EQ(KvBlockAllocator::Create(TwoPools(40, 4)).status().code(),
            absl::StatusCode::kInvalidArgument);
  KvBlockAllocatorOptions bad = TwoPools(40, 12);
  bad.group_pools = {0};
  EXPECT_EQ(KvBlockAllocator::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.group_pools = {0, 2};
  EXPECT_EQ(KvBlockAllocator::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

// A probe of the smallest valid pools (what the CUDA engine builds to size
// its pools) answers what a sequence needs exactly as full-size pools do:
// with and without the prefix cache, for short and long sequences.
TEST(KvBlockAllocatorPools, TheSmallestValidPoolsAnswerAsFullSizeOnes) {
  for (bool prefix_cache : {false, true}) {
    KvBlockAllocatorOptions o = TwoPools(40, 12);
    o.prefix_cache = prefix_cache;
    const int64_t smallest = KvBlockAllocator::SmallestValidPool(o);
    EXPECT_EQ(smallest, 16 / 4 + 1);  // one past the sliding pool's step reserve
    o.pool_blocks = {smallest, smallest};
    auto probe = KvBlockAllocator::Create(o);
    ASSERT_TRUE(probe.ok()) << probe.status();
    o.pool_blocks = {1 << 20, 1 << 20};
    auto full = *KvBlockAllocator::Create(o);
    for (int64_t length : {1, 6, 100, 4096, 131072}) {
      EXPECT_EQ((*probe)->PoolBlocksForLength(length), full->PoolBlocksForLength(length)) << length;
    }
    for (int p = 0; p < full->num_pools(); ++p) {
      EXPECT_EQ((*probe)->pool_blocks(p) - (*probe)->admission_blocks(p),
                full->pool_blocks(p) - full->admission_blocks(p))
          << "the step reserve of pool " << p;
    }
    // One block fewer is refused.
    o.pool_blocks = {smallest - 1, smallest - 1};
    EXPECT_EQ(KvBlockAllocator::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  }
  KvBlockAllocatorOptions whole = TwoPools(40, 12);
  whole.write_whole_chunk = false;  // no step reserve: one block is a valid pool
  EXPECT_EQ(KvBlockAllocator::SmallestValidPool(whole), 1);
}

// What admission promises: sequences whose reservations fit every pool's
// admission_blocks never run out of blocks, whatever steps of at most
// max_chunk_tokens new tokens (over all of them) they run, prefill chunks
// and decode mixed.
TEST(KvBlockAllocatorPools, AdmittedSequencesNeverRunOutOfBlocksInAnyStep) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    auto kv = *KvBlockAllocator::Create(TwoPools(60, 4 * 6 + 4));
    std::mt19937 rng(seed);
    struct Seq {
      KvBlockAllocator::SequenceId id;
      int64_t length, target;
    };
    std::vector<Seq> seqs;
    std::vector<int64_t> reserved(2, 0);
    // Admit sequences of random final lengths while every pool has room.
    for (;;) {
      const int64_t target = std::uniform_int_distribution<int64_t>(1, 60)(rng);
      const std::vector<int64_t> need = kv->PoolBlocksForLength(target);
      if (reserved[0] + need[0] > kv->admission_blocks(0) ||
          reserved[1] + need[1] > kv->admission_blocks(1)) {
        break;
      }
      reserved[0] += need[0];
      reserved[1] += need[1];
      seqs.push_back({kv->CreateSequence(), 0, target});
    }
    ASSERT_GE(seqs.size(), 2u);
    for (bool work = true; work;) {
      // One step: random chunks of the unfinished sequences, 16 tokens in all.
      int64_t budget = 16;
      work = false;
      std::vector<std::pair<size_t, int64_t>> step;
      for (size_t i = 0; i < seqs.size() && budget > 0; ++i) {
        const int64_t left = seqs[i].target - seqs[i].length;
        if (left == 0) continue;
        const int64_t n = std::uniform_int_distribution<int64_t>(1, std::min(left, budget))(rng);
        budget -= n;
        step.emplace_back(i, n);
      }
      for (const auto& [i, n] : step) {
        const absl::Status st = kv->Reserve(seqs[i].id, n, FailOnCopy);
        ASSERT_TRUE(st.ok()) << "seed " << seed << ": " << st;
      }
      for (const auto& [i, n] : step) {
        const std::vector<int32_t> t =
            ConsecutiveTokens(static_cast<int>(n), 7 * static_cast<int>(i));
        ASSERT_TRUE(kv->Commit(seqs[i].id, n, t.data()).ok());
        seqs[i].length += n;
        work = true;
      }
    }
  }
}

TEST(KvBlockAllocatorPools, PrefixCacheEvictsEachPoolOnItsOwn) {
  // 8 full blocks; 40 sliding ones (36 beside the step reserve).
  auto kv = *KvBlockAllocator::Create(TwoPools(8, 40, /*prefix_cache=*/true));
  const std::vector<int32_t> prompt = ConsecutiveTokens(16);
  auto a = kv->CreateSequence();
  Step(*kv, a, prompt);
  ASSERT_TRUE(kv->Free(a).ok());
  std::vector<int32_t> longer = prompt;
  longer.push_back(1);
  EXPECT_EQ(kv->MatchPrefix(longer, 4), 4);
  EXPECT_EQ(kv->prefix_cache().cached_free_blocks(0), 4);
  EXPECT_EQ(kv->prefix_cache().cached_free_blocks(1), 4);
  // Another sequence takes the 4 uncached full blocks, then one more: the
  // full pool evicts the prompt's last block (the least recently freed);
  // the sliding pool has room and evicts nothing.
  auto other = kv->CreateSequence();
  Step(*kv, other, ConsecutiveTokens(16, 900));
  EXPECT_EQ(kv->MatchPrefix(longer, 4), 4);
  ASSERT_TRUE(kv->Reserve(other, 4, FailOnCopy).ok());
  EXPECT_EQ(kv->prefix_cache().cached_free_blocks(0), 3);
  EXPECT_EQ(kv->prefix_cache().cached_free_blocks(1), 4 + 2);  // a's and other's past window
  EXPECT_EQ(kv->MatchPrefix(longer, 4), 3);
  // A hit on the 3 blocks left takes them from each pool.
  auto c = kv->CreateSequenceFromPrefix(std::vector<int32_t>(prompt.begin(), prompt.begin() + 12));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(kv->BlocksHeld(*c, kFullGroup), 3);
  EXPECT_EQ(kv->BlocksHeld(*c, kSlidingGroup), 2);  // the window before position 12: blocks 1, 2
  EXPECT_EQ(kv->free_blocks(0), 0);
}

}  // namespace
}  // namespace flotilla
