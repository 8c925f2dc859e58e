// The device ParallelContext with its ranks in separate processes: the test
// starts this binary again once per rank (all on one GPU when there is only
// one: cuda-ipc maps buffers between processes of the same GPU), the ranks
// bootstrap through files (comm/file) and check their own results against
// the host reference; the test checks their exit status. Every GPU test
// skips where no GPU is present.
#include "worker/parallel/device_context.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/file/file_communicator.h"
#include "common/model_config.h"
#include "kernels/cuda/device.h"
#include "tests/parallel/process_group.h"
#include "tests/parallel/rank_checks.h"

namespace flotilla::parallel::testing {
namespace {

constexpr char kPeerFlag[] = "--device-context-peer";

struct PeerArgs {
  std::string scenario;  // "exchange", "stall" or "interrupt"
  int rank = 0;
  int world = 1;
  int tp = 1;
  std::string dir;
  std::string transport;  // "ipc", "nccl" or "auto"
  int timeout_ms = 60000;
};

std::vector<std::string> PeerCommandLine(const PeerArgs& a) {
  return {kPeerFlag,
          a.scenario,
          std::to_string(a.rank),
          std::to_string(a.world),
          std::to_string(a.tp),
          a.dir,
          a.transport,
          std::to_string(a.timeout_ms)};
}

DeviceTransport TransportNamed(const std::string& name) {
  if (name == "ipc") return DeviceTransport::kCudaIpc;
  if (name == "nccl") return DeviceTransport::kNccl;
  return DeviceTransport::kAuto;
}

absl::StatusOr<std::unique_ptr<ParallelContext>> MakeContext(
    const PeerArgs& a, const Scenario& s, comm::Communicator& host,
    std::shared_ptr<const std::atomic<bool>> interrupt) {
  auto config = ParallelConfig::Create(a.world, a.tp, ModelConfig::Gptoss120b());
  if (!config.ok()) return config.status();
  DeviceContextOptions o;
  o.device = a.rank % std::max(1, kernels::cuda::DeviceCount());
  o.transport = TransportNamed(a.transport);
  o.hidden = s.hidden;
  o.top_k = s.top_k;
  o.max_tokens_per_step = s.max_tokens;
  o.timeout = absl::Milliseconds(a.timeout_ms);
  o.interrupt = std::move(interrupt);
  return CreateDeviceContext(*config, ScenarioMap(s), a.rank, host, o);
}

bool WaitForFile(const std::string& path, std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!std::filesystem::exists(path)) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

absl::Status RunExchange(const Scenario& s, ParallelContext& context, cudaStream_t stream) {
  if (absl::Status st = CheckSteps(s, context, 6, stream); !st.ok()) return st;
  if (absl::Status st = CheckAllReduces(s, context, stream); !st.ok()) return st;
  if (absl::Status st = CheckLinearTpSum(s, context, stream); !st.ok()) return st;
  return CheckGraphReplays(s, context, stream);
}

// The last rank creates its context and then takes no part; the others must
// find it through CheckHealth (UNAVAILABLE naming it) instead of hanging,
// and every later call must fail at once.
absl::Status RunStall(const PeerArgs& a, const Scenario& s, ParallelContext& context,
                      cudaStream_t stream) {
  const std::string done = a.dir + "/done";
  if (a.rank == a.world - 1) {
    if (!WaitForFile(done, std::chrono::seconds(120))) return absl::InternalError("never released");
    return absl::OkStatus();
  }
  const auto start = std::chrono::steady_clock::now();
  absl::Status st = CheckSteps(s, context, 1, stream);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const absl::Status health = context.CheckHealth();
  std::printf("rank %d: after %.2f s: steps: %s; health: %s\n", a.rank, seconds,
              st.ToString().c_str(), health.ToString().c_str());
  auto again = context.ep().Dispatch(0, nullptr, nullptr, nullptr, 0, stream);
  if (a.rank == 0) std::ofstream(done) << "done\n";
  if (!absl::IsUnavailable(health)) return absl::InternalError("health is not UNAVAILABLE");
  if (health.message().find(absl::StrCat("rank ", a.world - 1)) == absl::string_view::npos) {
    return absl::InternalError("health does not name the stalled rank");
  }
  if (!absl::IsUnavailable(again.status())) {
    return absl::InternalError("a call after the failure did not give UNAVAILABLE");
  }
  return absl::OkStatus();
}

// Every rank runs a step together; then the last rank takes no part, and
// the others enqueue one more Dispatch, which (over NCCL) waits on the device
// for good, until the interrupt is raised: WaitForStream must then give
// UNAVAILABLE, leave the stream drained, and every later call must fail.
absl::Status RunInterrupt(const PeerArgs& a, const Scenario& s, ParallelContext& context,
                          std::atomic<bool>& interrupt, cudaStream_t stream) {
  const std::string done = a.dir + "/done";
  if (absl::Status st = CheckSteps(s, context, 1, stream); !st.ok()) return st;
  if (a.rank == a.world - 1) {
    if (!WaitForFile(done, std::chrono::seconds(120))) return absl::InternalError("never released");
    return absl::OkStatus();
  }
  void* scratch = nullptr;
  const size_t x_bytes = static_cast<size_t>(s.hidden) * sizeof(uint16_t);
  const size_t k_bytes = static_cast<size_t>(s.top_k) * sizeof(int32_t);
  if (cudaMalloc(&scratch, x_bytes + 2 * k_bytes) != cudaSuccess ||
      cudaMemset(scratch, 0, x_bytes + 2 * k_bytes) != cudaSuccess) {
    return absl::InternalError("cudaMalloc");
  }
  const auto* ids = reinterpret_cast<const int32_t*>(static_cast<char*>(scratch) + x_bytes);
  const auto* weights = reinterpret_cast<const float*>(ids + s.top_k);
  context.ep().SetStepTokens(1);
  std::thread raise([&interrupt] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    interrupt.store(true);
  });
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<ExpertRows> rows = context.ep().Dispatch(0, scratch, ids, weights, 1, stream);
  absl::Status waited = rows.ok() ? context.WaitForStream(stream) : rows.status();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  raise.join();
  context.Abort();  // no graph captured the exchanges: the kernels exit
  const cudaError_t drained = cudaStreamSynchronize(stream);
  auto again = context.ep().Dispatch(0, scratch, ids, weights, 1, stream);
  std::printf("rank %d: after %.2f s: %s; stream %s; again: %s\n", a.rank, seconds,
              waited.ToString().c_str(), cudaGetErrorString(drained),
              again.status().ToString().c_str());
  if (a.rank == 0) std::ofstream(done) << "done\n";
  cudaFree(scratch);
  if (!absl::IsUnavailable(waited)) return absl::InternalError("the wait did not give UNAVAILABLE");
  if (drained != cudaSuccess) return absl::InternalError("the stream did not drain");
  if (!absl::IsUnavailable(again.status())) {
    return absl::InternalError("a call after the interrupt did not give UNAVAILABLE");
  }
  return absl::OkStatus();
}

int RunPeer(const PeerArgs& a) {
  Scenario s;
  s.world = a.world;
  s.tp = a.tp;
  auto interrupt = std::make_shared<std::atomic<bool>>(false);
  auto host = comm::FileCommunicator::Create(a.dir, a.rank, a.world);
  absl::StatusOr<std::unique_ptr<ParallelContext>> context =
      host.ok() ? MakeContext(a, s, **host, interrupt) : host.status();
  if (!context.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", a.rank, context.status().ToString().c_str());
    return 1;
  }
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  const absl::Status st = a.scenario == "stall"       ? RunStall(a, s, **context, stream)
                          : a.scenario == "interrupt" ? RunInterrupt(a, s, **context, *interrupt, stream)
                                                      : RunExchange(s, **context, stream);
  std::printf("rank %d (%s, world %d, tp %d): %s\n", a.rank, (*context)->backend().c_str(), a.world,
              a.tp, st.ToString().c_str());
  cudaStreamDestroy(stream);
  return st.ok() ? 0 : 1;
}

// Runs `world` peers and expects every one to succeed.
void RunGroup(PeerArgs args, int world, std::chrono::seconds limit) {
  ProcessGroup group;
  args.world = world;
  args.dir = group.dir();
  for (int r = 0; r < world; ++r) {
    args.rank = r;
    ASSERT_TRUE(group.Start(PeerCommandLine(args)));
  }
  group.Wait(limit);
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(group.rank(r).exit_code, 0) << "rank " << r << " log:\n" << group.rank(r).log;
  }
}

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kernels::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device present";
  }
};

