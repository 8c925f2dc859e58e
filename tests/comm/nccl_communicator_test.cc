// NCCL communicator on real GPUs: one thread per GPU, each a rank. The shared
// host-memory checks run unchanged through an adaptor that stages every
// buffer in device memory. Skips (honestly) without GPUs.
#include "comm/nccl/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "common/status.h"
#include "tests/comm/collective_checks.h"

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

// A host-memory view of a NcclCommunicator: copies inputs to the device, runs
// the collective there, copies results back.
class StagedNccl final : public Communicator {
 public:
  explicit StagedNccl(std::unique_ptr<NcclCommunicator> c) : c_(std::move(c)) {}
  int rank() const override { return c_->rank(); }
  int size() const override { return c_->size(); }

  absl::Status AllReduce(void* buffer, size_t count, DataType type, void*) override {
    const size_t bytes = count * DataTypeSize(type);
    void* d = Stage(buffer, bytes);
    FLOTILLA_RETURN_IF_ERROR(c_->AllReduce(d, count, type));
    return Unstage(buffer, d, bytes);
  }
  absl::Status AllGather(const void* send, void* recv, size_t bytes_per_rank, void*) override {
    const size_t total = bytes_per_rank * static_cast<size_t>(size());
    void* d_recv = Stage(recv, total);
    const auto* s = static_cast<const uint8_t*>(send);
    const auto* r = static_cast<const uint8_t*>(recv);
    const void* d_send = (s >= r && s < r + total)
                             ? static_cast<const void*>(static_cast<uint8_t*>(d_recv) + (s - r))
                             : Stage(send, bytes_per_rank);
    FLOTILLA_RETURN_IF_ERROR(c_->AllGather(d_send, d_recv, bytes_per_rank));
    return Unstage(recv, d_recv, total);
  }
  absl::Status Broadcast(void* buffer, size_t bytes, int root, void*) override {
    void* d = Stage(buffer, bytes);
    FLOTILLA_RETURN_IF_ERROR(c_->Broadcast(d, bytes, root));
    return Unstage(buffer, d, bytes);
  }
  absl::Status AllToAllV(const void* send, absl::Span<const size_t> sc,
                         absl::Span<const size_t> so, void* recv, absl::Span<const size_t> rc,
                         absl::Span<const size_t> ro, void*) override {
    size_t send_extent = 0, recv_extent = 0;
    for (size_t p = 0; p < std::min(sc.size(), so.size()); ++p) send_extent = std::max(send_extent, so[p] + sc[p]);
    for (size_t p = 0; p < std::min(rc.size(), ro.size()); ++p) recv_extent = std::max(recv_extent, ro[p] + rc[p]);
    void* d_send = Stage(send, send_extent);
    void* d_recv = Stage(recv, recv_extent);
    FLOTILLA_RETURN_IF_ERROR(c_->AllToAllV(d_send, sc, so, d_recv, rc, ro));
    return Unstage(recv, d_recv, recv_extent);
  }
  absl::Status ExchangeCounts(absl::Span<const size_t> s, absl::Span<size_t> r) override {
    return c_->ExchangeCounts(s, r);
  }
  absl::Status Barrier(void*) override { return c_->Barrier(); }

  ~StagedNccl() override {
    for (void* p : allocations_) cudaFree(p);
  }

 private:
  void* Stage(const void* host, size_t bytes) {
    void* d = nullptr;
    if (cudaMalloc(&d, std::max<size_t>(bytes, 1)) != cudaSuccess) return nullptr;
    allocations_.push_back(d);
    if (bytes > 0) cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice);
    return d;
  }
  absl::Status Unstage(void* host, const void* d, size_t bytes) {
    if (bytes > 0 && cudaMemcpy(host, d, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
      return absl::InternalError("cudaMemcpy back failed");
    }
    return absl::OkStatus();
  }

  std::unique_ptr<NcclCommunicator> c_;
  std::vector<void*> allocations_;
};

std::vector<absl::Status> RunGroup(int w) {
  auto id = NcclUniqueId();
  EXPECT_TRUE(id.ok()) << id.status();
  std::vector<absl::Status> results(static_cast<size_t>(w));
  std::vector<std::thread> threads;
  for (int r = 0; r < w; ++r) {
    threads.emplace_back([&, r] {
      NcclOptions options;
      options.device = r;
      options.timeout = absl::Seconds(60);
      auto c = NcclCommunicator::Create(r, w, *id, options);
      if (!c.ok()) {
        results[static_cast<size_t>(r)] = c.status();
        return;
      }
      StagedNccl staged(std::move(*c));
      results[static_cast<size_t>(r)] = testing::RunCollectiveChecks(staged);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

TEST(NcclCommunicatorTest, CreateRejectsBadArguments) {
  EXPECT_TRUE(absl::IsInvalidArgument(NcclCommunicator::Create(0, 2, "short").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      NcclCommunicator::Create(2, 2, std::string(128, '\0')).status()));
  NcclOptions options;
  options.device = 1000;
  EXPECT_TRUE(absl::IsFailedPrecondition(
      NcclCommunicator::Create(0, 1, std::string(128, '\0'), options).status()));
}

TEST(NcclCommunicatorTest, SingleGpuEveryCollective) {
  if (GpuCount() < 1) GTEST_SKIP() << "no CUDA device present";
  for (const auto& st : RunGroup(1)) EXPECT_TRUE(st.ok()) << st;
}

TEST(NcclCommunicatorTest, EveryGpuEveryCollective) {
  const int n = std::min(GpuCount(), 4);
  if (n < 2) GTEST_SKIP() << "needs at least 2 CUDA devices, found " << GpuCount();
  for (int w = 2; w <= n; ++w) {
    auto results = RunGroup(w);
    for (size_t r = 0; r < results.size(); ++r) {
      EXPECT_TRUE(results[r].ok()) << "world " << w << " rank " << r << ": " << results[r];
    }
  }
}

TEST(NcclCommunicatorTest, MissingPeerGivesUnavailable) {
  if (GpuCount() < 1) GTEST_SKIP() << "no CUDA device present";
  auto id = NcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  NcclOptions options;
  options.timeout = absl::Seconds(3);
  // Rank 1 never joins.
  auto c = NcclCommunicator::Create(0, 2, *id, options);
  EXPECT_TRUE(absl::IsUnavailable(c.status())) << c.status();
}

}  // namespace
}  // namespace flotilla::comm
