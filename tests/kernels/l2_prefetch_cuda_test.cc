// LaunchL2Prefetch: a hint that never changes memory, refuses what the bulk
// prefetch cannot take, and records into a graph on a forked stream as the
// engine uses it.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/cuda/fill.h"
#include "kernels/cuda/l2_prefetch.h"
#include "tests/kernels/cuda_test_util.h"

namespace flotilla::kernels {
namespace {

class L2PrefetchCuda : public CudaTest {};

std::vector<uint32_t> Pattern(size_t n) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint32_t>(i * 2654435761u);
  return v;
}

TEST_F(L2PrefetchCuda, LeavesMemoryAsItWasAtEverySize) {
  const std::vector<uint32_t> want = Pattern(3 << 20);  // 12 MB: many chunks and blocks
  Dev<uint32_t> d(want);
  for (size_t bytes :
       {size_t{0}, size_t{16}, size_t{17}, size_t{16384 + 48}, want.size() * sizeof(uint32_t)}) {
    EXPECT_EQ(cuda::LaunchL2Prefetch(d.p, bytes, nullptr), cudaSuccess) << bytes;
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(d.Get(), want);
}

TEST_F(L2PrefetchCuda, RefusesAnUnalignedStart) {
  Dev<uint32_t> d(64);
  EXPECT_EQ(cuda::LaunchL2Prefetch(reinterpret_cast<const char*>(d.p) + 4, 64, nullptr),
            cudaErrorInvalidValue);
  // Under 16 bytes there is nothing to ask for, aligned or not.
  EXPECT_EQ(cuda::LaunchL2Prefetch(reinterpret_cast<const char*>(d.p) + 4, 15, nullptr),
            cudaSuccess);
}

// Forked from a capturing stream and joined before the capture ends, as the
// engine's decode graphs record it; the graph replays and the step's own
// work is unchanged.
TEST_F(L2PrefetchCuda, RecordsIntoAGraphOnAForkedStream) {
  const std::vector<uint32_t> weights = Pattern(1 << 20);
  Dev<uint32_t> w(weights);
  Dev<float> acc(1 << 16), want(1 << 16);
  ASSERT_EQ(cuda::LaunchFillF32(want.p, want.n, 3, 1.0f, 0.0f, nullptr), cudaSuccess);
  cudaStream_t main_stream = nullptr, side = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&main_stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(main_stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  for (int layer = 0; layer < 3; ++layer) {
    ASSERT_EQ(cuda::LaunchFillF32(acc.p, acc.n, 1 + layer, 1.0f, 0.0f, main_stream), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(fork, main_stream), cudaSuccess);
    ASSERT_EQ(cudaStreamWaitEvent(side, fork, 0), cudaSuccess);
    ASSERT_EQ(cuda::LaunchL2Prefetch(w.p, w.n * sizeof(uint32_t), side), cudaSuccess);
  }
  ASSERT_EQ(cudaEventRecord(join, side), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(main_stream, join, 0), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(main_stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) {
    ASSERT_EQ(cudaGraphLaunch(exec, main_stream), cudaSuccess);
  }
  ASSERT_EQ(cudaStreamSynchronize(main_stream), cudaSuccess);
  EXPECT_EQ(acc.Get(), want.Get());  // the last layer's fill, seed 3
  EXPECT_EQ(w.Get(), weights);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaEventDestroy(fork);
  cudaEventDestroy(join);
  cudaStreamDestroy(side);
  cudaStreamDestroy(main_stream);
}

}  // namespace
}  // namespace flotilla::kernels
