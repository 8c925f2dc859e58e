// The worker runtime driven through a fake coordinator client and a fake
// engine: the session's messages in and out, no gRPC server, no model compute.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "tests/worker/fake_coordinator_client.h"
#include "tests/worker/session_messages.h"
#include "worker/worker_runtime.h"

namespace flotilla::worker {
namespace {

// The options of the one-thread worker "w0" the tests run.
WorkerOptions TestOptions() {
  WorkerOptions o;
  o.worker_id = "w0";
  o.threads = 1;
  o.advertise_address = "127.0.0.1";
  return o;
}

// A fixture running a WorkerRuntime's Run on a thread of its own; stopped
// and joined at the end of the test.
class RunningRuntimeTest : public ::testing::Test {
 protected:
  void Run(absl::StatusOr<std::unique_ptr<WorkerRuntime>> runtime) {
    ASSERT_TRUE(runtime.ok()) << runtime.status();
    runtime_ = std::move(*runtime);
    thread_ = std::thread([this] { run_status_ = runtime_->Run(); });
  }
  void TearDown() override {
    if (runtime_) runtime_->Stop();
    if (thread_.joinable()) thread_.join();
  }

  std::unique_ptr<WorkerRuntime> runtime_;
  std::thread thread_;
  absl::Status run_status_;
};

class WorkerRuntimeFakeTest : public RunningRuntimeTest {
 protected:
  void SetUp() override {
    auto client = std::make_unique<FakeCoordinatorClient>();
    client_ = client.get();
    auto factory = std::make_unique<FakeEngineFactory>();
    factory_ = factory.get();
    EngineFactories factories;
    factories.emplace("cpu", std::move(factory));
    Run(WorkerRuntime::Create(TestOptions(), std::move(client), std::move(factories)));
  }
  // Assignment then StartComm; true when the worker answered Ready and Joined.
  bool Serve(uint64_t generation = 1) {
    client_->Push(Assignment(generation));
    if (!client_->WaitFor([&](const auto& sent) {
          return Any(sent, [&](const auto& m) { return m.ready().generation() == generation; });
        })) {
      return false;
    }
    client_->Push(StartComm(generation));
    return client_->WaitFor([&](const auto& sent) {
      return Any(sent, [&](const auto& m) { return m.joined().generation() == generation; });
    });
  }

