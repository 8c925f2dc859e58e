// The NCCL wrapper (comm/nccl/nccl_comms.h) on real GPUs: one thread per GPU,
// each a rank, bootstrapped over LocalCommunicator. Forming the world, the
// split (which must wait on the parent whatever ncclCommSplit returned), a
// group exchange, an all-reduce on the child, Abort, and the bounded waits
// (timeout, interrupt) when a peer never joins. Skips without GPUs.
#include "comm/nccl/nccl_comms.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "comm/local/local_communicator.h"
#include "common/cuda_status.h"
#include "common/status.h"
#include "tests/comm/local_ranks.h"

namespace flotilla::comm {
namespace {

int GpuCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

// Runs `body(host)` for ranks 0..w-1, each on its own thread with GPU
// `rank % GPUs` current (distinct GPUs when w <= GPUs).
std::vector<absl::Status> RunRanks(int w, const std::function<absl::Status(Communicator&)>& body) {
  return testing::RunLocalRanks(w, {}, [&](LocalCommunicator& host) -> absl::Status {
    FLOTILLA_RETURN_IF_ERROR(
        CudaStatus(cudaSetDevice(host.rank() % std::max(GpuCount(), 1)), "cudaSetDevice"));
    return body(host);
  });
}

// On `comms`: every rank sends its rank number to every rank (itself too)
// in one group on the world communicator, then all-reduces `rank + 1` over
// the child; checks both against what the ranks must hold.
absl::Status ExchangeAndReduce(NcclComms& comms, int rank, int world, int child_ranks,
                               float child_sum) {
  int32_t* send = nullptr;
  int32_t* recv = nullptr;
  float* value = nullptr;
  FLOTILLA_CUDA_RETURN_IF_ERROR(cudaMalloc(&send, sizeof(int32_t) * world));
  FLOTILLA_CUDA_RETURN_IF_ERROR(cudaMalloc(&recv, sizeof(int32_t) * world));
  FLOTILLA_CUDA_RETURN_IF_ERROR(cudaMalloc(&value, sizeof(float)));
  const std::vector<int32_t> mine(static_cast<size_t>(world), rank);
  const float start = static_cast<float>(rank + 1);
  FLOTILLA_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(send, mine.data(), sizeof(int32_t) * world, cudaMemcpyHostToDevice));
  FLOTILLA_CUDA_RETURN_IF_ERROR(cudaMemcpy(value, &start, sizeof(float), cudaMemcpyHostToDevice));
  cudaStream_t stream = nullptr;
  FLOTILLA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ncclComm_t all = comms.world();
  FLOTILLA_RETURN_IF_ERROR(comms.Group(
      [&] {
        for (int p = 0; p < world; ++p) {
          ncclSend(send + p, 1, ncclInt32, p, all, stream);
          ncclRecv(recv + p, 1, ncclInt32, p, all, stream);
        }
      },
      "exchange"));
  if (child_ranks > 0) {
    FLOTILLA_RETURN_IF_ERROR(comms.Settle(
        comms.child(), ncclAllReduce(value, value, 1, ncclFloat32, ncclSum, comms.child(), stream),
        "all-reduce"));
  }
  FLOTILLA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  std::vector<int32_t> got(static_cast<size_t>(world), -1);
  float sum = 0;
  FLOTILLA_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(got.data(), recv, sizeof(int32_t) * world, cudaMemcpyDeviceToHost));
  FLOTILLA_CUDA_RETURN_IF_ERROR(cudaMemcpy(&sum, value, sizeof(float), cudaMemcpyDeviceToHost));
  cudaStreamDestroy(stream);
  cudaFree(send);
  cudaFree(recv);
  cudaFree(value);
  for (int p = 0; p < world; ++p) {
    if (got[static_cast<size_t>(p)] != p) {
      return absl::InternalError(
          absl::StrCat("rank ", rank, " got ", got[static_cast<size_t>(p)], " from rank ", p));
    }
  }
  const float want = child_ranks > 0 ? child_sum : start;
  if (sum != want) {
    return absl::InternalError(
        absl::StrCat("rank ", rank, ": all-reduce gave ", sum, ", not ", want));
  }
  return comms.Health();
}

