// A W = 2 instance (one TP group of two ranks) of WorkerRuntimes in one
// process: each rank has its own fake coordinator client and fake engine,
// and the ranks' communicators are LocalCommunicators of one rendezvous
// wrapped in scripted FakeCommunicators (tests/worker/local_peer_endpoint.h).
// The failure paths a sharded instance meets, as unit tests: a peer that
// dies in the middle of a step and one that stalls.
#include <gtest/gtest.h>

#include <array>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "tests/worker/fake_coordinator_client.h"
#include "tests/worker/local_peer_endpoint.h"
#include "tests/worker/session_messages.h"
#include "worker/worker_runtime.h"

namespace flotilla::worker {
namespace {

using comm::testing::CommCall;
using comm::testing::CommOp;

constexpr int kWorld = 2;

// A latch a stalled rank waits on until the test lets it go.
class Gate {
 public:
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return open_; });
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

class WorkerPairTest : public ::testing::Test {
 protected:
  // Starts both ranks' runtimes (nothing assigned yet).
  void Start(absl::Duration comm_timeout = absl::Seconds(10)) {
    for (int rank = 0; rank < kWorld; ++rank) {
      auto client = std::make_unique<FakeCoordinatorClient>();
      clients_[rank] = client.get();
      auto factory = std::make_unique<FakeEngineFactory>();
      factories_[rank] = factory.get();
      EngineFactories factories;
      factories.emplace("cpu", std::move(factory));
      WorkerOptions o;
      o.worker_id = "w" + std::to_string(rank);
      o.threads = 1;
      o.advertise_address = "127.0.0.1";
      o.comm_timeout = comm_timeout;
      auto runtime =
          WorkerRuntime::Create(o, std::move(client), std::move(factories), peers_.Factory());
      ASSERT_TRUE(runtime.ok()) << runtime.status();
      runtimes_[rank] = std::move(*runtime);
      threads_[rank] = std::thread([this, rank] { run_status_[rank] = runtimes_[rank]->Run(); });
    }
  }
  void TearDown() override { StopAll(); }
  // Stops both ranks and waits for their loops to end (their engines stay
  // readable).
  void StopAll() {
    gate_.Open();  // a stalled rank may go on (and fail: its peer is gone)
    for (int rank = 0; rank < kWorld; ++rank) {
      if (runtimes_[rank]) runtimes_[rank]->Stop();
    }
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  // Assignment to both ranks, then StartComm once both are Ready; true when
  // both answered Joined.
  bool Serve(uint64_t generation = 1) {
    for (int rank = 0; rank < kWorld; ++rank) {
      clients_[rank]->Push(Assignment(generation, kWorld, rank));
    }
    for (FakeCoordinatorClient* client : clients_) {
      if (!client->WaitFor([&](const auto& sent) {
            return Any(sent, [&](const auto& m) { return m.ready().generation() == generation; });
          })) {
        return false;
      }
    }
    for (FakeCoordinatorClient* client : clients_) client->Push(StartComm(generation));
    for (FakeCoordinatorClient* client : clients_) {
      if (!client->WaitFor([&](const auto& sent) {
            return Any(sent, [&](const auto& m) { return m.joined().generation() == generation; });
          })) {
        return false;
      }
    }
    return true;
  }
  // Runs `on_plan` on rank `rank` before its `nth` (from 0) plan exchange: the
  // AllToAllV that carries the leader's plan, made only in steps with work.
  void AtPlanExchange(int rank, int nth,
                      std::function<absl::Status(comm::LocalRendezvous&)> on_plan) {
    peers_.SetScript(rank, [nth, on_plan](comm::LocalRendezvous& rendezvous,
                                          comm::testing::FakeCommunicator& communicator) {
      auto plans = std::make_shared<int>(0);
      communicator.SetHook([nth, on_plan, plans, &rendezvous](const CommCall& call) {
        if (call.op != CommOp::kAllToAllV || (*plans)++ != nth) return absl::OkStatus();
        return on_plan(rendezvous);
      });
    });
  }
  // Waits until `request_id` ends at the leader (rank 0); its last update.
  cluster::SequenceUpdate WaitEnded(uint64_t request_id) {
    EXPECT_TRUE(clients_[0]->WaitFor([&](const auto& sent) { return Finished(sent, request_id); }));
    const std::vector<cluster::SequenceUpdate> updates =
        UpdatesFor(clients_[0]->sent(), request_id);
    return updates.empty() ? cluster::SequenceUpdate() : updates.back();
  }
  // Whether rank `rank` told its coordinator that a step failed.
  bool ReportsAFailedStep(int rank) {
    return clients_[rank]->WaitFor([](const auto& sent) {
      return Any(sent, [](const auto& m) {
        return m.has_error() && m.error().message().find("step failed") != std::string::npos;
      });
    });
  }

  LocalPeers peers_{kWorld};
  Gate gate_;
  std::array<FakeCoordinatorClient*, kWorld> clients_{};
  std::array<FakeEngineFactory*, kWorld> factories_{};
  std::array<std::unique_ptr<WorkerRuntime>, kWorld> runtimes_;
  std::array<std::thread, kWorld> threads_;
  std::array<absl::Status, kWorld> run_status_;
};

TEST_F(WorkerPairTest, BothRanksJoinAndRunTheLeadersStepsInLockstep) {
  Start();
  ASSERT_TRUE(Serve());
  clients_[0]->Push(Submit(1, /*prompt_tokens=*/6, /*max_tokens=*/3));
  const cluster::SequenceUpdate last = WaitEnded(1);
  EXPECT_EQ(last.finish_reason(), common::LENGTH) << last.error();
  std::vector<int32_t> tokens;
  for (const cluster::SequenceUpdate& u : UpdatesFor(clients_[0]->sent(), 1)) {
    tokens.insert(tokens.end(), u.token_ids().begin(), u.token_ids().end());
  }
  EXPECT_EQ(tokens, (std::vector<int32_t>{106, 107, 108}));
  // Only the leader answers; rank 1 ran the same items of the same steps.
  EXPECT_TRUE(UpdatesFor(clients_[1]->sent(), 1).empty());
  StopAll();
  const auto leader = factories_[0]->step_tokens();
  EXPECT_GE(leader.size(), 3u);  // the prompt in chunks of 4, then decode steps
  EXPECT_EQ(factories_[1]->step_tokens(), leader);
}

TEST_F(WorkerPairTest, APeerDyingMidStepFailsTheRequestNamingItAndTheLeaderReports) {
  // Rank 1's process dies as the third step's plan is exchanged: its
  // messages stop and the rendezvous marks it gone.
  AtPlanExchange(1, 2, [](comm::LocalRendezvous& rendezvous) {
    rendezvous.MarkDead(1);
    return absl::UnavailableError("rank 1 died");
  });
  Start();
  ASSERT_TRUE(Serve());
  clients_[0]->Push(Submit(2, /*prompt_tokens=*/3, /*max_tokens=*/100000));
  const cluster::SequenceUpdate last = WaitEnded(2);
  EXPECT_EQ(last.finish_reason(), common::ERROR);
  EXPECT_EQ(last.error_code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_NE(last.error().find("peer rank 1 is gone"), std::string::npos) << last.error();
  size_t streamed = 0;
  for (const cluster::SequenceUpdate& u : UpdatesFor(clients_[0]->sent(), 2)) {
    streamed += u.token_ids_size();
  }
  EXPECT_GT(streamed, 0u) << "the steps before the death streamed their tokens";
  EXPECT_TRUE(ReportsAFailedStep(0));
  EXPECT_TRUE(ReportsAFailedStep(1));
  // The instance holds nothing now: a new request is refused at once.
  clients_[0]->Push(Submit(3, 3, 4));
  EXPECT_EQ(WaitEnded(3).error_code(), static_cast<int>(absl::StatusCode::kUnavailable));
}

TEST_F(WorkerPairTest, AStalledPeerEndsTheStepAtTheCommTimeoutAndTheInstanceReforms) {
  // Rank 1 stops in the second step's plan exchange and does not come back
  // (until the test ends); rank 0 gives up at its communicator timeout (short
  // here, yet long beside the ranks' idle exchanges, which never wait on a
  // peer that is not stalled).
  AtPlanExchange(1, 1, [this](comm::LocalRendezvous&) {
    gate_.Wait();
    return absl::UnavailableError("rank 1 was released at the end of the test");
  });
  Start(/*comm_timeout=*/absl::Seconds(1));
  ASSERT_TRUE(Serve());
  clients_[0]->Push(Submit(4, /*prompt_tokens=*/3, /*max_tokens=*/100000));
  const cluster::SequenceUpdate last = WaitEnded(4);
  EXPECT_EQ(last.error_code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_NE(last.error().find("no message from rank 1"), std::string::npos) << last.error();
  EXPECT_TRUE(ReportsAFailedStep(0));
  // The coordinator drops the generation and forms the next one: rank 0
  // loads it while rank 1 is still stuck, and is Ready again.
  clients_[0]->Push(DropGeneration(1, "rank 0 reported a failed step"));
  clients_[0]->Push(Assignment(2, kWorld, 0));
  EXPECT_TRUE(clients_[0]->WaitFor([](const auto& sent) {
    return Any(sent, [](const auto& m) { return m.ready().generation() == 2; });
  }));
}

}  // namespace
}  // namespace flotilla::worker
