// Drain, supervision and recovery with real processes: `flotilla up` drains
// its streams on SIGTERM, exits when its coordinator dies, restarts a killed
// worker; workers of a standalone coordinator come back when it is restarted.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <regex>
#include <sstream>
#include <thread>

#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "proto/flotilla.grpc.pb.h"
#include "tests/cluster_options.h"
#include "tests/grpc_stub.h"
#include "tools/cli/local_cluster.h"
#include "tools/cli/process_probe.h"

namespace flotilla {
namespace {

// One streamed generation; how it ended.
struct Outcome {
  grpc::Status status;
  common::FinishReason finish = common::FINISH_REASON_UNSPECIFIED;
  int tokens = 0;
};

Outcome Generate(const std::string& address, int max_tokens, std::atomic<int>* started = nullptr,
                 std::chrono::seconds deadline = std::chrono::seconds(60)) {
  auto stub = testing_util::PlainStub<v1::Flotilla>(address);
  v1::GenerateRequest req;
  for (int t : {1, 2, 3}) req.mutable_prompt_ids()->add_ids(t);
  req.mutable_sampling()->set_max_tokens(max_tokens);
  req.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  auto reader = stub->Generate(&ctx, req);
  Outcome out;
  v1::GenerateResponse resp;
  bool counted = false;
  while (reader->Read(&resp)) {
    out.tokens += resp.token_ids_size();
    if (!counted && out.tokens > 0 && started) {
      counted = true;
      started->fetch_add(1);
    }
    if (resp.finish_reason() != common::FINISH_REASON_UNSPECIFIED)
      out.finish = resp.finish_reason();
  }
  out.status = reader->Finish();
  return out;
}

// Waits until a short generation succeeds; how long that took (or `bound`+).
absl::Duration UntilServing(const std::string& address, absl::Duration bound) {
  const absl::Time start = absl::Now();
  while (absl::Now() - start < bound) {
    if (Generate(address, 2, nullptr, std::chrono::seconds(2)).status.ok()) {
      return absl::Now() - start;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::Now() - start;
}

bool Alive(pid_t pid) { return kill(pid, 0) == 0; }

// `flotilla up` as a child: its stdout read for the addresses it prints,
// its stderr kept in a file.
class Up {
 public:
  explicit Up(std::vector<std::string> args) {
    char dir[] = "/tmp/flotilla-recovery-XXXXXX";
    EXPECT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    int out[2];
    EXPECT_EQ(pipe(out), 0);
    // The tiny preset (1024-token vocabulary): steps of well under a millisecond.
    args.insert(args.begin(),
                {FLOTILLA_BIN, "up", "--model", "synthetic:tiny", "--listen", "127.0.0.1:0",
                 "--http-listen", "127.0.0.1:0", "--threads-per-worker", "1"});
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string err = dir_ + "/stderr";
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], 1);
      int fd = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 2);
      close(out[0]);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(out[1]);
    stdout_ = fdopen(out[0], "r");
  }
  ~Up() {
    // Only while up runs are its children surely ours (a pid is reused later).
    if (pid_ > 0 && !exited_) {
      for (pid_t p : Children()) kill(p, SIGKILL);
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (reader_.joinable()) reader_.join();
    if (stdout_) fclose(stdout_);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  // Reads stdout until the serving banner; false if up ended first.
  bool WaitServing() {
    char line[4096];
    static const std::regex grpc_re(R"(at (127\.0\.0\.1:\d+))");
    static const std::regex http_re(R"(http://(127\.0\.0\.1:\d+)/v1)");
    while (fgets(line, sizeof(line), stdout_) != nullptr) {
      std::cmatch m;
      if (std::regex_search(line, m, grpc_re) && address.empty()) address = m[1];
      if (std::regex_search(line, m, http_re)) http = m[1];
      if (std::string(line).find("Ctrl-C stops") != std::string::npos) {
        children_ = Children();
        // Keep reading: the children log there too, and a full pipe would stall them.
        reader_ = std::thread([this] {
          char more[4096];
          while (fgets(more, sizeof(more), stdout_) != nullptr) {
            std::lock_guard<std::mutex> lock(mu_);
            output_ += more;
          }
        });
        return !address.empty();
      }
    }
    return false;
  }
  std::vector<pid_t> Children() const {
    std::vector<pid_t> all = cli::ChildrenNamed(pid_, "flotilla-coordinator");
    for (pid_t w : cli::ChildrenNamed(pid_, "flotilla-worker")) all.push_back(w);
    return all;
  }
  // Waits up to `bound` for up to exit; its wait status, or -1.
  int WaitExit(absl::Duration bound) {
    const absl::Time deadline = absl::Now() + bound;
    while (absl::Now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        return status;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }
  // Everything up and its children wrote (stderr, then stdout after the banner).
  std::string Stderr() {
    std::ifstream in(dir_ + "/stderr");
    std::stringstream s;
    s << in.rdbuf();
    std::lock_guard<std::mutex> lock(mu_);
    return s.str() + output_;
  }
  pid_t pid() const { return pid_; }
  const std::vector<pid_t>& children() const { return children_; }
  // Its children of program `name` now.
  std::vector<pid_t> Named(const char* name) const { return cli::ChildrenNamed(pid_, name); }
  // Kills (SIGKILL) the `index`-th of its `name` children, which must number
  // `count`; the pid killed, or -1.
  pid_t KillChild(const char* name, size_t count, size_t index) const {
    const std::vector<pid_t> pids = Named(name);
    EXPECT_EQ(pids.size(), count);
    if (pids.size() <= index || kill(pids[index], SIGKILL) != 0) return -1;
    return pids[index];
  }
  // Up ended: none of the children it had is left.
  void ExpectNoChildLeft() const {
    for (pid_t child : children_) EXPECT_FALSE(Alive(child)) << "pid " << child << " is left";
  }

  std::string address, http;

 private:
  std::string dir_;
  pid_t pid_ = -1;
  FILE* stdout_ = nullptr;
  bool exited_ = false;
  std::vector<pid_t> children_;
  std::thread reader_;
  std::mutex mu_;
  std::string output_;
};

TEST(Recovery, SigtermToUpDrainsInFlightStreamsRefusesNewOnesAndLeavesNothing) {
  Up up({"--workers", "1", "--drain-timeout", "60"});
  ASSERT_TRUE(up.WaitServing()) << up.Stderr();
  ASSERT_EQ(up.children().size(), 2u);
  constexpr int kStreams = 16;
  // Long enough to be running well after the signal (seconds at 16 streams
  // on one core), short enough for a test of seconds.
  constexpr int kTokens = 600;
  std::atomic<int> started{0};
  std::vector<Outcome> outcomes(kStreams);
  std::vector<std::thread> streams;
  for (int i = 0; i < kStreams; ++i) {
    streams.emplace_back([&, i] { outcomes[i] = Generate(up.address, kTokens, &started); });
  }
  while (started < kStreams) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(kill(up.pid(), SIGTERM), 0);

  // Meanwhile: gRPC UNAVAILABLE, HTTP 503 with Retry-After.
  Outcome refused;
  const absl::Time signalled = absl::Now();
  do {
    refused = Generate(up.address, 2);
  } while (refused.status.ok() && absl::Now() - signalled < absl::Seconds(5));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << refused.status.error_message();
  EXPECT_NE(refused.status.error_message().find("shutting down"), std::string::npos)
      << refused.status.error_message();
  httplib::Client http("http://" + up.http);
  auto res = http.Post("/v1/completions", R"({"model": "x", "prompt": "hi", "max_tokens": 2})",
                       "application/json");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 503) << res->body;
  EXPECT_EQ(res->get_header_value("Retry-After"), "5");
  // Readiness says so too: a load balancer stops sending here.
  auto health = http.Get("/health");
  ASSERT_TRUE(health) << httplib::to_string(health.error());
  EXPECT_EQ(health->status, 503) << health->body;
  EXPECT_NE(health->body.find("DRAINING"), std::string::npos) << health->body;

  for (std::thread& t : streams) t.join();
  int finished = 0;
  for (const Outcome& o : outcomes) {
    EXPECT_TRUE(o.status.ok()) << o.status.error_message();
    EXPECT_EQ(o.finish, common::LENGTH);
    finished += o.tokens == kTokens ? 1 : 0;
  }
  EXPECT_EQ(finished, kStreams);
  const int status = up.WaitExit(absl::Seconds(20));
  ASSERT_NE(status, -1) << "flotilla up did not exit: " << up.Stderr();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << up.Stderr();
  up.ExpectNoChildLeft();
  // The coordinator's own account: every stream (and perhaps a short probe
  // sent before the drain began) was in flight when it began to drain, and
  // all of them finished.
  const std::string log = up.Stderr();
  std::smatch drained;
  ASSERT_TRUE(std::regex_search(
      log, drained, std::regex(R"(drained: (\d+) of (\d+) requests in flight finished)")))
      << log;
  EXPECT_EQ(drained[1], drained[2]) << log;
  EXPECT_GE(std::stoi(drained[2]), kStreams) << log;
}

TEST(Recovery, ASecondSignalStopsAtOnceAndEndsTheStreamsWithAReason) {
  Up up({"--workers", "1", "--drain-timeout", "60"});
  ASSERT_TRUE(up.WaitServing()) << up.Stderr();
  constexpr int kStreams = 4;
  std::atomic<int> started{0};
  std::vector<Outcome> outcomes(kStreams);
  std::vector<std::thread> streams;
  for (int i = 0; i < kStreams; ++i) {
    // Far longer than the test: only the second signal can end them.
    streams.emplace_back([&, i] { outcomes[i] = Generate(up.address, 4000, &started); });
  }
  while (started < kStreams) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(kill(up.pid(), SIGTERM), 0);
  // The second signal once the first began the drain (up says so).
  for (int i = 0; i < 3000 && up.Stderr().find("draining:") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_NE(up.Stderr().find("draining:"), std::string::npos) << up.Stderr();
  ASSERT_EQ(kill(up.pid(), SIGTERM), 0);
  const absl::Time second = absl::Now();
  for (std::thread& t : streams) t.join();
  EXPECT_LT(absl::Now() - second, absl::Seconds(5));
  for (const Outcome& o : outcomes) {
    EXPECT_EQ(o.status.error_code(), grpc::StatusCode::UNAVAILABLE) << o.status.error_message();
    EXPECT_NE(o.status.error_message().find("second signal"), std::string::npos)
        << o.status.error_message();
  }
  const int status = up.WaitExit(absl::Seconds(5));
  ASSERT_NE(status, -1) << "flotilla up did not exit: " << up.Stderr();
  up.ExpectNoChildLeft();
}

TEST(Recovery, UpExitsNonZeroWithin5sWhenItsCoordinatorIsKilled) {
  Up up({"--workers", "1"});
  ASSERT_TRUE(up.WaitServing()) << up.Stderr();
  ASSERT_NE(up.KillChild("flotilla-coordinator", 1, 0), -1);
  const int status = up.WaitExit(absl::Seconds(5));
  ASSERT_NE(status, -1) << "flotilla up still runs 5 s after its coordinator died";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0);
  EXPECT_NE(up.Stderr().find("flotilla-coordinator exited (killed by signal 9)"), std::string::npos)
      << up.Stderr();
  up.ExpectNoChildLeft();
}

TEST(Recovery, UpRestartsAKilledWorkerAndServesAgainWithin5s) {
  Up up({"--workers", "2"});
  ASSERT_TRUE(up.WaitServing()) << up.Stderr();
  const pid_t killed = up.KillChild("flotilla-worker", 2, 1);
  ASSERT_NE(killed, -1);
  const absl::Duration back = UntilServing(up.address, absl::Seconds(5));
  EXPECT_LT(back, absl::Seconds(5)) << up.Stderr();
  std::vector<pid_t> now = up.Named("flotilla-worker");
  EXPECT_EQ(now.size(), 2u);
  EXPECT_EQ(std::count(now.begin(), now.end(), killed), 0);
  EXPECT_NE(up.Stderr().find("worker-1 exited (killed by signal 9)"), std::string::npos)
      << up.Stderr();
  std::cerr << "served again " << absl::FormatDuration(back) << " after the kill\n";
}

TEST(Recovery, WorkersOfARestartedStandaloneCoordinatorServeWithin10s) {
  cli::LocalClusterOptions o = testing_util::TestClusterOptions("synthetic:tiny", 2);
  o.http_listen = "";
  auto cluster = cli::LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string address = (*cluster)->address();
  const std::vector<pid_t> workers = {(*cluster)->worker_pid(0), (*cluster)->worker_pid(1)};
  ASSERT_TRUE((*cluster)->KillCoordinator().ok());
  EXPECT_TRUE((*cluster)->Supervise().code() == absl::StatusCode::kUnavailable);
  ASSERT_TRUE((*cluster)->RestartCoordinator().ok());
  const absl::Duration back = UntilServing(address, absl::Seconds(10));
  EXPECT_LT(back, absl::Seconds(10));
  // The workers waited for it rather than exit: the same processes serve
  // (Supervise would have restarted an exited one under a new pid).
  EXPECT_TRUE((*cluster)->CheckAlive().ok()) << (*cluster)->CheckAlive();
  for (int i = 0; i < 2; ++i) EXPECT_EQ((*cluster)->worker_pid(i), workers[i]);
  std::cerr << "served again " << absl::FormatDuration(back) << " after the restart\n";
}

// A short soak: the program runs its mix against a cluster it starts, kills
// a worker, and its last JSON line shows nothing lost, hung or wrongly answered.
TEST(Recovery, ShortSoakLosesNothing) {
  const std::string command =
      std::string(FLOTILLA_BIN) +
      " bench soak --workers 1 --model synthetic:tiny --duration 6 --kill-every 3 "
      "--report-every 3 --concurrency 4 --hang-after 20 2>/dev/null";
  FILE* p = popen(command.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string last;
  char line[8192];
  // The cluster's processes log to the same stdout: keep the JSON lines.
  while (fgets(line, sizeof(line), p) != nullptr) {
    if (line[0] == '{') last = line;
  }
  const int status = pclose(p);
  const nlohmann::json report = nlohmann::json::parse(last, nullptr, false);
  ASSERT_FALSE(report.is_discarded()) << last;
  EXPECT_TRUE(report.value("final", false)) << last;
  EXPECT_GT(report.value("requests", 0), 0) << last;
  EXPECT_GT(report.value("ok", 0), 0) << last;
  EXPECT_GT(report.value("refused", 0), 0) << last;
  EXPECT_GE(report.value("kills", 0), 1) << last;
  EXPECT_EQ(report.value("lost", -1), 0) << last;
  EXPECT_EQ(report.value("hung", -1), 0) << last;
  EXPECT_EQ(report.value("wrong", -1), 0) << last;
  EXPECT_TRUE(report.contains("coordinator_rss_kb")) << last;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << last;
}

}  // namespace
}  // namespace flotilla