TEST(NcclCommsTest, RejectsANonPositiveTimeout) {
  auto rendezvous = LocalRendezvous::Create(1);
  ASSERT_TRUE(rendezvous.ok());
  auto host = LocalCommunicator::Create(*rendezvous, 0);
  ASSERT_TRUE(host.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(
      NcclComms::Create(**host, std::nullopt, absl::ZeroDuration()).status()));
}

TEST(NcclCommsTest, OneRankFormsSplitsExchangesAndAborts) {
  if (GpuCount() < 1) GTEST_SKIP() << "no CUDA device present";
  const auto results = RunRanks(1, [](Communicator& host) -> absl::Status {
    FLOTILLA_ASSIGN_OR_RETURN(
        std::unique_ptr<NcclComms> comms,
        NcclComms::Create(host, NcclSplit{0, 0, "tensor-parallel communicator"},
                          absl::Seconds(60)));
    if (comms->world() == nullptr || comms->child() == nullptr) {
      return absl::InternalError("no world or child communicator");
    }
    FLOTILLA_RETURN_IF_ERROR(ExchangeAndReduce(*comms, 0, 1, 1, 1.0f));
    comms->Abort();
    if (comms->world() != nullptr || comms->child() != nullptr) {
      return absl::InternalError("Abort left a communicator");
    }
    const absl::Status after = comms->Health();
    if (!absl::IsUnavailable(after) || !absl::StrContains(after.message(), "aborted")) {
      return absl::InternalError(absl::StrCat("after Abort, Health() gave ", after.ToString()));
    }
    return absl::OkStatus();
  });
  for (const absl::Status& st : results) EXPECT_TRUE(st.ok()) << st;
}

// Distinct GPUs are where the split used to come back empty: NCCL builds
// the child on its group thread after ncclCommSplit returned ncclSuccess.
TEST(NcclCommsTest, DistinctGpusSplitIntoPairs) {
  const int world = GpuCount() >= 4 ? 4 : 2;
  if (GpuCount() < 2) GTEST_SKIP() << "needs at least 2 CUDA devices, found " << GpuCount();
  const auto results = RunRanks(world, [world](Communicator& host) -> absl::Status {
    const int rank = host.rank();
    FLOTILLA_ASSIGN_OR_RETURN(
        std::unique_ptr<NcclComms> comms,
        NcclComms::Create(host, NcclSplit{rank / 2, rank % 2, "pair"}, absl::Seconds(60)));
    // The pair {2g, 2g + 1} sums (2g + 1) + (2g + 2).
    const float pair_sum = static_cast<float>(4 * (rank / 2) + 3);
    return ExchangeAndReduce(*comms, rank, world, 2, pair_sum);
  });
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
  }
}

// Rank 1 takes the unique id over the host communicator but never joins
// NCCL; rank 0's Create must end with UNAVAILABLE instead of waiting.
absl::Status CreateWithoutPeer(absl::Duration timeout, bool interrupted) {
  auto interrupt = std::make_shared<std::atomic<bool>>(interrupted);
  absl::Status rank0;
  const auto results = RunRanks(2, [&](Communicator& host) -> absl::Status {
    if (host.rank() == 1) {
      char id[NCCL_UNIQUE_ID_BYTES];
      return host.Broadcast(id, sizeof(id), 0);
    }
    rank0 = NcclComms::Create(host, std::nullopt, timeout, interrupt).status();
    return absl::OkStatus();
  });
  for (const absl::Status& st : results) EXPECT_TRUE(st.ok()) << st;
  return rank0;
}

TEST(NcclCommsTest, MissingPeerEndsAtTheTimeout) {
  if (GpuCount() < 1) GTEST_SKIP() << "no CUDA device present";
  const absl::Status st = CreateWithoutPeer(absl::Seconds(3), /*interrupted=*/false);
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "did not finish within")) << st;
}

TEST(NcclCommsTest, MissingPeerEndsAtTheInterrupt) {
  if (GpuCount() < 1) GTEST_SKIP() << "no CUDA device present";
  const absl::Status st = CreateWithoutPeer(absl::Minutes(10), /*interrupted=*/true);
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "was interrupted")) << st;
}

}  // namespace
}  // namespace flotilla::comm