TEST(DeviceContextArgumentsTest, RejectsShapesTheKernelsCannotTake) {
  const Scenario s;
  auto config = ParallelConfig::Create(1, 1, ModelConfig::Gptoss120b());
  ASSERT_TRUE(config.ok());
  auto host = comm::FileCommunicator::Create("/tmp", 0, 1);
  ASSERT_TRUE(host.ok());
  DeviceContextOptions o;
  o.hidden = 2884;  // not a multiple of 8
  o.top_k = 4;
  o.max_tokens_per_step = 8;
  auto context = CreateDeviceContext(*config, ScenarioMap({.world = 1}), 0, **host, o);
  EXPECT_TRUE(absl::IsInvalidArgument(context.status())) << context.status();
  o.hidden = 2880;
  o.device = 1000;
  context = CreateDeviceContext(*config, ScenarioMap({.world = 1}), 0, **host, o);
  EXPECT_TRUE(absl::IsFailedPrecondition(context.status())) << context.status();
}

class SingleRankTest : public GpuTest, public ::testing::WithParamInterface<std::string> {};

// One rank in this process: the whole path (plan, segments, padding, graph
// capture) without peers; for nccl the only size a one-GPU machine can run.
TEST_P(SingleRankTest, ExchangesWithItself) {
#if !FLOTILLA_WITH_NCCL
  if (GetParam() == "nccl") GTEST_SKIP() << "built without NCCL";
#endif
  ProcessGroup files;
  PeerArgs a;
  a.scenario = "exchange";
  a.dir = files.dir();
  a.transport = GetParam();
  EXPECT_EQ(RunPeer(a), 0);
}

