#include "comm/local/local_communicator.h"

#include <gtest/gtest.h>

#include <functional>
#include <thread>
#include <vector>

#include "tests/comm/collective_checks.h"
#include "tests/comm/local_ranks.h"

namespace flotilla::comm {
namespace {

using testing::RunLocalRanks;

class LocalCollectivesTest : public ::testing::TestWithParam<int> {};

TEST_P(LocalCollectivesTest, EveryCollectiveGivesTheExpectedData) {
  auto results = RunLocalRanks(GetParam(), {}, [](LocalCommunicator& c) {
    EXPECT_EQ(c.size(), GetParam());
    return testing::RunCollectiveChecks(c);
  });
  for (size_t r = 0; r < results.size(); ++r)
    EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
}

INSTANTIATE_TEST_SUITE_P(Worlds, LocalCollectivesTest, ::testing::Values(1, 2, 3, 4));

TEST(LocalCommunicatorTest, DeadPeerGivesUnavailableAndTheCommunicatorStaysBroken) {
  auto rv = LocalRendezvous::Create(3);
  ASSERT_TRUE(rv.ok());
  std::vector<absl::Status> first(3), second(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      auto comm = LocalCommunicator::Create(*rv, r, {absl::Seconds(30)});
      ASSERT_TRUE(comm.ok());
      ASSERT_TRUE((*comm)->Barrier().ok());
      if (r == 2) return;  // destroyed: as if the process had died
      std::vector<float> x(64, 1.f);
      first[static_cast<size_t>(r)] = (*comm)->AllReduce(x.data(), x.size(), DataType::kF32);
      second[static_cast<size_t>(r)] = (*comm)->Barrier();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(absl::IsUnavailable(first[static_cast<size_t>(r)]))
        << first[static_cast<size_t>(r)];
    EXPECT_TRUE(absl::IsUnavailable(second[static_cast<size_t>(r)]))
        << second[static_cast<size_t>(r)];
  }
}

TEST(LocalCommunicatorTest, SilentPeerTimesOutWithUnavailable) {
  auto rv = LocalRendezvous::Create(2);
  ASSERT_TRUE(rv.ok());
  auto c0 = LocalCommunicator::Create(*rv, 0, {absl::Milliseconds(100)});
  auto c1 = LocalCommunicator::Create(*rv, 1, {absl::Milliseconds(100)});  // never called
  ASSERT_TRUE(c0.ok() && c1.ok());
  absl::Status st = (*c0)->Barrier();
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_NE(std::string(st.message()).find("rank 1"), std::string::npos) << st;
}

TEST(LocalCommunicatorTest, MismatchedCountsAreInvalidArgument) {
  auto results = RunLocalRanks(2, {}, [](LocalCommunicator& c) {
    std::vector<uint8_t> send(16, 1), recv(16, 0);
    std::vector<size_t> zero = {0, 0};
    // Rank 1 sends 4 bytes to rank 0, which expects 8.
    std::vector<size_t> sc = c.rank() == 1 ? std::vector<size_t>{4, 0} : std::vector<size_t>{0, 0};
    std::vector<size_t> rc = c.rank() == 0 ? std::vector<size_t>{0, 8} : std::vector<size_t>{0, 0};
    return c.AllToAllV(send.data(), sc, zero, recv.data(), rc, zero);
  });
  EXPECT_TRUE(absl::IsInvalidArgument(results[0])) << results[0];
  EXPECT_TRUE(results[1].ok()) << results[1];
}

TEST(LocalCommunicatorTest, CreateRejectsBadArguments) {
  EXPECT_TRUE(absl::IsInvalidArgument(LocalRendezvous::Create(0).status()));
  auto rv = LocalRendezvous::Create(2);
  ASSERT_TRUE(rv.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(LocalCommunicator::Create(*rv, 2).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(LocalCommunicator::Create(*rv, -1).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(LocalCommunicator::Create(nullptr, 0).status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(LocalCommunicator::Create(*rv, 0, {absl::ZeroDuration()}).status()));
  auto first = LocalCommunicator::Create(*rv, 0);
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(absl::IsAlreadyExists(LocalCommunicator::Create(*rv, 0).status()));
}

TEST(LocalCommunicatorTest, ReceiveBufferTooSmallForUnknownCounts) {
  auto results = RunLocalRanks(2, {}, [](LocalCommunicator& c) -> absl::Status {
    std::vector<uint8_t> send(100, 3), recv(10);
    std::vector<size_t> sc = {50, 50}, so = {0, 50}, rc, ro;
    return AllToAllVExchangingCounts(c, send.data(), sc, so, recv.data(), recv.size(), &rc, &ro);
  });
  for (const auto& st : results) EXPECT_TRUE(absl::IsResourceExhausted(st)) << st;
}

}  // namespace
}  // namespace flotilla::comm

namespace flotilla::comm {
namespace {

TEST(LocalCommunicatorTest, NullBuffersAreInvalidArgument) {
  auto rv = LocalRendezvous::Create(1);
  ASSERT_TRUE(rv.ok());
  auto c = LocalCommunicator::Create(*rv, 0);
  ASSERT_TRUE(c.ok());
  std::vector<size_t> one = {4}, zero = {0};
  EXPECT_TRUE(absl::IsInvalidArgument((*c)->AllToAllV(nullptr, one, zero, nullptr, one, zero)));
  EXPECT_TRUE(absl::IsInvalidArgument((*c)->AllReduce(nullptr, 3, DataType::kF32)));
  EXPECT_TRUE(absl::IsInvalidArgument((*c)->AllGather(nullptr, nullptr, 3)));
  EXPECT_TRUE(absl::IsInvalidArgument((*c)->Broadcast(nullptr, 3, 0)));
  EXPECT_TRUE(absl::IsInvalidArgument((*c)->AllReduce(nullptr, 0, static_cast<DataType>(7))));
  // The checks above send nothing, so the group still works.
  EXPECT_TRUE((*c)->Barrier().ok());
}

}  // namespace
}  // namespace flotilla::comm