  FakeCoordinatorClient* client_ = nullptr;
  FakeEngineFactory* factory_ = nullptr;
};

TEST_F(WorkerRuntimeFakeTest, HelloThenAssignmentReadyJoinedAndTokens) {
  ASSERT_TRUE(Serve());
  const cluster::WorkerMessage hello = client_->hello();
  EXPECT_EQ(hello.hello().worker_id(), "w0");
  EXPECT_EQ(hello.hello().device().kind(), common::DeviceInfo::CPU);

  client_->Push(Submit(1, /*prompt_tokens=*/6, /*max_tokens=*/3));
  ASSERT_TRUE(client_->WaitFor([](const auto& sent) { return Finished(sent, 1); }));
  std::vector<int32_t> tokens;
  common::FinishReason reason = common::FINISH_REASON_UNSPECIFIED;
  for (const cluster::SequenceUpdate& u : UpdatesFor(client_->sent(), 1)) {
    tokens.insert(tokens.end(), u.token_ids().begin(), u.token_ids().end());
    if (u.finish_reason() != common::FINISH_REASON_UNSPECIFIED) reason = u.finish_reason();
  }
  // The fake draws the last token + 1: the prompt ends at 105.
  EXPECT_EQ(tokens, (std::vector<int32_t>{106, 107, 108}));
  EXPECT_EQ(reason, common::LENGTH);
  // The prompt of 6 ran in chunks of the assignment's 4 tokens.
  ASSERT_GE(factory_->last->steps.size(), 2u);
  EXPECT_EQ(factory_->last->steps[0][0].tokens.size(), 4u);
  EXPECT_EQ(factory_->last->steps[1][0].tokens.size(), 2u);

  client_->Push(Submit(2, 3, 10, /*stop=*/{104}));
  ASSERT_TRUE(client_->WaitFor([](const auto& sent) { return Finished(sent, 2); }));
  const std::vector<cluster::SequenceUpdate> updates = UpdatesFor(client_->sent(), 2);
  EXPECT_EQ(updates.back().finish_reason(), common::STOP);
  EXPECT_EQ(updates.back().stop_token(), 104);
  EXPECT_EQ(updates.back().completion_tokens(), 2u);

  const cluster::WorkerLoad load = client_->Load();
  EXPECT_EQ(load.kv_blocks_total(), 64u);
  EXPECT_EQ(load.queued_sequences(), 0u);
}

// The Assignment's idle_prefill_tokens reach the scheduler: with nothing
// decoding, a prompt of 10 runs in one step instead of chunks of 4 (steps
// beside decode tokens: SchedulerTest.IdleStepsPrefillWithinTheIdleBudget).
TEST_F(WorkerRuntimeFakeTest, IdleStepsTakeTheAssignmentsIdlePrefillBudget) {
  cluster::CoordinatorMessage assignment = Assignment(1);
  assignment.mutable_assignment()->mutable_scheduler_policy()->set_idle_prefill_tokens(16);
  client_->Push(assignment);
  ASSERT_TRUE(client_->WaitFor(
      [](const auto& sent) { return Any(sent, [](const auto& m) { return m.has_ready(); }); }));
  client_->Push(StartComm(1));
  ASSERT_TRUE(client_->WaitFor(
      [](const auto& sent) { return Any(sent, [](const auto& m) { return m.has_joined(); }); }));
  client_->Push(Submit(1, /*prompt_tokens=*/10, /*max_tokens=*/3));
  ASSERT_TRUE(client_->WaitFor([](const auto& sent) { return Finished(sent, 1); }));
  ASSERT_GE(factory_->last->steps.size(), 1u);
  EXPECT_EQ(factory_->last->steps[0][0].tokens.size(), 10u);
}

// The coordinator's view of the worker is never a heartbeat behind once a
// request has its answer: a heartbeat saying the worker is busy goes before
// the request's first tokens, and one saying it is idle, with the prompt
// tokens it looked up in the prefix cache, right after its last ones.
TEST_F(WorkerRuntimeFakeTest, LoadIsReportedWhenTheWorkerTurnsBusyAndIdle) {
  ASSERT_TRUE(Serve());
  client_->Push(Submit(1, /*prompt_tokens=*/6, /*max_tokens=*/3));
  auto idle_after_finish = [](const std::vector<cluster::WorkerMessage>& sent) {
    bool finished = false;
    for (const cluster::WorkerMessage& m : sent) {
      if (m.has_tokens() && Finished({m}, 1)) finished = true;
      const cluster::WorkerLoad& load = m.heartbeat().load();
      if (finished && m.has_heartbeat() && load.running_sequences() == 0 &&
          load.queued_sequences() == 0 && load.prefix_cache_queries_tokens() == 6) {
        return true;
      }
    }
    return false;
  };
  ASSERT_TRUE(client_->WaitFor(idle_after_finish));
  const std::vector<cluster::WorkerMessage> sent = client_->sent();
  auto first_tokens = std::find_if(sent.begin(), sent.end(),
                                   [](const cluster::WorkerMessage& m) { return m.has_tokens(); });
  ASSERT_NE(first_tokens, sent.end());
  EXPECT_TRUE(std::any_of(sent.begin(), first_tokens, [](const cluster::WorkerMessage& m) {
    const cluster::WorkerLoad& load = m.heartbeat().load();
    return m.has_heartbeat() && load.running_sequences() + load.queued_sequences() > 0;
  }));
}

// Prompt logits under credit, through the session: the leader sends the rows
// its credit allows and pauses (its first row here, then nothing) until a
// PromptLogitsCredit raises it; the prompt then goes on where it stopped.
TEST_F(WorkerRuntimeFakeTest, PromptLogitsWaitForCreditFromTheCoordinator) {
  ASSERT_TRUE(Serve());
  const int64_t vocab = ModelConfig::Tiny().vocab_size;
  const uint64_t row = static_cast<uint64_t>(vocab) * sizeof(float);
  cluster::CoordinatorMessage submit = Submit(11, /*prompt_tokens=*/6, /*max_tokens=*/2);
  submit.mutable_submit()->set_return_prompt_logits(true);
  submit.mutable_submit()->set_prompt_logits_credit_bytes(row);
  auto rows = [vocab](const std::vector<cluster::WorkerMessage>& sent) {
    int64_t floats = 0;
    for (const cluster::SequenceUpdate& u : UpdatesFor(sent, 11)) floats += u.prompt_logits_size();
    return floats / vocab;
  };
  auto credit = [](uint64_t allowed) {
    cluster::CoordinatorMessage m;
    m.mutable_prompt_logits_credit()->set_request_id(11);
    m.mutable_prompt_logits_credit()->set_allowed_bytes(allowed);
    return m;
  };
  client_->Push(submit);
  ASSERT_TRUE(client_->WaitFor([&](const auto& sent) { return rows(sent) >= 1; }));
  client_->Push(credit(3 * row));
  ASSERT_TRUE(client_->WaitFor([&](const auto& sent) { return rows(sent) >= 3; }));
  // Paused at each credit: the chunks (4 tokens a step) never ran ahead of it.
  EXPECT_EQ(rows(client_->sent()), 3);
  EXPECT_FALSE(Finished(client_->sent(), 11));
  client_->Push(credit(100 * row));
  ASSERT_TRUE(client_->WaitFor([](const auto& sent) { return Finished(sent, 11); }));
  EXPECT_EQ(rows(client_->sent()), 6);
  const std::vector<std::vector<std::vector<int32_t>>> steps = factory_->step_tokens();
  ASSERT_GE(steps.size(), 3u);
  EXPECT_EQ(steps[0][0].size(), 1u);
  EXPECT_EQ(steps[1][0].size(), 2u);
}

TEST_F(WorkerRuntimeFakeTest, RefusedRequestsEndWithTheirReason) {
  ASSERT_TRUE(Serve());
  client_->Push(Submit(3, /*prompt_tokens=*/0, 4));
  ASSERT_TRUE(client_->WaitFor([](const auto& sent) { return Finished(sent, 3); }));
  const cluster::SequenceUpdate u = UpdatesFor(client_->sent(), 3).back();
  EXPECT_EQ(u.finish_reason(), common::ERROR);
  EXPECT_EQ(u.error_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
}

TEST_F(WorkerRuntimeFakeTest, AFailedStepFailsTheRequestsAndReportsTheError) {
  factory_->step_error = absl::InternalError("device lost");
  ASSERT_TRUE(Serve());
  client_->Push(Submit(4, 3, 4));
  ASSERT_TRUE(client_->WaitFor([](const auto& sent) { return Finished(sent, 4); }));
  const cluster::SequenceUpdate u = UpdatesFor(client_->sent(), 4).back();
  EXPECT_EQ(u.error_code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_NE(u.error().find("device lost"), std::string::npos);
  ASSERT_TRUE(client_->WaitFor([](const auto& sent) {
    return Any(sent, [](const auto& m) {
      return m.has_error() && m.error().message().find("step failed") != std::string::npos;
    });
  }));
}

TEST_F(WorkerRuntimeFakeTest, AnEngineThatCannotBeBuiltIsReported) {
  factory_->create_error = absl::ResourceExhaustedError("no memory");
  client_->Push(Assignment(1));
  client_->Push(StartComm(1));
  ASSERT_TRUE(client_->WaitFor([](const auto& sent) {
    return Any(sent, [](const auto& m) {
      return m.has_error() &&
             m.error().message().find("joining the communicator failed") != std::string::npos;
    });
  }));
}

TEST_F(WorkerRuntimeFakeTest, ShutdownEndsRunWithOk) {
  ASSERT_TRUE(Serve());
  cluster::CoordinatorMessage shutdown;
  shutdown.mutable_shutdown()->set_reason("test");
  client_->Push(shutdown);
  thread_.join();
  EXPECT_TRUE(run_status_.ok()) << run_status_;
}

// ---- every failure path ends the requests it touches ----
// Nothing else would end them (the fake engine never finishes a 100000-token
// request, and no timeout runs), so the ending itself is the check; the
// fake's WaitFor bound only keeps a broken path from hanging the test.

// Waits until `request_id` ends; its last update.
cluster::SequenceUpdate WaitEnded(FakeCoordinatorClient& client, uint64_t request_id) {
  EXPECT_TRUE(client.WaitFor([&](const auto& sent) { return Finished(sent, request_id); }));
  const std::vector<cluster::SequenceUpdate> updates = UpdatesFor(client.sent(), request_id);
  return updates.empty() ? cluster::SequenceUpdate() : updates.back();
}

TEST_F(WorkerRuntimeFakeTest, ADroppedGenerationEndsRunningRequests) {
  ASSERT_TRUE(Serve());
  client_->Push(Submit(5, 3, /*max_tokens=*/100000));
  ASSERT_TRUE(client_->WaitFor([](const auto& sent) { return !UpdatesFor(sent, 5).empty(); }));
  client_->Push(DropGeneration(1, "worker 'w1' (rank 1) is gone: its session stream closed"));
  const cluster::SequenceUpdate update = WaitEnded(*client_, 5);
  EXPECT_EQ(update.finish_reason(), common::ERROR);
  EXPECT_EQ(update.error_code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_NE(update.error().find("rank 1) is gone"), std::string::npos) << update.error();
  // It holds nothing now: a request sent meanwhile is refused at once.
  client_->Push(Submit(6, 3, 4));
  const cluster::SequenceUpdate refused = WaitEnded(*client_, 6);
  EXPECT_EQ(refused.error_code(), static_cast<int>(absl::StatusCode::kUnavailable));
}

TEST_F(WorkerRuntimeFakeTest, ADropForAnotherGenerationIsIgnored) {
  ASSERT_TRUE(Serve(2));
  client_->Push(DropGeneration(1, "old news"));
  client_->Push(Submit(7, 3, 4));
  const cluster::SequenceUpdate update = WaitEnded(*client_, 7);
  EXPECT_EQ(update.finish_reason(), common::LENGTH) << update.error();
}

TEST_F(WorkerRuntimeFakeTest, ARequestBeforeStartCommEndsAtOnce) {
  client_->Push(Assignment(1));
  ASSERT_TRUE(client_->WaitFor([](const auto& sent) {
    return Any(sent, [](const auto& m) { return m.has_ready(); });
  }));
  client_->Push(Submit(8, 3, 4));
  const cluster::SequenceUpdate update = WaitEnded(*client_, 8);
  EXPECT_EQ(update.finish_reason(), common::ERROR);
  EXPECT_EQ(update.error_code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_NE(update.error().find("no engine running"), std::string::npos) << update.error();
}

TEST_F(WorkerRuntimeFakeTest, AFailedStartCommLeavesNoRequestWaiting) {
  factory_->create_error = absl::ResourceExhaustedError("no memory");
  client_->Push(Assignment(1));
  client_->Push(StartComm(1));
  ASSERT_TRUE(client_->WaitFor([](const auto& sent) {
    return Any(sent, [](const auto& m) { return m.has_error(); });
  }));
  client_->Push(Submit(9, 3, 4));
  const cluster::SequenceUpdate update = WaitEnded(*client_, 9);
  EXPECT_EQ(update.error_code(), static_cast<int>(absl::StatusCode::kUnavailable));
}

TEST_F(WorkerRuntimeFakeTest, ACommunicatorTimeoutInAStepEndsRequests) {
  // What a collective gives when a peer stays silent past --comm-timeout-ms.
  factory_->step_error = absl::UnavailableError("rank 0: no message from rank(s) 1 within 10s");
  ASSERT_TRUE(Serve());
  client_->Push(Submit(10, 3, 4));
  const cluster::SequenceUpdate update = WaitEnded(*client_, 10);
  EXPECT_EQ(update.error_code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_NE(update.error().find("no message from rank"), std::string::npos) << update.error();
  // And the coordinator hears of it, so it can fail the rest and re-form.
  EXPECT_TRUE(client_->WaitFor([](const auto& sent) {
    return Any(sent, [](const auto& m) {
      return m.has_error() && m.error().message().find("step failed") != std::string::npos;
    });
  }));
}

// ---- sessions: the worker outlives its coordinator ----

class WorkerReconnectTest : public RunningRuntimeTest {
 protected:
  // `connect_failures` clients refuse to connect before the first that works.
  void Start(int connect_failures) {
    auto factory = std::make_unique<FakeEngineFactory>();
    EngineFactories factories;
    factories.emplace("cpu", std::move(factory));
    WorkerOptions o = TestOptions();
    o.reconnect_backoff = absl::Milliseconds(10);
    o.reconnect_backoff_max = absl::Milliseconds(40);
    auto clients = [this, connect_failures]() -> std::unique_ptr<CoordinatorClient> {
      auto client = std::make_unique<FakeCoordinatorClient>();
      std::lock_guard<std::mutex> lock(mu_);
      if (static_cast<int>(clients_.size()) < connect_failures) {
        client->connect_status = absl::UnavailableError("cannot reach the coordinator");
      }
      clients_.push_back(client.get());
      cv_.notify_all();
      return client;
    };
    Run(WorkerRuntime::Create(o, clients, std::move(factories)));
  }
  // The n-th client (0-based), once the runtime made it.
  FakeCoordinatorClient* Client(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(10), [&] { return clients_.size() > n; });
    return clients_.size() > n ? clients_[n] : nullptr;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<FakeCoordinatorClient*> clients_;  // owned by the runtime while in use
};

TEST_F(WorkerReconnectTest, WaitsForACoordinatorThatIsNotUpYet) {
  Start(/*connect_failures=*/3);
  FakeCoordinatorClient* fourth = Client(3);
  ASSERT_NE(fourth, nullptr);
  ASSERT_TRUE(fourth->WaitOpened());
  EXPECT_EQ(fourth->hello().hello().worker_id(), "w0");
}

TEST_F(WorkerReconnectTest, ASessionThatEndsIsOpenedAgainAndServes) {
  Start(0);
  FakeCoordinatorClient* first = Client(0);
  ASSERT_NE(first, nullptr);
  ASSERT_TRUE(first->WaitOpened());
  first->Push(Assignment(1));
  first->Push(StartComm(1));
  ASSERT_TRUE(first->WaitFor([](const auto& sent) {
    return Any(sent, [](const auto& m) { return m.has_joined(); });
  }));
  first->EndSession(absl::UnavailableError("coordinator restarted"));
  FakeCoordinatorClient* second = Client(1);
  ASSERT_NE(second, nullptr);
  ASSERT_TRUE(second->WaitOpened());
  EXPECT_EQ(second->hello().hello().worker_id(), "w0");
  // The new coordinator builds the instance again from nothing.
  second->Push(Submit(1, 3, 4));
  ASSERT_TRUE(second->WaitFor([](const auto& sent) { return Finished(sent, 1); }));
  EXPECT_EQ(UpdatesFor(second->sent(), 1).back().error_code(),
            static_cast<int>(absl::StatusCode::kUnavailable));
  second->Push(Assignment(1));
  second->Push(StartComm(1));
  second->Push(Submit(2, 3, 4));
  ASSERT_TRUE(second->WaitFor([](const auto& sent) { return Finished(sent, 2); }));
  EXPECT_EQ(UpdatesFor(second->sent(), 2).back().finish_reason(), common::LENGTH);
}

TEST_F(WorkerReconnectTest, ARefusedTokenEndsRunWithoutRetrying) {
  Start(0);
  FakeCoordinatorClient* first = Client(0);
  ASSERT_NE(first, nullptr);
  ASSERT_TRUE(first->WaitOpened());
  first->EndSession(absl::UnauthenticatedError("wrong cluster token"));
  thread_.join();
  EXPECT_TRUE(absl::IsUnauthenticated(run_status_)) << run_status_;
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_EQ(clients_.size(), 1u);
}

TEST(WorkerRuntimeCreateTest, RefusesADeviceWithoutAnEngineFactory) {
  WorkerOptions o;
  o.device = "tpu";
  auto runtime =
      WorkerRuntime::Create(o, std::make_unique<FakeCoordinatorClient>(), EngineFactories());
  EXPECT_EQ(runtime.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace flotilla::worker