INSTANTIATE_TEST_SUITE_P(Transports, SingleRankTest, ::testing::Values("ipc", "nccl"));

class IpcProcessesTest : public GpuTest,
                         public ::testing::WithParamInterface<std::tuple<int, int>> {};

TEST_P(IpcProcessesTest, DispatchCombineAndAllReduceMatchTheHostReference) {
  const auto [world, tp] = GetParam();
  PeerArgs a;
  a.scenario = "exchange";
  a.tp = tp;
  a.transport = "ipc";
  RunGroup(a, world, std::chrono::seconds(240));
}

INSTANTIATE_TEST_SUITE_P(WorldsAndTp, IpcProcessesTest,
                         ::testing::Values(std::make_tuple(2, 1), std::make_tuple(2, 2),
                                           std::make_tuple(4, 1), std::make_tuple(4, 2),
                                           std::make_tuple(4, 4)));

TEST_F(GpuTest, StalledPeerIsReportedByCheckHealth) {
  PeerArgs a;
  a.scenario = "stall";
  a.transport = "ipc";
  a.timeout_ms = 500;
  RunGroup(a, 2, std::chrono::seconds(120));
}

class NcclProcessesTest : public GpuTest,
                          public ::testing::WithParamInterface<std::tuple<int, int>> {};

TEST_P(NcclProcessesTest, DispatchCombineAndAllReduceMatchTheHostReference) {
#if !FLOTILLA_WITH_NCCL
  GTEST_SKIP() << "built without NCCL";
#endif
  const auto [world, tp] = GetParam();
  const int gpus = kernels::cuda::DeviceCount();
  if (gpus < world) {
    GTEST_SKIP() << "NCCL needs a GPU per rank: " << world << ", " << gpus << " found";
  }
  PeerArgs a;
  a.scenario = "exchange";
  a.tp = tp;
  a.transport = "nccl";
  RunGroup(a, world, std::chrono::seconds(240));
}

// A peer that stops taking part leaves NCCL's kernels waiting for good; the
// interrupt (the coordinator dropping the generation) must end the wait.
TEST_F(GpuTest, NcclWaitOnAStalledPeerEndsAtTheInterrupt) {
#if !FLOTILLA_WITH_NCCL
  GTEST_SKIP() << "built without NCCL";
#endif
  if (kernels::cuda::DeviceCount() < 2) GTEST_SKIP() << "NCCL needs a GPU per rank";
  PeerArgs a;
  a.scenario = "interrupt";
  a.transport = "nccl";
  a.timeout_ms = 10000;  // also bounds the idle rank's ncclCommFinalize
  RunGroup(a, 2, std::chrono::seconds(120));
}

// Every TP size that divides gpt-oss's 8 KV heads, as far as the GPUs go.
INSTANTIATE_TEST_SUITE_P(WorldsAndTp, NcclProcessesTest,
                         ::testing::Values(std::make_tuple(2, 1), std::make_tuple(2, 2),
                                           std::make_tuple(4, 1), std::make_tuple(4, 2),
                                           std::make_tuple(4, 4), std::make_tuple(8, 2),
                                           std::make_tuple(8, 8)));

}  // namespace
}  // namespace flotilla::parallel::testing

int main(int argc, char** argv) {
  using flotilla::parallel::testing::PeerArgs;
  if (argc == 9 && std::string(argv[1]) == flotilla::parallel::testing::kPeerFlag) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // a rank never outlives the test
    PeerArgs a;
    a.scenario = argv[2];
    a.rank = std::stoi(argv[3]);
    a.world = std::stoi(argv[4]);
    a.tp = std::stoi(argv[5]);
    a.dir = argv[6];
    a.transport = argv[7];
    a.timeout_ms = std::stoi(argv[8]);
    return flotilla::parallel::testing::RunPeer(a);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
