// StepLayout: the host side of a CUDA engine step (rows, positions, KV
// slots and block tables per group, logit rows, graph padding), checked
// on the CPU against a KvBlockAllocator as the engine drives it.
#include "worker/engine/step_layout.h"

#include <gtest/gtest.h>

#include <vector>

#include "tests/engine/consecutive_tokens.h"

namespace flotilla {
namespace {

constexpr int kBlock = 4, kMaxTokens = 32, kMaxSeqs = 8, kLogitRows = 64;
constexpr int64_t kMaxBlocks = 8;

// Two groups (full, sliding window 8), 4-token blocks, block 0 scratch.
std::unique_ptr<KvBlockAllocator> Allocator() {
  KvBlockAllocatorOptions o;
  o.sliding = {false, true};
  o.window = 8;
  o.block_size = kBlock;
  o.first_block = 1;
  o.num_blocks = 64;
  o.write_whole_chunk = true;
  o.max_chunk_tokens = 16;
  return *KvBlockAllocator::Create(o);
}

using testing_util::ConsecutiveTokens;

void IgnoreCopy(int, int32_t, int32_t) {}

// A sequence that already holds `length` tokens.
int64_t SequenceOf(KvBlockAllocator& kv, int length) {
  const int64_t s = kv.CreateSequence();
  if (length > 0) {
    const std::vector<int32_t> t = ConsecutiveTokens(length, 500);
    EXPECT_TRUE(kv.Reserve(s, length, IgnoreCopy).ok());
    EXPECT_TRUE(kv.Commit(s, length, t.data()).ok());
  }
  return s;
}

StepItem Item(int64_t sequence, std::vector<int32_t> tokens, LogitsMode mode) {
  StepItem it;
  it.sequence = sequence;
  it.tokens = std::move(tokens);
  it.logits = mode;
  return it;
}

class StepLayoutTest : public ::testing::Test {
 protected:
  StepLayoutTest()
      : kv_(Allocator()),
        offsets_(StepMetaOffsets::For(kMaxTokens, kMaxSeqs, kLogitRows, 2, kMaxBlocks)),
        meta_(offsets_.total, -7) {
    options_.max_sequences = kMaxSeqs;
    options_.block_size = kBlock;
  }

  // Reserves the items' tokens (as the engine does first) and lays them out.
  StepLayout Plan(const std::vector<StepItem>& items, bool sampling = false) {
    std::vector<LogitsMode> modes;
    for (const StepItem& it : items) {
      EXPECT_TRUE(kv_->Reserve(it.sequence, it.tokens.size(), IgnoreCopy).ok());
      modes.push_back(it.logits);
    }
    absl::StatusOr<StepLayout> layout =
        StepLayout::Plan(items, modes, sampling, *kv_, offsets_, options_, meta_.data());
    EXPECT_TRUE(layout.ok()) << layout.status();
    return layout.ok() ? *layout : StepLayout{};
  }

  int32_t At(size_t offset) const { return meta_[offset]; }
  int32_t Slot(int group, int row) const {
    return meta_[offsets_.slots + group * offsets_.slots_stride + row];
  }
  int32_t Table(int group, int sequence, int block) const {
    return meta_[offsets_.tables + group * offsets_.tables_stride + sequence * kMaxBlocks + block];
  }
  // The slot the allocator gives position `p` of `sequence` in `group`.
  int32_t ExpectedSlot(int64_t sequence, int group, int64_t p) const {
    return kv_->Table(sequence, group)[p / kBlock] * kBlock + static_cast<int32_t>(p % kBlock);
  }

