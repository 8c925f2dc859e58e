// The host-side decisions of the device context that need no GPU: how large
// the exchange grids may be when ranks share a GPU, and the receive layout
// every rank decodes its peers' mappings with.
#include "worker/parallel/device_topology.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/cuda/ep_exchange.h"
#include "worker/parallel/exchange_buffers.h"

namespace flotilla::parallel {
namespace {

namespace kc = kernels::cuda;

RankIdentity On(const char* node, const char* gpu, int64_t resident) {
  RankIdentity id;
  std::strncpy(id.node, node, sizeof(id.node) - 1);
  std::strncpy(id.pci_bus_id, gpu, sizeof(id.pci_bus_id) - 1);
  id.resident_blocks = resident;
  return id;
}

TEST(AgreedMaxBlocksTest, OneRankPerGpuGetsTheFullGrid) {
  std::vector<RankIdentity> ranks;
  for (const char* gpu : {"0000:01:00.0", "0000:02:00.0", "0000:03:00.0"}) {
    ranks.push_back(On("host/boot", gpu, 396));
  }
  EXPECT_EQ(AgreedMaxBlocks(ranks), kc::kEpMaxBlocks);
}

TEST(AgreedMaxBlocksTest, RanksSharingAGpuSplitWhatItHolds) {
  // 8 processes on one GPU holding 396 blocks: 396 / (2 * 8) = 24 each, so
  // all of them stay resident with room for other kernels.
  std::vector<RankIdentity> ranks(8, On("host/boot", "0000:01:00.0", 396));
  EXPECT_EQ(AgreedMaxBlocks(ranks), 24);
}

TEST(AgreedMaxBlocksTest, TheMostCrowdedGpuDecidesForEveryRank) {
  std::vector<RankIdentity> ranks = {On("a/1", "0000:01:00.0", 396), On("b/1", "0000:01:00.0", 100),
                                     On("b/1", "0000:01:00.0", 100)};
  EXPECT_EQ(AgreedMaxBlocks(ranks), 25);  // 100 / (2 * 2) on node b
}

TEST(EveryRankOwnsItsGpuTest, ARankSharingAGpuAnywhereSaysNo) {
  EXPECT_TRUE(EveryRankOwnsItsGpu({On("a/1", "0000:01:00.0", 396), On("a/1", "0000:02:00.0", 396),
                                   On("b/1", "0000:01:00.0", 396)}));
  EXPECT_FALSE(EveryRankOwnsItsGpu({On("a/1", "0000:01:00.0", 396), On("b/1", "0000:01:00.0", 396),
                                    On("b/1", "0000:01:00.0", 396)}));
  EXPECT_TRUE(EveryRankOwnsItsGpu({On("a/1", "0000:01:00.0", 396)}));
}

TEST(AgreedMaxBlocksTest, UnknownOccupancyFallsBackToTheSmallestGrid) {
  std::vector<RankIdentity> ranks(2, On("host/boot", "0000:01:00.0", 0));
  EXPECT_EQ(AgreedMaxBlocks(ranks), 2);
}

TEST(ExchangeGridTest, GridsFollowTheStepWithinTheirBounds) {
  EXPECT_EQ(kc::EpExchangeBlocks(0, 64), 2);
  EXPECT_EQ(kc::EpExchangeBlocks(4, 64), 2);      // 1 token, top-4
  EXPECT_EQ(kc::EpExchangeBlocks(32, 64), 16);    // 8 tokens
  EXPECT_EQ(kc::EpExchangeBlocks(1024, 64), 64);  // 256 tokens
  EXPECT_EQ(kc::EpExchangeBlocks(1024, 24), 24);
  EXPECT_EQ(kc::EpReduceBlocks(1, 64), 1);
  EXPECT_EQ(kc::EpReduceBlocks(8 * 2880, 64), 12);
  EXPECT_EQ(kc::EpReduceBlocks(int64_t{1} << 30, 24), 24);
}

TEST(RecvLayoutTest, RegionsAreAlignedDisjointAndSizedForTheLargestStep) {
  ExchangeSizes s;
  s.world = 4;
  s.tp = 2;
  s.hidden = 2880;
  s.top_k = 4;
  s.max_tokens = 64;
  EXPECT_EQ(s.cap_max(), 128);
  EXPECT_EQ(s.CapFor(1), 4);
  const RecvLayout l = RecvLayout::For(s);
  const size_t starts[] = {l.x,     l.meta,        l.combined,    l.gathered, l.reduce,
                           l.flags, l.combined_ll, l.gathered_ll, l.bytes};
  for (size_t i = 0; i + 1 < std::size(starts); ++i) {
    EXPECT_EQ(starts[i] % 256, 0u);
    EXPECT_LT(starts[i], starts[i + 1]);
  }
  EXPECT_GE(l.meta - l.x, 4u * 128 * 2880 * 2);
  EXPECT_GE(l.gathered - l.combined, 4u * 128 * 2880 * 4);
  EXPECT_GE(l.flags - l.reduce, 2u * 2 * kc::kEpMaxBlocks * kc::kEpReduceChunk * 4);
  EXPECT_GE(l.ll - l.flags, (kc::EpFlagLayout{4, 2}.words() * 8));
  // The small combines' lines at 16 bytes for two f32 values: the outputs,
  // up to kEpLlMaxCap rows per segment, and the TP gather's tokens (8 tokens
  // per rank at top-4).
  EXPECT_EQ(l.ll_cap, kc::kEpLlMaxCap);
  EXPECT_GE(l.gathered_ll - l.combined_ll, 4u * kc::kEpLlMaxCap * (2880 / 2) * 16);
  EXPECT_EQ(l.gathered_ll_tokens, 16);
  EXPECT_GE(l.bytes - l.gathered_ll, 16u * (2880 / 2) * 16);
  std::vector<char> memory(l.bytes);
  const kc::EpRecvBuffers r = l.At(memory.data());
  EXPECT_EQ(r.ll_cap, kc::kEpLlMaxCap);
  EXPECT_EQ(r.gathered_ll_tokens, 16);
  EXPECT_EQ(reinterpret_cast<char*>(r.combined_ll), memory.data() + l.combined_ll);
  EXPECT_EQ(reinterpret_cast<char*>(r.gathered_ll), memory.data() + l.gathered_ll);
  // A context of smaller steps holds lines for its largest one only.
  s.max_tokens = 2;
  EXPECT_EQ(RecvLayout::For(s).ll_cap, 4);
  EXPECT_EQ(RecvLayout::For(s).gathered_ll_tokens, 2);
  // Without TP there is no gather.
  s.tp = 1;
  s.max_tokens = 64;
  EXPECT_EQ(RecvLayout::For(s).gathered_ll_tokens, 0);
  EXPECT_EQ(RecvLayout::For(s).At(memory.data()).gathered_ll, nullptr);
  s.tp = 2;
  // Without lines (a comparison) or over NCCL there is no such region.
  s.max_tokens = 64;
  s.flagged_lines = false;
  EXPECT_EQ(RecvLayout::For(s).ll_cap, 0);
  EXPECT_EQ(RecvLayout::For(s).At(memory.data()).combined_ll, nullptr);
  EXPECT_EQ(RecvLayout::For(s).At(memory.data()).gathered_ll, nullptr);
  s.flagged_lines = true;
  // NCCL needs neither flags nor the TP staging.
  s.ipc = false;
  const RecvLayout n = RecvLayout::For(s);
  EXPECT_EQ(n.bytes, n.flags);
  EXPECT_EQ(n.gathered, n.flags);
  EXPECT_EQ(n.ll_cap, 0);
}

}  // namespace
}  // namespace flotilla::parallel
