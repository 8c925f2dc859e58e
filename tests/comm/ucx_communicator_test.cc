// UCX communicator across real processes: the test starts comm_ucx_peer once
// per rank (fork + exec) and checks their exit status.
#include "comm/ucx/ucx_communicator.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace flotilla::comm {
namespace {

namespace fs = std::filesystem;

struct Peer {
  pid_t pid = -1;
  int exit_code = -1;  // -1 while running or when killed
  std::string log;
};

class UcxProcessGroup {
 public:
  explicit UcxProcessGroup(int size) : size_(size) {
    char tmpl[] = "/tmp/flotilla_ucx_test.XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  ~UcxProcessGroup() {
    for (Peer& p : peers_) {
      if (p.pid > 0 && p.exit_code == -1) {
        kill(p.pid, SIGKILL);
        waitpid(p.pid, nullptr, 0);
      }
    }
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  void Start(const std::string& scenario, int timeout_ms, bool detect_peer_failure) {
    for (int r = 0; r < size_; ++r) {
      const std::string log = dir_ + "/log." + std::to_string(r);
      std::vector<std::string> args = {FLOTILLA_UCX_PEER,
                                       "--rank",
                                       std::to_string(r),
                                       "--size",
                                       std::to_string(size_),
                                       "--dir",
                                       dir_,
                                       "--scenario",
                                       scenario,
                                       "--timeout-ms",
                                       std::to_string(timeout_ms),
                                       "--detect-peer-failure",
                                       detect_peer_failure ? "true" : "false"};
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      posix_spawn_file_actions_t actions;
      posix_spawn_file_actions_init(&actions);
      posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                       0644);
      posix_spawn_file_actions_adddup2(&actions, 1, 2);
      Peer p;
      const int rc = posix_spawn(&p.pid, argv[0], &actions, nullptr, argv.data(), environ);
      posix_spawn_file_actions_destroy(&actions);
      ASSERT_EQ(rc, 0) << "cannot start " << argv[0];
      peers_.push_back(p);
    }
  }

  // Waits until `file` exists in the group's folder.
  bool WaitForFile(const std::string& file, std::chrono::milliseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (!fs::exists(dir_ + "/" + file)) {
      if (std::chrono::steady_clock::now() > end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }

  // Kills `rank` and, once it is gone, writes killed.<rank>.
  void Kill(int rank) {
    Peer& p = peers_[static_cast<size_t>(rank)];
    kill(p.pid, SIGKILL);
    waitpid(p.pid, nullptr, 0);
    p.exit_code = -2;
    std::ofstream(dir_ + "/killed." + std::to_string(rank)) << "killed\n";
  }

  // Waits for every running peer (killing stragglers after `limit`), then
  // reads the logs.
  void Wait(std::chrono::milliseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    for (Peer& p : peers_) {
      while (p.exit_code == -1) {
        int status = 0;
        const pid_t got = waitpid(p.pid, &status, WNOHANG);
        if (got == p.pid) {
          p.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        } else if (std::chrono::steady_clock::now() > end) {
          kill(p.pid, SIGKILL);
          waitpid(p.pid, nullptr, 0);
          p.exit_code = 999;  // hung
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
      }
    }
    for (size_t r = 0; r < peers_.size(); ++r) {
      std::ifstream in(dir_ + "/log." + std::to_string(r));
      std::stringstream ss;
      ss << in.rdbuf();
      peers_[r].log = ss.str();
    }
  }

  const Peer& peer(int r) const { return peers_[static_cast<size_t>(r)]; }

  // After Wait: expects ranks 0..n-1 to have exited 0 and, with
  // `saw_unavailable`, to have logged UNAVAILABLE (each failure shows the log).
  void ExpectExitedCleanly(int n, bool saw_unavailable) const {
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(peer(r).exit_code, 0) << "rank " << r << " log:\n" << peer(r).log;
      if (saw_unavailable) {
        EXPECT_NE(peer(r).log.find("UNAVAILABLE"), std::string::npos) << peer(r).log;
      }
    }
  }

 private:
  int size_;
  std::string dir_;
  std::vector<Peer> peers_;
};

// Parameters: world size, and whether UCX reports peer failures (TCP only in
// UCX 1.13) or not (shared memory allowed; the timeout finds dead peers).
class UcxCollectivesTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(UcxCollectivesTest, EveryCollectiveAcrossProcesses) {
  const auto [w, detect] = GetParam();
  UcxProcessGroup group(w);
  group.Start("checks", 20000, detect);
  group.Wait(std::chrono::seconds(120));
  group.ExpectExitedCleanly(w, /*saw_unavailable=*/false);
}

INSTANTIATE_TEST_SUITE_P(Worlds, UcxCollectivesTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Bool()));

class UcxPeerDeathTest : public ::testing::TestWithParam<std::tuple<int, bool>> {
 protected:
  static constexpr int kTimeoutMs = 2000;