  std::unique_ptr<KvBlockAllocator> kv_;
  StepMetaOffsets offsets_;
  StepLayoutOptions options_;
  std::vector<int32_t> meta_;
};

TEST_F(StepLayoutTest, OffsetsAreDisjointRegionsInOrder) {
  const StepMetaOffsets& o = offsets_;
  EXPECT_EQ(o.tokens, 0u);
  EXPECT_EQ(o.pos, size_t{kMaxTokens});
  EXPECT_EQ(o.slots, size_t{2 * kMaxTokens});
  EXPECT_EQ(o.qstart, o.slots + 2 * kMaxTokens);
  EXPECT_EQ(o.lens, o.qstart + kMaxSeqs + 1);
  EXPECT_EQ(o.rows, o.lens + kMaxSeqs);
  EXPECT_EQ(o.tables, o.rows + kLogitRows);  // logit_rows > max_tokens here
  EXPECT_EQ(o.total, o.tables + 2 * kMaxSeqs * kMaxBlocks);
}

TEST_F(StepLayoutTest, DecodeStepIsPaddedToAPowerOfTwoWithScratchRows) {
  const int64_t a = SequenceOf(*kv_, 5), b = SequenceOf(*kv_, 9), c = SequenceOf(*kv_, 2);
  const StepLayout layout =
      Plan({Item(a, {11}, LogitsMode::kLast), Item(b, {12}, LogitsMode::kLast),
            Item(c, {13}, LogitsMode::kLast)});
  EXPECT_TRUE(layout.padded);
  EXPECT_TRUE(layout.decode);
  EXPECT_TRUE(layout.pad_rows);
  EXPECT_EQ(layout.real_items, 3);
  EXPECT_EQ(layout.seqs, 4);
  EXPECT_EQ(layout.tokens, 4);
  EXPECT_EQ(layout.rows, 4);  // the padding row computes a (dropped) logit row too
  EXPECT_EQ(layout.max_q, 1);
  EXPECT_EQ(layout.max_len, 10);
  EXPECT_EQ(layout.first_row, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(layout.row_count, (std::vector<int>{1, 1, 1}));
  const int32_t tokens[] = {11, 12, 13, 0}, pos[] = {5, 9, 2, 0}, lens[] = {6, 10, 3, 1};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(At(offsets_.tokens + r), tokens[r]);
    EXPECT_EQ(At(offsets_.pos + r), pos[r]);
    EXPECT_EQ(At(offsets_.lens + r), lens[r]);
    EXPECT_EQ(At(offsets_.qstart + r), r);
    EXPECT_EQ(At(offsets_.rows + r), r);
  }
  EXPECT_EQ(At(offsets_.qstart + 4), 4);
  const int64_t seqs[] = {a, b, c};
  for (int g = 0; g < 2; ++g) {
    for (int i = 0; i < 3; ++i) EXPECT_EQ(Slot(g, i), ExpectedSlot(seqs[i], g, pos[i]));
    EXPECT_EQ(Slot(g, 3), -1) << "a padding row stores no K/V";
    for (int blk = 0; blk < kMaxBlocks; ++blk) EXPECT_EQ(Table(g, 3, blk), 0);
  }
}

TEST_F(StepLayoutTest, PaddingStopsAtMaxSequences) {
  options_.max_sequences = 6;
  std::vector<StepItem> items;
  for (int i = 0; i < 5; ++i) items.push_back(Item(SequenceOf(*kv_, 3), {7}, LogitsMode::kLast));
  const StepLayout layout = Plan(items);
  EXPECT_EQ(layout.seqs, 6);  // 8 would be the next power of two
  EXPECT_EQ(layout.tokens, 6);
}

TEST_F(StepLayoutTest, WithoutGraphsNothingIsPadded) {
  options_.graphs = false;
  const int64_t a = SequenceOf(*kv_, 5), b = SequenceOf(*kv_, 9), c = SequenceOf(*kv_, 2);
  const StepLayout layout = Plan({Item(a, {1}, LogitsMode::kLast), Item(b, {2}, LogitsMode::kLast),
                                  Item(c, {3}, LogitsMode::kLast)});
  EXPECT_FALSE(layout.padded);
  EXPECT_FALSE(layout.decode);
  EXPECT_EQ(layout.seqs, 3);
  EXPECT_EQ(layout.tokens, 3);
  EXPECT_EQ(layout.rows, 3);
}

// Speculative decoding: a decode item with a drafted chunk gets the rows of
// its last draft_tokens + 1 positions (those its draft is verified from);
// beside a one-token item, the step is not graph-replayed.
TEST_F(StepLayoutTest, DraftedChunkGetsARowPerVerifiedPosition) {
  const int64_t a = SequenceOf(*kv_, 5), b = SequenceOf(*kv_, 9);
  StepItem drafted = Item(a, {7, 8, 9, 10}, LogitsMode::kLast);
  drafted.draft_tokens = 3;
  const StepLayout layout = Plan({drafted, Item(b, {2}, LogitsMode::kLast)}, true);
  EXPECT_FALSE(layout.padded);
  EXPECT_FALSE(layout.decode);
  EXPECT_EQ(layout.tokens, 5);
  EXPECT_EQ(layout.rows, 5);
  EXPECT_EQ(layout.first_row, (std::vector<int>{0, 4}));
  EXPECT_EQ(layout.row_count, (std::vector<int>{4, 1}));
  for (int j = 0; j < 5; ++j) EXPECT_EQ(At(offsets_.rows + j), j);
  EXPECT_EQ(At(offsets_.pos + 3), 8) << "the drafted positions follow the sequence";
  StepItem partly = Item(b, {3, 4, 5}, LogitsMode::kLast);
  partly.draft_tokens = 1;
  const StepLayout second = Plan({partly});
  EXPECT_EQ(second.rows, 2);
  EXPECT_EQ(At(offsets_.rows), 1);
  EXPECT_EQ(At(offsets_.rows + 1), 2);
}

// Every item a drafted chunk of the same q tokens: padded for a graph like a
// decode step, with padding sequences of q tokens (a row each) in the
// scratch block.
TEST_F(StepLayoutTest, UniformDraftedChunksArePaddedForAGraph) {
  const int64_t a = SequenceOf(*kv_, 5), b = SequenceOf(*kv_, 9), c = SequenceOf(*kv_, 2);
  std::vector<StepItem> items;
  for (int64_t s : {a, b, c}) {
    items.push_back(Item(s, {7, 8, 9}, LogitsMode::kLast));
    items.back().draft_tokens = 2;
  }
  const StepLayout layout = Plan(items, true);
  EXPECT_TRUE(layout.padded);
  EXPECT_TRUE(layout.decode);
  EXPECT_EQ(layout.chunk, 3);
  EXPECT_EQ(layout.seqs, 4);
  EXPECT_EQ(layout.tokens, 12);
  EXPECT_EQ(layout.rows, 12);
  EXPECT_EQ(layout.max_q, 3);
  EXPECT_EQ(layout.first_row, (std::vector<int>{0, 3, 6}));
  EXPECT_EQ(layout.row_count, (std::vector<int>{3, 3, 3}));
  for (int r = 0; r < 12; ++r) EXPECT_EQ(At(offsets_.rows + r), r);
  for (int i = 0; i <= 4; ++i) EXPECT_EQ(At(offsets_.qstart + i), 3 * i);
  EXPECT_EQ(At(offsets_.lens + 3), 3);
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(At(offsets_.tokens + 9 + j), 0);
    EXPECT_EQ(At(offsets_.pos + 9 + j), j);
    for (int g = 0; g < 2; ++g) EXPECT_EQ(Slot(g, 9 + j), -1) << "padding stores no K/V";
    EXPECT_EQ(At(offsets_.pos + 3 + j), 9 + j) << "b's chunk follows its 9 tokens";
  }
  for (int blk = 0; blk < kMaxBlocks; ++blk) EXPECT_EQ(Table(0, 3, blk), 0);
}

TEST_F(StepLayoutTest, VerifyStepsStayUnpaddedWhereTheyCannotBeGraphed) {
  auto chunks = [&](int n, int q) {
    std::vector<StepItem> items;
    for (int i = 0; i < n; ++i) {
      items.push_back(Item(SequenceOf(*kv_, 4), std::vector<int32_t>(q, 5), LogitsMode::kLast));
      items.back().draft_tokens = q - 1;
    }
    return items;
  };
  options_.max_logit_rows = 8;  // 4 padded sequences of 3 rows would need 12
  StepLayout layout = Plan(chunks(3, 3), true);
  EXPECT_FALSE(layout.padded);
  EXPECT_EQ(layout.chunk, 0);
  EXPECT_EQ(layout.seqs, 3);
  EXPECT_EQ(layout.rows, 9);
  options_.max_logit_rows = 64;
  options_.sharded = true;  // peers pad one-token steps only
  EXPECT_FALSE(Plan(chunks(2, 2), true).padded);
  options_.sharded = false;
  // A chunk verified at fewer positions than it brings.
  std::vector<StepItem> items = chunks(2, 3);
  items[1].draft_tokens = 1;
  EXPECT_FALSE(Plan(items, true).padded);
}

TEST_F(StepLayoutTest, PrefillChunkContinuesItsSequenceWithEveryRowAskedFor) {
  const int64_t s = SequenceOf(*kv_, 6);
  const StepLayout layout = Plan({Item(s, ConsecutiveTokens(7, 40), LogitsMode::kAll)});
  EXPECT_FALSE(layout.padded);
  EXPECT_EQ(layout.seqs, 1);
  EXPECT_EQ(layout.tokens, 7);
  EXPECT_EQ(layout.max_q, 7);
  EXPECT_EQ(layout.max_len, 13);
  EXPECT_EQ(layout.rows, 7);
  EXPECT_EQ(layout.row_count, std::vector<int>{7});
  for (int j = 0; j < 7; ++j) {
    EXPECT_EQ(At(offsets_.tokens + j), 40 + j);
    EXPECT_EQ(At(offsets_.pos + j), 6 + j);
    EXPECT_EQ(At(offsets_.rows + j), j);
    for (int g = 0; g < 2; ++g) EXPECT_EQ(Slot(g, j), ExpectedSlot(s, g, 6 + j));
  }
  EXPECT_EQ(At(offsets_.qstart), 0);
  EXPECT_EQ(At(offsets_.qstart + 1), 7);
  EXPECT_EQ(At(offsets_.lens), 13);
  // 13 positions: blocks 0..3 in the full group's table, unused entries 0.
  for (int blk = 0; blk < 4; ++blk) EXPECT_EQ(Table(0, 0, blk), kv_->Table(s, 0)[blk]);
  for (int blk = 4; blk < kMaxBlocks; ++blk) EXPECT_EQ(Table(0, 0, blk), 0);
}

TEST_F(StepLayoutTest, MixedStepKeepsRowsPerItemAndIsNotPadded) {
  const int64_t prompt = SequenceOf(*kv_, 0), decode = SequenceOf(*kv_, 4),
                quiet = SequenceOf(*kv_, 2);
  const StepLayout layout = Plan({Item(prompt, ConsecutiveTokens(5, 60), LogitsMode::kLast),
                                  Item(decode, {9}, LogitsMode::kAll),
                                  Item(quiet, ConsecutiveTokens(2, 80), LogitsMode::kNone)});
  EXPECT_FALSE(layout.padded);
  EXPECT_EQ(layout.seqs, 3);
  EXPECT_EQ(layout.tokens, 8);
  EXPECT_EQ(layout.max_q, 5);
  EXPECT_EQ(layout.first_row, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(layout.row_count, (std::vector<int>{1, 1, 0}));
  EXPECT_EQ(layout.rows, 2);
  EXPECT_EQ(At(offsets_.rows + 0), 4);  // the prompt's last position
  EXPECT_EQ(At(offsets_.rows + 1), 5);  // the decode token
  const int32_t qstart[] = {0, 5, 6, 8};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(At(offsets_.qstart + i), qstart[i]);
  EXPECT_EQ(At(offsets_.pos + 5), 4);
  EXPECT_EQ(At(offsets_.pos + 6), 2);
  EXPECT_EQ(At(offsets_.lens + 2), 4);
}

TEST_F(StepLayoutTest, SlidingGroupTableReadsDroppedBlocksAsScratch) {
  // 20 positions with window 8: the sliding group keeps only its last blocks.
  const int64_t s = SequenceOf(*kv_, 20);
  ASSERT_EQ(kv_->Table(s, 1)[0], -1);
  const StepLayout layout = Plan({Item(s, {3}, LogitsMode::kLast)});
  EXPECT_EQ(layout.max_len, 21);
  const std::vector<int32_t>& sliding = kv_->Table(s, 1);
  const std::vector<int32_t>& full = kv_->Table(s, 0);
  for (size_t blk = 0; blk < sliding.size(); ++blk) {
    EXPECT_EQ(Table(1, 0, blk), std::max(sliding[blk], 0));
    EXPECT_EQ(Table(0, 0, blk), full[blk]);
    EXPECT_GE(full[blk], 1);
  }
  EXPECT_NE(Slot(0, 0), Slot(1, 0)) << "each group has its own blocks";
  EXPECT_EQ(Slot(0, 0), ExpectedSlot(s, 0, 20));
  EXPECT_EQ(Slot(1, 0), ExpectedSlot(s, 1, 20));
}

TEST_F(StepLayoutTest, OneTokenStepWithoutLogitsIsPaddedOnlyWhenSharded) {
  const int64_t a = SequenceOf(*kv_, 3), b = SequenceOf(*kv_, 3), c = SequenceOf(*kv_, 3);
  const std::vector<StepItem> items = {Item(a, {1}, LogitsMode::kNone),
                                       Item(b, {2}, LogitsMode::kNone),
                                       Item(c, {3}, LogitsMode::kNone)};
  const StepLayout alone = Plan(items);
  EXPECT_FALSE(alone.padded);
  EXPECT_EQ(alone.rows, 0);
  for (const StepItem& it : items) ASSERT_TRUE(kv_->Commit(it.sequence, 1, it.tokens.data()).ok());
  options_.sharded = true;  // a TP peer of the leader: same padded tokens, no logit rows
  const StepLayout peer = Plan(items);
  EXPECT_TRUE(peer.padded);
  EXPECT_TRUE(peer.decode);
  EXPECT_FALSE(peer.pad_rows);
  EXPECT_EQ(peer.seqs, 4);
  EXPECT_EQ(peer.rows, 0);
}

TEST_F(StepLayoutTest, ShardedEmptyStepIsOnePaddingRow) {
  options_.sharded = true;
  const StepLayout layout = Plan({});
  EXPECT_TRUE(layout.padded);
  EXPECT_EQ(layout.real_items, 0);
  EXPECT_EQ(layout.seqs, 1);
  EXPECT_EQ(layout.tokens, 1);
  EXPECT_EQ(layout.rows, 0);
  EXPECT_EQ(Slot(0, 0), -1);
  options_.sharded = false;
  EXPECT_EQ(Plan({}).tokens, 0);
}

TEST_F(StepLayoutTest, SamplingStepWithARowlessItemIsNotPadded) {
  const int64_t a = SequenceOf(*kv_, 3), b = SequenceOf(*kv_, 5);
  // With sampling an item's mode is kLast (it samples) or kNone.
  const StepLayout layout =
      Plan({Item(a, {1}, LogitsMode::kLast), Item(b, {2}, LogitsMode::kNone)}, true);
  EXPECT_FALSE(layout.decode) << "an item without a row does not fit the graph's rows";
  EXPECT_FALSE(layout.padded);
  EXPECT_TRUE(layout.pad_rows);
  EXPECT_EQ(layout.row_count, (std::vector<int>{1, 0}));
}

TEST_F(StepLayoutTest, UsedRegionsCoverTheStepOnly) {
  const int64_t a = SequenceOf(*kv_, 3), b = SequenceOf(*kv_, 5), c = SequenceOf(*kv_, 1);
  const StepLayout layout = Plan({Item(a, {1}, LogitsMode::kLast), Item(b, {2}, LogitsMode::kLast),
                                  Item(c, {3}, LogitsMode::kLast)});
  const std::vector<std::pair<size_t, size_t>> expected = {
      {offsets_.tokens, 4},
      {offsets_.pos, 4},
      {offsets_.slots, 4},
      {offsets_.tables, 4 * kMaxBlocks},
      {offsets_.slots + offsets_.slots_stride, 4},
      {offsets_.tables + offsets_.tables_stride, 4 * kMaxBlocks},
      {offsets_.qstart, 5},
      {offsets_.lens, 4},
      {offsets_.rows, 4}};
  EXPECT_EQ(layout.UsedRegions(offsets_), expected);
}

TEST_F(StepLayoutTest, RefusesModesThatDoNotMatchTheItems) {
  const int64_t a = SequenceOf(*kv_, 3);
  const absl::StatusOr<StepLayout> layout = StepLayout::Plan(
      {Item(a, {1}, LogitsMode::kLast)}, {}, false, *kv_, offsets_, options_, meta_.data());
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StepLayoutBounds, DecodeContextBucket) {
  EXPECT_EQ(DecodeContextBucket(1, 131072), 1024);
  EXPECT_EQ(DecodeContextBucket(1025, 131072), 2048);
  EXPECT_EQ(DecodeContextBucket(5000, 4096), 4096);
  EXPECT_EQ(DecodeContextBucket(10, 512), 512);
}

TEST(StepLayoutBounds, ShardedStepBoundIsTheInstancesRoundedUp) {
  EXPECT_EQ(*ShardedStepBound(0, 3, 8192), 4);  // this rank's own tokens
  EXPECT_EQ(*ShardedStepBound(0, 0, 8192), 1);  // an empty step
  EXPECT_EQ(*ShardedStepBound(100, 3, 8192), 128);
  EXPECT_EQ(*ShardedStepBound(5000, 3, 4096), 4096);
  EXPECT_EQ(ShardedStepBound(4, 9, 8192).status().code(), absl::StatusCode::kInternal);
}

TEST(StepLayoutBounds, PowerOfTwoAtLeast) {
  EXPECT_EQ(PowerOfTwoAtLeast(0), 1);
  EXPECT_EQ(PowerOfTwoAtLeast(1), 1);
  EXPECT_EQ(PowerOfTwoAtLeast(3), 4);
  EXPECT_EQ(PowerOfTwoAtLeast(64), 64);
}

}  // namespace
}  // namespace flotilla
