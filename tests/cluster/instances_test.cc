// Several model instances behind one coordinator, with real processes: a
// greedy request whose instance loses a worker mid-stream continues on the
// other instance with exactly the tokens of an undisturbed run; a rolling
// restart of every instance under load fails nothing; `flotilla bench soak`
// killing a worker every 15 s fails nothing.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "proto/admin.grpc.pb.h"
#include "tests/cluster/greedy_client.h"
#include "tests/cluster_options.h"
#include "tests/grpc_stub.h"
#include "tests/run_command.h"
#include "tools/cli/local_cluster.h"

namespace flotilla {
namespace {

using cluster_test::GreedyGenerate;
using cluster_test::GreedyOptions;
using cluster_test::Streamed;

// 4 CPU workers of the tiny preset as 2 instances of TP 2 (migration is on
// by default with several instances).
std::unique_ptr<cli::LocalCluster> StartInstances() {
  cli::LocalClusterOptions o = testing_util::TestClusterOptions("synthetic:tiny", 4, 2);
  o.instances = 2;
  absl::StatusOr<std::unique_ptr<cli::LocalCluster>> c = cli::LocalCluster::Start(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

admin::ClusterStatus GetStatus(const std::string& address) {
  auto stub = testing_util::PlainStub<admin::Admin>(address);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  admin::ClusterStatus s;
  grpc::Status st = stub->GetStatus(&ctx, admin::GetStatusRequest(), &s);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return s;
}

grpc::Status DrainInstance(const std::string& address, uint32_t instance, bool drained,
                           admin::DrainResult* result) {
  auto stub = testing_util::PlainStub<admin::Admin>(address);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  admin::DrainRequest req;
  req.set_instance(instance);
  return drained ? stub->Drain(&ctx, req, result) : stub->Undrain(&ctx, req, result);
}

// Index of worker `id` ("worker-N") for LocalCluster::KillWorker.
int WorkerIndex(const std::string& id) { return std::stoi(id.substr(id.rfind('-') + 1)); }

// Waits (restarting what exits) until every instance serves.
bool WaitAllServing(cli::LocalCluster& c, absl::Duration bound) {
  const absl::Time until = absl::Now() + bound;
  while (absl::Now() < until) {
    EXPECT_TRUE(c.Supervise().ok());
    const admin::ClusterStatus s = GetStatus(c.address());
    bool all = s.instances_size() > 0;
    for (const admin::InstanceStatus& i : s.instances()) all = all && i.state() == admin::READY;
    if (all) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

const std::vector<int32_t> kPrompt = {11, 12, 13, 14, 15, 16, 17};

TEST(Instances, StatusListsBothInstancesAndEachWorkersInstance) {
  auto c = StartInstances();
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(WaitAllServing(*c, absl::Seconds(30)));
  const admin::ClusterStatus s = GetStatus(c->address());
  ASSERT_EQ(s.instances_size(), 2);
  EXPECT_EQ(s.state(), admin::READY);
  int per[2] = {0, 0};
  for (const admin::WorkerStatus& w : s.workers()) {
    ASSERT_GE(w.instance(), 0);
    ASSERT_LT(w.instance(), 2);
    ++per[w.instance()];
  }
  EXPECT_EQ(per[0], 2);
  EXPECT_EQ(per[1], 2);
}

// An expert map read from instance 1, changed and sent back changes
// instance 1's map only; a map for an instance that does not exist is
// INVALID_ARGUMENT naming it.
TEST(Instances, ExpertMapsAreReadAndSetPerInstance) {
  auto c = StartInstances();
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(WaitAllServing(*c, absl::Seconds(30)));
  auto stub = testing_util::PlainStub<admin::Admin>(c->address());
  auto get = [&](uint32_t instance) {
    grpc::ClientContext ctx;
    admin::GetExpertMapRequest req;
    req.set_instance(instance);
    cluster::ExpertMap map;
    EXPECT_TRUE(stub->GetExpertMap(&ctx, req, &map).ok());
    return map;
  };
  const cluster::ExpertMap first = get(0), second = get(1);
  EXPECT_EQ(first.instance(), 0u);
  EXPECT_EQ(second.instance(), 1u);
  cluster::ExpertMap next = second;
  next.set_version(second.version() + 1);
  {
    grpc::ClientContext ctx;
    cluster::ExpertMap applied;
    grpc::Status st = stub->SetExpertMap(&ctx, next, &applied);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(applied.instance(), 1u);
    EXPECT_EQ(applied.version(), second.version() + 1);
  }
  EXPECT_EQ(get(1).version(), second.version() + 1);
  EXPECT_EQ(get(0).version(), first.version());
  cluster::ExpertMap nowhere = next;
  nowhere.set_instance(5);
  grpc::ClientContext ctx;
  cluster::ExpertMap out;
  grpc::Status st = stub->SetExpertMap(&ctx, nowhere, &out);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("no instance 5"), std::string::npos) << st.error_message();
}

TEST(Instances, GreedyRequestMovedMidStreamGivesTheUndisturbedTokens) {
  auto c = StartInstances();
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(WaitAllServing(*c, absl::Seconds(30)));
  constexpr int kTokens = 3000;
  GreedyOptions greedy;
  greedy.ignore_eos = true;
  const Streamed undisturbed = GreedyGenerate(c->address(), kPrompt, kTokens, greedy);
  ASSERT_TRUE(undisturbed.status.ok()) << undisturbed.status.error_message();
  ASSERT_EQ(undisturbed.tokens.size(), static_cast<size_t>(kTokens));

  std::atomic<bool> first{false};
  greedy.first = &first;
  Streamed moved;
  std::thread client([&] { moved = GreedyGenerate(c->address(), kPrompt, kTokens, greedy); });
  while (!first.load()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  // Kill a worker of the instance running it.
  const admin::ClusterStatus s = GetStatus(c->address());
  int busy = -1;
  for (const admin::InstanceStatus& i : s.instances()) {
    if (i.requests_in_flight() > 0) busy = static_cast<int>(i.id());
  }
  ASSERT_GE(busy, 0) << "the request ended before a worker could be killed";
  for (const admin::WorkerStatus& w : s.workers()) {
    if (w.instance() == busy && w.rank() == 1) {
      ASSERT_TRUE(c->KillWorker(WorkerIndex(w.worker_id())).ok());
      break;
    }
  }
  client.join();
  ASSERT_TRUE(moved.status.ok()) << moved.status.error_message();
  EXPECT_EQ(moved.tokens, undisturbed.tokens);
  EXPECT_GE(GetStatus(c->address()).requests_migrated(), 1u);
}

TEST(Instances, RollingRestartUnderLoadFailsNothing) {
  auto c = StartInstances();
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(WaitAllServing(*c, absl::Seconds(30)));
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<std::string> failures;
  std::atomic<int> done{0};
  std::vector<std::thread> load;
  for (int t = 0; t < 4; ++t) {
    load.emplace_back([&, t] {
      GreedyOptions g;
      g.ignore_eos = true;
      while (!stop.load()) {
        std::vector<int32_t> prompt = kPrompt;
        prompt.push_back(100 + t);
        const Streamed r = GreedyGenerate(c->address(), prompt, 400, g);
        if (!r.status.ok() || r.tokens.size() != 400u) {
          std::lock_guard<std::mutex> lock(mu);
          failures.push_back(absl::StrCat(r.status.error_code(), " ", r.status.error_message(),
                                          " after ", r.tokens.size(), " tokens"));
        }
        done.fetch_add(1);
      }
    });
  }
  for (uint32_t instance : {0u, 1u}) {
    admin::DrainResult r;
    grpc::Status st = DrainInstance(c->address(), instance, true, &r);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_TRUE(r.drained());
    // Its requests moved; restart its workers.
    const admin::ClusterStatus now = GetStatus(c->address());
    for (const admin::WorkerStatus& w : now.workers()) {
      if (w.instance() == static_cast<int>(instance) && w.alive()) {
        ASSERT_TRUE(c->KillWorker(WorkerIndex(w.worker_id())).ok());
        ASSERT_TRUE(c->RestartWorker(WorkerIndex(w.worker_id())).ok());
      }
    }
    ASSERT_TRUE(WaitAllServing(*c, absl::Seconds(30)));
    st = DrainInstance(c->address(), instance, false, &r);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_FALSE(r.drained());
  }
  stop = true;
  for (std::thread& t : load) t.join();
  EXPECT_GT(done.load(), 0);
  EXPECT_TRUE(failures.empty()) << failures.size() << " failed, first: " << failures.front();
}

// The acceptance soak: `flotilla bench soak --workers 4 --instances 2
// --kill-every 15 --duration 90` loses, hangs, spoils and fails nothing.
TEST(Instances, SoakKillingAWorkerEvery15sFailsNothing) {
  const std::string cmd = absl::StrCat(
      FLOTILLA_BIN, " bench soak --workers 4 --instances 2 --kill-every 15 --duration 90 "
      "--model synthetic:tiny 2>/dev/null");
  const auto [exit_code, output] = testing_util::RunCommand(cmd);
  std::istringstream lines(output);
  std::string line, last;
  while (std::getline(lines, line)) {
    if (!line.empty() && line.front() == '{') last = line;
  }
  ASSERT_FALSE(last.empty()) << output;
  const nlohmann::json j = nlohmann::json::parse(last);
  EXPECT_TRUE(j.value("final", false)) << last;
  EXPECT_GE(j["kills"].get<int>(), 5) << last;
  EXPECT_EQ(j["failed"].get<int>(), 0) << last;
  EXPECT_EQ(j["lost"].get<int>(), 0) << last;
  EXPECT_EQ(j["hung"].get<int>(), 0) << last;
  EXPECT_EQ(j["wrong"].get<int>(), 0) << last;
  EXPECT_GT(j["ok"].get<int>(), 0) << last;
  EXPECT_EQ(exit_code, 0) << last;
}

}  // namespace
}  // namespace flotilla