  // Starts W ranks running `mode` (peer-failure detection as the parameter
  // says), kills the last once it is ready, gives the survivors `wait` to
  // end, and expects each to have exited 0 after seeing UNAVAILABLE.
  void ExpectSurvivorsSeeUnavailable(const std::string& mode, std::chrono::milliseconds wait) {
    const auto [w, detect] = GetParam();
    UcxProcessGroup group(w);
    group.Start(mode, kTimeoutMs, detect);
    ASSERT_TRUE(group.WaitForFile("ready." + std::to_string(w - 1), std::chrono::seconds(60)));
    group.Kill(w - 1);
    group.Wait(wait);
    group.ExpectExitedCleanly(w - 1, /*saw_unavailable=*/true);
  }
};

TEST_P(UcxPeerDeathTest, KilledPeerGivesUnavailableWithinTheTimeout) {
  // The survivors must be done well before the test gives up on them.
  ExpectSurvivorsSeeUnavailable("die", std::chrono::milliseconds(kTimeoutMs * 4));
}

// A peer killed while its large messages (UCX rendezvous) are announced but
// not yet fetched: the survivors, which reach the all-to-all only after it
// died, must get UNAVAILABLE, not be taken down by the transport (UCX aborts
// the process when a single-copy read from a dead process fails on an
// endpoint without peer-failure handling).
TEST_P(UcxPeerDeathTest, PeerKilledWithMessagesInFlightLeavesTheSurvivorsRunning) {
  // Without peer-failure detection: the timeout, then up to 2 s more while
  // the failed call waits out the transfers it had started.
  ExpectSurvivorsSeeUnavailable("die-sending", std::chrono::milliseconds(kTimeoutMs * 4 + 2000));
}

// The coordinator hands each generation's ranks a secret that keys their
// message tags. Ranks sharing it run every collective; ranks that do not
// share it match none of each other's messages, so a process that knows a
// worker's address but not the secret cannot deliver anything into a group.
TEST(UcxCommunicatorTest, KeyedTagsCarryEveryCollective) {
  UcxProcessGroup group(3);
  group.Start("keyed", 20000, /*detect_peer_failure=*/false);
  group.Wait(std::chrono::seconds(120));
  group.ExpectExitedCleanly(3, /*saw_unavailable=*/false);
}

TEST(UcxCommunicatorTest, RanksWithoutTheSameSecretCannotFormAGroup) {
  UcxProcessGroup group(2);
  group.Start("mismatch", 2000, /*detect_peer_failure=*/false);
  group.Wait(std::chrono::seconds(60));
  group.ExpectExitedCleanly(2, /*saw_unavailable=*/true);
}

INSTANTIATE_TEST_SUITE_P(Worlds, UcxPeerDeathTest,
                         ::testing::Combine(::testing::Values(2, 3, 4), ::testing::Bool()));

TEST(UcxCommunicatorTest, SingleRankInProcess) {
  auto worker = UcxWorker::Create();
  ASSERT_TRUE(worker.ok()) << worker.status();
  const std::string addr = (*worker)->Address();
  auto comm = UcxCommunicator::Create(std::move(*worker), 0, {addr});
  ASSERT_TRUE(comm.ok()) << comm.status();
  float x[3] = {1.f, 2.f, 3.f};
  EXPECT_TRUE((*comm)->AllReduce(x, 3, DataType::kF32).ok());
  EXPECT_EQ(x[2], 3.f);
  EXPECT_TRUE((*comm)->Barrier().ok());
}

TEST(UcxCommunicatorTest, RejectsBadBootstrapBytes) {
  auto worker = UcxWorker::Create();
  ASSERT_TRUE(worker.ok()) << worker.status();
  const std::string mine = (*worker)->Address();
  auto st = UcxCommunicator::Create(std::move(*worker), 0, {mine, "not an address"}).status();
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_NE(std::string(st.message()).find("rank 1"), std::string::npos) << st;

  auto w2 = UcxWorker::Create();
  ASSERT_TRUE(w2.ok());
  const std::string a2 = (*w2)->Address();
  st = UcxCommunicator::Create(std::move(*w2), 0, {a2, a2.substr(0, a2.size() - 3)}).status();
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;

  auto w3 = UcxWorker::Create();
  ASSERT_TRUE(w3.ok());
  st = UcxCommunicator::Create(std::move(*w3), 1, {a2}).status();
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  auto w4 = UcxWorker::Create();
  ASSERT_TRUE(w4.ok());
  st = UcxCommunicator::Create(std::move(*w4), 0, {a2}).status();
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;  // not its own address
}

TEST(UcxCommunicatorTest, SilentPeerMakesCreateUnavailable) {
  auto quiet = UcxWorker::Create();  // exists, but nobody drives it
  auto worker = UcxWorker::Create();
  ASSERT_TRUE(quiet.ok() && worker.ok());
  UcxOptions options;
  options.timeout = absl::Milliseconds(300);
  const std::string mine = (*worker)->Address();
  auto st =
      UcxCommunicator::Create(std::move(*worker), 0, {mine, (*quiet)->Address()}, options).status();
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
}

// A survivor waiting on a dead peer gives up as soon as its owner raises the
// interrupt (the worker does when the coordinator says the peer is gone), not
// after the timeout.
TEST(UcxCommunicatorTest, InterruptEndsAWaitAtOnce) {
  auto quiet = UcxWorker::Create();
  auto worker = UcxWorker::Create();
  ASSERT_TRUE(quiet.ok() && worker.ok());
  UcxOptions options;
  options.timeout = absl::Seconds(60);
  auto interrupt = std::make_shared<std::atomic<bool>>(false);
  options.interrupt = interrupt;
  const std::string mine = (*worker)->Address();
  std::thread raiser([interrupt] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    interrupt->store(true);
  });
  const absl::Time start = absl::Now();
  auto st =
      UcxCommunicator::Create(std::move(*worker), 0, {mine, (*quiet)->Address()}, options).status();
  const absl::Duration took = absl::Now() - start;
  raiser.join();
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_NE(std::string(st.message()).find("interrupted"), std::string::npos) << st;
  EXPECT_LT(took, absl::Seconds(5)) << "waited out the timeout instead";
}

TEST(UcxCommunicatorTest, BadUcxSettingIsRejected) {
  UcxOptions options;
  options.config_defaults = {{"RNDV_THRESH", "lots"}};
  auto st = UcxWorker::Create(options).status();
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_NE(std::string(st.message()).find("RNDV_THRESH"), std::string::npos) << st;
}

}  // namespace
}  // namespace flotilla::comm
