#include "coordinator/cluster_manager.h"

#include <gtest/gtest.h>

#include <mutex>
#include <thread>

namespace flotilla::coordinator {
namespace {

// A scriptable worker session: records what the coordinator sends.
class FakeSession : public WorkerSession {
 public:
  void Send(const cluster::CoordinatorMessage& m) override {
    std::lock_guard<std::mutex> lock(mu);
    sent.push_back(m);
  }
  void Close(const absl::Status& status) override {
    std::lock_guard<std::mutex> lock(mu);
    closed = status;
  }
  std::vector<cluster::CoordinatorMessage> Of(cluster::CoordinatorMessage::KindCase k) {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<cluster::CoordinatorMessage> out;
    for (auto& m : sent) {
      if (m.kind_case() == k) out.push_back(m);
    }
    return out;
  }
  std::mutex mu;
  std::vector<cluster::CoordinatorMessage> sent;
  std::optional<absl::Status> closed;
};

struct Fixture {
  std::unique_ptr<ClusterManager> manager;
  std::vector<std::shared_ptr<FakeSession>> sessions;
  std::vector<uint64_t> ids;

  explicit Fixture(int workers, int tp, absl::Duration timeout = absl::Seconds(30),
                   int max_inflight = 1024) {
    ClusterOptions o;
    o.expected_workers = workers;
    o.layout.tp_size = tp;
    o.model = ModelConfig::Tiny();
    o.model_path = "/models/tiny";
    o.heartbeat_interval = absl::Milliseconds(20);
    o.heartbeat_timeout = timeout;
    o.max_inflight_requests = max_inflight;
    manager = *ClusterManager::Create(o);
  }
  int Connect(const std::string& id) {
    auto s = std::make_shared<FakeSession>();
    uint64_t sid = manager->OnSessionOpened(s);
    cluster::WorkerMessage m;
    m.mutable_hello()->set_worker_id(id);
    m.mutable_hello()->set_node("n0");
    m.mutable_hello()->set_comm_address("addr-" + id);
    manager->OnWorkerMessage(sid, m);
    sessions.push_back(s);
    ids.push_back(sid);
    return static_cast<int>(sessions.size()) - 1;
  }
  void Ready(int i) {
    auto a = sessions[i]->Of(cluster::CoordinatorMessage::kAssignment);
    ASSERT_FALSE(a.empty());
    cluster::WorkerMessage m;
    m.mutable_ready()->set_generation(a.back().assignment().generation());
    m.mutable_ready()->set_rank(a.back().assignment().rank());
    manager->OnWorkerMessage(ids[i], m);
  }
};

TEST(ClusterManager, AssignsWhenAllWorkersRegisterAndServesWhenReady) {
  Fixture f(2, 2);
  f.Connect("w-b");
  EXPECT_TRUE(f.sessions[0]->Of(cluster::CoordinatorMessage::kAssignment).empty());
  EXPECT_EQ(f.manager->Status().state(), admin::WAITING_FOR_WORKERS);
  f.Connect("w-a");
  auto a0 = f.sessions[0]->Of(cluster::CoordinatorMessage::kAssignment);
  auto a1 = f.sessions[1]->Of(cluster::CoordinatorMessage::kAssignment);
  ASSERT_EQ(a0.size(), 1u);
  ASSERT_EQ(a1.size(), 1u);
  EXPECT_EQ(a1[0].assignment().rank(), 0u);  // ranks ordered by node, device, id
  EXPECT_EQ(a0[0].assignment().rank(), 1u);
  EXPECT_EQ(a0[0].assignment().tp_size(), 2u);
  EXPECT_EQ(a0[0].assignment().comm().peer_addresses(0), "addr-w-a");
  EXPECT_EQ(a0[0].assignment().model_path(), "/models/tiny");
  EXPECT_EQ(f.manager->Status().state(), admin::LOADING);

  // Not ready yet: requests are refused with a clear status.
  cluster::SubmitSequence req;
  req.add_prompt_ids(1);
  auto refused = f.manager->Submit(req, {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);

  f.Ready(0);
  f.Ready(1);
  EXPECT_TRUE(f.manager->WaitReady(absl::Seconds(1)));
  auto placement = f.manager->GetPlacement();
  ASSERT_TRUE(placement.ok());
  EXPECT_EQ(placement->tp_size(), 2u);
}

TEST(ClusterManager, RoutesRequestsAndStreamsTokensBack) {
  Fixture f(1, 1);
  f.Connect("w0");
  f.Ready(0);
  std::vector<int> got;
  absl::Status final_status = absl::UnknownError("not done");
  cluster::SubmitSequence req;
  req.add_prompt_ids(5);
  req.add_prompt_ids(6);
  auto id = f.manager->Submit(req, {[&](const cluster::SequenceUpdate& u) {
                                      for (int t : u.token_ids()) got.push_back(t);
                                    },
                                    [&](const absl::Status& s) { final_status = s; }});
  ASSERT_TRUE(id.ok()) << id.status();
  auto submits = f.sessions[0]->Of(cluster::CoordinatorMessage::kSubmit);
  ASSERT_EQ(submits.size(), 1u);
  EXPECT_EQ(submits[0].submit().request_id(), *id);

  cluster::WorkerMessage m;
  auto* u = m.mutable_tokens()->add_updates();
  u->set_request_id(*id);
  u->add_token_ids(7);
  f.manager->OnWorkerMessage(f.ids[0], m);
  u->clear_token_ids();
  u->add_token_ids(8);
  u->set_finish_reason(common::LENGTH);
  f.manager->OnWorkerMessage(f.ids[0], m);
  EXPECT_EQ(got, (std::vector<int>{7, 8}));
  EXPECT_TRUE(final_status.ok()) << final_status;
}

TEST(ClusterManager, RejectsBadPrompts) {
  Fixture f(1, 1);
  f.Connect("w0");
  f.Ready(0);
  cluster::SubmitSequence empty;
  EXPECT_EQ(f.manager->Submit(empty, {}).status().code(), absl::StatusCode::kInvalidArgument);
  cluster::SubmitSequence bad;
  bad.add_prompt_ids(ModelConfig::Tiny().vocab_size);
  auto st = f.manager->Submit(bad, {});
  EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.status().message().find("outside the vocabulary"), std::string::npos);
}

TEST(ClusterManager, OverloadAnswersResourceExhausted) {
  Fixture f(1, 1, absl::Seconds(30), /*max_inflight=*/2);
  f.Connect("w0");
  f.Ready(0);
  cluster::SubmitSequence req;
  req.add_prompt_ids(1);
  EXPECT_TRUE(f.manager->Submit(req, {}).ok());
  EXPECT_TRUE(f.manager->Submit(req, {}).ok());
  EXPECT_EQ(f.manager->Submit(req, {}).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(ClusterManager, DeadWorkerFailsInflightNamesItAndRejoinRestoresService) {
  Fixture f(2, 1);
  f.Connect("w0");
  f.Connect("w1");
  f.Ready(0);
  f.Ready(1);
  ASSERT_TRUE(f.manager->WaitReady(absl::Seconds(1)));
  absl::Status status;
  cluster::SubmitSequence req;
  req.add_prompt_ids(1);
  ASSERT_TRUE(f.manager->Submit(req, {nullptr, [&](const absl::Status& s) { status = s; }}).ok());

  f.manager->OnSessionClosed(f.ids[1]);  // w1's stream breaks (process killed)
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(status.message().find("w1"), std::string::npos) << status;
  EXPECT_EQ(f.manager->Status().state(), admin::DEGRADED);
  auto refused = f.manager->Submit(req, {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(refused.status().message().find("w1"), std::string::npos) << refused.status();

  // The worker comes back under the same id: everyone gets a new generation.
  f.Connect("w1");
  auto a0 = f.sessions[0]->Of(cluster::CoordinatorMessage::kAssignment);
  auto a2 = f.sessions[2]->Of(cluster::CoordinatorMessage::kAssignment);
  ASSERT_EQ(a0.size(), 2u);
  ASSERT_EQ(a2.size(), 1u);
  EXPECT_EQ(a2[0].assignment().generation(), 2u);
  EXPECT_EQ(a2[0].assignment().rank(), 1u);
  EXPECT_EQ(a2[0].assignment().comm().peer_addresses(1), "addr-w1");
  f.Ready(0);
  f.Ready(2);
  EXPECT_TRUE(f.manager->WaitReady(absl::Seconds(1)));
  EXPECT_TRUE(f.manager->Submit(req, {}).ok());
}

TEST(ClusterManager, SilentWorkerIsDeclaredDeadWithinTheTimeout) {
  Fixture f(1, 1, absl::Milliseconds(200));
  f.Connect("w0");
  f.Ready(0);
  ASSERT_TRUE(f.manager->WaitReady(absl::Seconds(1)));
  const absl::Time start = absl::Now();
  while (f.manager->Status().state() != admin::DEGRADED && absl::Now() - start < absl::Seconds(3)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(f.manager->Status().state(), admin::DEGRADED);
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  std::lock_guard<std::mutex> lock(f.sessions[0]->mu);
  ASSERT_TRUE(f.sessions[0]->closed.has_value());
  EXPECT_NE(f.sessions[0]->closed->message().find("no heartbeat"), std::string::npos);
}

TEST(ClusterManager, DuplicateWorkerIdIsRefused) {
  Fixture f(2, 1);
  f.Connect("w0");
  f.Connect("w0");
  std::lock_guard<std::mutex> lock(f.sessions[1]->mu);
  ASSERT_TRUE(f.sessions[1]->closed.has_value());
  EXPECT_EQ(f.sessions[1]->closed->code(), absl::StatusCode::kAlreadyExists);
}

TEST(ClusterManager, CancelEndsTheRequestAndTellsTheLeader) {
  Fixture f(1, 1);
  f.Connect("w0");
  f.Ready(0);
  absl::Status status;
  cluster::SubmitSequence req;
  req.add_prompt_ids(1);
  auto id = f.manager->Submit(req, {nullptr, [&](const absl::Status& s) { status = s; }});
  ASSERT_TRUE(id.ok());
  EXPECT_TRUE(f.manager->Cancel(*id, "bye"));
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(f.sessions[0]->Of(cluster::CoordinatorMessage::kCancel).size(), 1u);
  EXPECT_FALSE(f.manager->Cancel(*id, "again"));
}

}  // namespace
}  // namespace flotilla::coordinator
