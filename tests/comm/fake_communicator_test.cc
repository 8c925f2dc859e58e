#include "tests/comm/fake_communicator.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "comm/local/local_communicator.h"
#include "common/bf16.h"
#include "tests/comm/collective_checks.h"

namespace flotilla::comm::testing {
namespace {

TEST(FakeCommunicatorTest, StandaloneEchoesPeers) {
  FakeCommunicator c(1, 3);
  std::vector<float> f = {1.f, 2.5f};
  ASSERT_TRUE(c.AllReduce(f.data(), f.size(), DataType::kF32).ok());
  EXPECT_EQ(f, (std::vector<float>{3.f, 7.5f}));
  std::vector<uint16_t> b = {FloatToBf16(2.f)};
  ASSERT_TRUE(c.AllReduce(b.data(), 1, DataType::kBf16).ok());
  EXPECT_EQ(Bf16ToFloat(b[0]), 6.f);

  std::vector<uint8_t> gathered(6, 0);
  const uint8_t mine[2] = {7, 8};
  ASSERT_TRUE(c.AllGather(mine, gathered.data(), 2).ok());
  EXPECT_EQ(gathered, (std::vector<uint8_t>{7, 8, 7, 8, 7, 8}));

  std::vector<uint8_t> send = {1, 2, 3}, recv(3, 0);
  std::vector<size_t> counts = {1, 0, 2}, offsets = {0, 1, 1};
  ASSERT_TRUE(c.AllToAllV(send.data(), counts, offsets, recv.data(), counts, offsets).ok());
  EXPECT_EQ(recv, send);
  std::vector<size_t> other = {0, 1, 2};
  EXPECT_TRUE(absl::IsInvalidArgument(
      c.AllToAllV(send.data(), counts, offsets, recv.data(), other, offsets)));
  EXPECT_TRUE(absl::IsInvalidArgument(c.Broadcast(recv.data(), 1, 3)));
}

TEST(FakeCommunicatorTest, ScriptedFailuresComeInOrder) {
  FakeCommunicator c(0, 2);
  c.FailNth(CommOp::kAllToAllV, 1, absl::UnavailableError("peer 1 died"));
  c.FailFrom(4, absl::UnavailableError("group broken"));
  std::vector<uint8_t> buf(4, 0);
  std::vector<size_t> counts = {2, 2}, offsets = {0, 2};
  EXPECT_TRUE(c.AllToAllV(buf.data(), counts, offsets, buf.data() , counts, offsets).ok());
  absl::Status st = c.AllToAllV(buf.data(), counts, offsets, buf.data(), counts, offsets);
  EXPECT_TRUE(absl::IsUnavailable(st));
  EXPECT_EQ(st.message(), "peer 1 died");
  EXPECT_TRUE(c.Barrier().ok());
  EXPECT_TRUE(c.AllToAllV(buf.data(), counts, offsets, buf.data(), counts, offsets).ok());
  EXPECT_TRUE(absl::IsUnavailable(c.Barrier()));
  EXPECT_TRUE(absl::IsUnavailable(c.Broadcast(buf.data(), 1, 0)));

  auto calls = c.calls();
  ASSERT_EQ(calls.size(), 6u);
  EXPECT_EQ(calls[0].op, CommOp::kAllToAllV);
  EXPECT_EQ(calls[0].bytes, 4u);
  EXPECT_EQ(calls[2].op, CommOp::kBarrier);
  EXPECT_EQ(calls[5].op, CommOp::kBroadcast);
  EXPECT_EQ(calls[5].root, 0);
  EXPECT_EQ(calls[5].index, 5);
}

TEST(FakeCommunicatorTest, HookSeesEveryCallAndCanFailIt) {
  FakeCommunicator c(0, 1);
  int seen = 0;
  c.SetHook([&](const CommCall& call) {
    ++seen;
    return call.op == CommOp::kAllReduce ? absl::DeadlineExceededError("slow")
                                          : absl::OkStatus();
  });
  float x = 1.f;
  EXPECT_TRUE(absl::IsDeadlineExceeded(c.AllReduce(&x, 1, DataType::kF32)));
  EXPECT_TRUE(c.Barrier().ok());
  EXPECT_EQ(seen, 2);
}

TEST(FakeCommunicatorTest, WrapsARealGroup) {
  auto rv = LocalRendezvous::Create(2);
  ASSERT_TRUE(rv.ok());
  std::vector<absl::Status> results(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto inner = LocalCommunicator::Create(*rv, r);
      ASSERT_TRUE(inner.ok());
      FakeCommunicator c(std::move(*inner));
      results[static_cast<size_t>(r)] = RunCollectiveChecks(c);
      EXPECT_GT(c.calls().size(), 10u);
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& st : results) EXPECT_TRUE(st.ok()) << st;
}

}  // namespace
}  // namespace flotilla::comm::testing
