#include "coordinator/cluster/cluster_manager.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "coordinator/cluster/drain.h"
#include "tests/coordinator/fake_session.h"

namespace flotilla::coordinator {
namespace {

using test_fakes::FakeSession;

// Polls `done` until it holds: the manager's monitor thread acts on the
// injected clock on its own thread. The bound only keeps a broken test from
// hanging; nothing asserts how long it took.
bool Eventually(const std::function<bool()>& done) {
  for (int i = 0; i < 1000 && !done(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

struct Fixture {
  // Liveness, forgetting and measurement deadlines run on this clock; the
  // tests move it.
  SimulatedClock clock{absl::Now()};
  std::unique_ptr<ClusterManager> manager;
  std::vector<std::shared_ptr<FakeSession>> sessions;
  std::vector<uint64_t> ids;
  std::vector<std::string> names;

  explicit Fixture(int workers, int tp, absl::Duration timeout = absl::Seconds(30),
                   int max_inflight = 1024, uint64_t max_prompt_logits_bytes = 1 << 30,
                   uint32_t max_model_len = 0, absl::Duration forget_dead = absl::Seconds(60),
                   int instances = 1, bool migrate = false) {
    ClusterOptions o;
    o.expected_workers = workers;
    o.instances = instances;
    o.migrate_requests = migrate;
    o.layout.tp_size = tp;
    o.model = ModelConfig::Tiny();
    o.model_path = "/models/tiny";
    o.heartbeat_interval = absl::Milliseconds(20);
    o.heartbeat_timeout = timeout;
    o.max_inflight_requests = max_inflight;
    o.max_prompt_logits_bytes = max_prompt_logits_bytes;
    o.max_model_len = max_model_len;
    o.forget_dead_workers_after = forget_dead;
    o.clock = &clock;
    manager = *ClusterManager::Create(o);
  }
  int Connect(const std::string& id) {
    auto s = std::make_shared<FakeSession>();
    uint64_t sid = manager->OnSessionOpened(s);
    cluster::WorkerMessage m;
    m.mutable_hello()->set_worker_id(id);
    m.mutable_hello()->set_node("n0");
    manager->OnWorkerMessage(sid, m);
    sessions.push_back(s);
    ids.push_back(sid);
    names.push_back(id);
    return static_cast<int>(sessions.size()) - 1;
  }
  // A GPU worker's Hello: `gpu` of `node`, a CUDA + NCCL build.
  int ConnectGpu(const std::string& id, const std::string& node, int gpu,
                 uint64_t memory = uint64_t{80} << 30) {
    auto s = std::make_shared<FakeSession>();
    uint64_t sid = manager->OnSessionOpened(s);
    cluster::WorkerMessage m;
    cluster::Hello* h = m.mutable_hello();
    h->set_worker_id(id);
    h->set_node(node);
    h->set_host_id("boot-" + node);
    h->set_gpu_memory_utilization(0.9);
    h->add_device_transports(cluster::DEVICE_TRANSPORT_CUDA_IPC);
    h->add_device_transports(cluster::DEVICE_TRANSPORT_NCCL);
    h->mutable_device()->set_kind(common::DeviceInfo::CUDA);
    h->mutable_device()->set_index(gpu);
    h->mutable_device()->set_name("NVIDIA H100 80GB HBM3");
    h->mutable_device()->set_memory_bytes(memory);
    h->mutable_device()->set_uuid("GPU-" + node + "-" + std::to_string(gpu));
    manager->OnWorkerMessage(sid, m);
    sessions.push_back(s);
    ids.push_back(sid);
    names.push_back(id);
    return static_cast<int>(sessions.size()) - 1;
  }
  void Ready(int i) {
    auto a = sessions[i]->Of(cluster::CoordinatorMessage::kAssignment);
    ASSERT_FALSE(a.empty());
    const uint64_t gen = a.back().assignment().generation();
    cluster::WorkerMessage m;
    m.mutable_ready()->set_generation(gen);
    m.mutable_ready()->set_rank(a.back().assignment().rank());
    m.mutable_ready()->set_comm_address("addr-" + names[i]);
    manager->OnWorkerMessage(ids[i], m);
  }
  // After StartComm reached everyone, each worker reports it joined.
  void JoinAll() {
    for (size_t i = 0; i < sessions.size(); ++i) {
      auto sc = sessions[i]->Of(cluster::CoordinatorMessage::kStartComm);
      if (sc.empty()) continue;
      cluster::WorkerMessage m;
      m.mutable_joined()->set_generation(sc.back().start_comm().generation());
      manager->OnWorkerMessage(ids[i], m);
    }
  }
};

// Workers w0 .. w<workers - 1> connect, load and join the instance.
void JoinWorkers(Fixture& f, int workers) {
  for (int i = 0; i < workers; ++i) f.Connect(absl::StrCat("w", i));
  for (int i = 0; i < workers; ++i) f.Ready(i);
  f.JoinAll();
}

// JoinWorkers, and the instance serves.
void MakeReady(Fixture& f, int workers) {
  JoinWorkers(f, workers);
  ASSERT_TRUE(f.manager->WaitReady(absl::Seconds(1)));
}

// A request of `prompt`.
cluster::SubmitSequence PromptOf(std::initializer_list<int> prompt) {
  cluster::SubmitSequence req;
  for (int t : prompt) req.add_prompt_ids(t);
  return req;
}

// Callbacks that keep only how the request ended, in `*status`.
RequestCallbacks EndInto(absl::Status* status) {
  return {nullptr, [status](const absl::Status& s) { *status = s; }};
}

// A request's tokens and its end, as the manager's callbacks deliver them.
struct Streamed {
  std::vector<int> tokens;
  std::vector<float> prompt_logits;
  std::optional<absl::Status> done;
  RequestCallbacks Callbacks() {
    return {[this](const cluster::SequenceUpdate& u) {
              for (int t : u.token_ids()) tokens.push_back(t);
              for (float v : u.prompt_logits()) prompt_logits.push_back(v);
            },
            [this](const absl::Status& s) { done = s; }};
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
  EXPECT_EQ(a0[0].assignment().model_path(), "/models/tiny");
  EXPECT_EQ(f.manager->Status().state(), admin::LOADING);

  // Not ready yet: requests are refused with a clear status.
  cluster::SubmitSequence req;
  req.add_prompt_ids(1);
  auto refused = f.manager->Submit(req, {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);

  f.Ready(0);
  EXPECT_TRUE(f.sessions[1]->Of(cluster::CoordinatorMessage::kStartComm).empty());
  f.Ready(1);
  auto sc = f.sessions[0]->Of(cluster::CoordinatorMessage::kStartComm);
  ASSERT_EQ(sc.size(), 1u);
  EXPECT_EQ(sc[0].start_comm().comm().peer_addresses(0), "addr-w-a");
  EXPECT_EQ(sc[0].start_comm().comm().peer_addresses(1), "addr-w-b");
  EXPECT_EQ(f.manager->Status().state(), admin::LOADING);
  f.JoinAll();
  EXPECT_TRUE(f.manager->WaitReady(absl::Seconds(1)));
  auto placement = f.manager->GetPlacement();
  ASSERT_TRUE(placement.ok());
  EXPECT_EQ(placement->tp_size(), 2u);
}

TEST(ClusterManager, RoutesRequestsAndStreamsTokensBack) {
  Fixture f(1, 1);
  JoinWorkers(f, 1);
  Streamed out;
  auto id = f.manager->Submit(PromptOf({5, 6}), out.Callbacks());
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
  EXPECT_EQ(out.tokens, (std::vector<int>{7, 8}));
  ASSERT_TRUE(out.done.has_value());
  EXPECT_TRUE(out.done->ok()) << *out.done;
}

TEST(ClusterManager, RejectsBadPrompts) {
  Fixture f(1, 1);
  JoinWorkers(f, 1);
  cluster::SubmitSequence empty;
  EXPECT_EQ(f.manager->Submit(empty, {}).status().code(), absl::StatusCode::kInvalidArgument);
  cluster::SubmitSequence bad;
  bad.add_prompt_ids(ModelConfig::Tiny().vocab_size);
  auto st = f.manager->Submit(bad, {});
  EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.status().message().find("outside the vocabulary"), std::string::npos);
}

// Validation before availability: with no worker alive, a malformed request
// is still the client's error (INVALID_ARGUMENT naming the field), not
// UNAVAILABLE.
TEST(ClusterManager, BadSamplingIsInvalidArgumentWithEveryWorkerDead) {
  Fixture f(1, 1);
  EXPECT_EQ(f.manager->Status().state(), admin::WAITING_FOR_WORKERS);
  cluster::SubmitSequence good;
  good.add_prompt_ids(1);
  EXPECT_EQ(f.manager->Submit(good, {}).status().code(), absl::StatusCode::kUnavailable);
  const std::vector<std::pair<std::string, std::function<void(common::SamplingParams&)>>> cases = {
      {"sampling.temperature", [](common::SamplingParams& s) { s.set_temperature(-1); }},
      {"sampling.top_p", [](common::SamplingParams& s) { s.set_top_p(7); }},
      {"sampling.top_k", [](common::SamplingParams& s) { s.set_top_k(-3); }},
      {"sampling.min_p", [](common::SamplingParams& s) { s.set_min_p(2); }},
      {"sampling.presence_penalty", [](common::SamplingParams& s) { s.set_presence_penalty(9); }},
      {"sampling.repetition_penalty", [](common::SamplingParams& s) { s.set_repetition_penalty(0); }},
      {"sampling.logprobs", [](common::SamplingParams& s) { s.set_logprobs(99); }},
      {"sampling.stop_token_ids[0]", [](common::SamplingParams& s) { s.add_stop_token_ids(-1); }},
      {"sampling.logit_bias[5]", [](common::SamplingParams& s) { (*s.mutable_logit_bias())[5] = 500; }},
  };
  for (const auto& [field, spoil] : cases) {
    cluster::SubmitSequence bad = good;
    spoil(*bad.mutable_sampling());
    absl::StatusOr<uint64_t> st = f.manager->Submit(bad, {});
    EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument) << field << ": " << st.status();
    EXPECT_EQ(st.status().message().rfind(field + ":", 0), 0u) << st.status();
  }
}

TEST(ClusterManager, OverloadAnswersResourceExhausted) {
  Fixture f(1, 1, absl::Seconds(30), /*max_inflight=*/2);
  f.Connect("w0");
  f.Ready(0);
  f.JoinAll();
  cluster::SubmitSequence req;
  req.add_prompt_ids(1);
  EXPECT_TRUE(f.manager->Submit(req, {}).ok());
  EXPECT_TRUE(f.manager->Submit(req, {}).ok());
  EXPECT_EQ(f.manager->Submit(req, {}).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(ClusterManager, DeadWorkerFailsInflightNamesItAndRejoinRestoresService) {
  Fixture f(2, 1);
  MakeReady(f, 2);
  absl::Status status;
  ASSERT_TRUE(f.manager->Submit(PromptOf({1}), EndInto(&status)).ok());

  f.manager->OnSessionClosed(f.ids[1]);  // w1's stream breaks (process killed)
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(status.message().find("w1"), std::string::npos) << status;
  EXPECT_EQ(f.manager->Status().state(), admin::DEGRADED);
  auto refused = f.manager->Submit(PromptOf({1}), {});
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
  f.Ready(0);
  f.Ready(2);
  f.JoinAll();
  EXPECT_TRUE(f.manager->WaitReady(absl::Seconds(1)));
  EXPECT_TRUE(f.manager->Submit(PromptOf({1}), {}).ok());
}

TEST(ClusterManager, SilentWorkerIsDeclaredDeadWithinTheTimeout) {
  Fixture f(1, 1, absl::Milliseconds(200));
  f.Connect("w0");
  f.Ready(0);
  f.JoinAll();
  ASSERT_TRUE(f.manager->WaitReady(absl::Seconds(1)));
  // Within the timeout the silent worker is still alive...
  f.clock.Advance(absl::Milliseconds(150));
  EXPECT_EQ(f.manager->Status().state(), admin::READY);
  // ... and past it, dead at the monitor's next look.
  f.clock.Advance(absl::Milliseconds(100));
  EXPECT_TRUE(Eventually([&] { return f.manager->Status().state() == admin::DEGRADED; }));
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
  JoinWorkers(f, 1);
  absl::Status status;
  cluster::SubmitSequence req;
  req.add_prompt_ids(1);
  auto id = f.manager->Submit(req, EndInto(&status));
  ASSERT_TRUE(id.ok());
  EXPECT_TRUE(f.manager->Cancel(*id, "bye"));
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(f.sessions[0]->Of(cluster::CoordinatorMessage::kCancel).size(), 1u);
  EXPECT_FALSE(f.manager->Cancel(*id, "again"));
}

TEST(ClusterManager, MaxModelLenBoundsPromptsAndReachesTheWorkers) {
  Fixture f(1, 1, absl::Seconds(30), 1024, 1 << 30, /*max_model_len=*/16);
  f.Connect("w0");
  auto a = f.sessions[0]->Of(cluster::CoordinatorMessage::kAssignment);
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a.back().assignment().max_model_len(), 16u);
  f.Ready(0);
  f.JoinAll();
  cluster::SubmitSequence req;
  for (int i = 0; i < 15; ++i) req.add_prompt_ids(i);
  EXPECT_TRUE(f.manager->Submit(req, {}).ok());
  req.add_prompt_ids(15);
  auto refused = f.manager->Submit(req, {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("maximum context length is 16 tokens"),
            std::string::npos)
      << refused.status();
}

TEST(ClusterManager, PromptLogitsPastTheCapAreRefusedBeforeAnyWorkerSeesThem) {
  // The tiny vocabulary is 1024: 4 KiB of logits per prompt token.
  Fixture f(1, 1, absl::Seconds(30), 1024, /*max_prompt_logits_bytes=*/40 << 10);
  f.Connect("w0");
  f.Ready(0);
  f.JoinAll();
  cluster::SubmitSequence req;
  for (int i = 0; i < 10; ++i) req.add_prompt_ids(i);
  req.set_return_prompt_logits(true);
  EXPECT_TRUE(f.manager->Submit(req, {}).ok());
  req.add_prompt_ids(10);
  auto refused = f.manager->Submit(req, {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("MiB"), std::string::npos) << refused.status();
  req.set_return_prompt_logits(false);
  EXPECT_TRUE(f.manager->Submit(req, {}).ok());
  EXPECT_EQ(f.sessions[0]->Of(cluster::CoordinatorMessage::kSubmit).size(), 2u);
}

// Collects what a MeasureEngine callback got.
struct MeasureOutcome {
  std::mutex mu;
  std::optional<absl::StatusOr<cluster::EngineMeasurement>> got;
  MeasureCallback Callback() {
    return [this](absl::StatusOr<cluster::EngineMeasurement> m) {
      std::lock_guard<std::mutex> lock(mu);
      got = std::move(m);
    };
  }
  std::optional<absl::StatusOr<cluster::EngineMeasurement>> Get() {
    std::lock_guard<std::mutex> lock(mu);
    return got;
  }
};

TEST(ClusterManager, MeasureEngineGoesToTheLeaderAndOnlyItsAnswerCounts) {
  Fixture f(1, 1);
  MeasureOutcome early;
  f.manager->MeasureEngine({}, absl::InfiniteFuture(), early.Callback());
  ASSERT_TRUE(early.Get().has_value());
  EXPECT_EQ(early.Get()->status().code(), absl::StatusCode::kFailedPrecondition);

  f.Connect("w0");
  f.Ready(0);
  f.JoinAll();
  cluster::MeasureEngineRequest req;
  req.add_batch_sizes(4);
  req.set_context_tokens(128);
  MeasureOutcome ok;
  f.manager->MeasureEngine(req, absl::InfiniteFuture(), ok.Callback());
  auto sent = f.sessions[0]->Of(cluster::CoordinatorMessage::kMeasureEngine);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].measure_engine().request().context_tokens(), 128u);
  EXPECT_FALSE(ok.Get().has_value());

  cluster::WorkerMessage answer;
  cluster::EngineMeasurement* m = answer.mutable_measurement();
  m->set_measure_id(sent[0].measure_engine().measure_id());
  m->add_decode()->set_batch(4);
  f.manager->OnWorkerMessage(f.ids[0], answer);
  ASSERT_TRUE(ok.Get().has_value());
  ASSERT_TRUE(ok.Get()->ok()) << ok.Get()->status();
  EXPECT_EQ((*ok.Get())->decode(0).batch(), 4u);

  // A refusal comes back as its status; a repeated answer is ignored.
  MeasureOutcome refused;
  f.manager->MeasureEngine(req, absl::InfiniteFuture(), refused.Callback());
  sent = f.sessions[0]->Of(cluster::CoordinatorMessage::kMeasureEngine);
  m->Clear();
  m->set_measure_id(sent.back().measure_engine().measure_id());
  m->set_error_code(static_cast<int>(absl::StatusCode::kResourceExhausted));
  m->set_error("KV short");
  f.manager->OnWorkerMessage(f.ids[0], answer);
  f.manager->OnWorkerMessage(f.ids[0], answer);
  ASSERT_TRUE(refused.Get().has_value());
  EXPECT_EQ(refused.Get()->status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.Get()->status().message().find("KV short"), std::string::npos);
}

TEST(ClusterManager, MeasureEngineFailsWhenTheWorkerDiesOrTimeRunsOut) {
  Fixture f(1, 1);
  JoinWorkers(f, 1);
  MeasureOutcome expired;
  f.manager->MeasureEngine({}, f.clock.TimeNow() + absl::Milliseconds(50), expired.Callback());
  f.clock.Advance(absl::Milliseconds(51));
  ASSERT_TRUE(Eventually([&] { return expired.Get().has_value(); }));
  EXPECT_EQ(expired.Get()->status().code(), absl::StatusCode::kDeadlineExceeded);

  MeasureOutcome orphaned;
  f.manager->MeasureEngine({}, absl::InfiniteFuture(), orphaned.Callback());
  f.manager->OnSessionClosed(f.ids[0]);
  ASSERT_TRUE(orphaned.Get().has_value());
  EXPECT_EQ(orphaned.Get()->status().code(), absl::StatusCode::kUnavailable);
}

// Sends what worker `i` answers to the measurement it was last asked for.
void AnswerMeasure(Fixture& f, int i, std::optional<absl::StatusCode> error = std::nullopt) {
  auto sent = f.sessions[i]->Of(cluster::CoordinatorMessage::kMeasureEngine);
  ASSERT_FALSE(sent.empty());
  cluster::WorkerMessage answer;
  cluster::EngineMeasurement* m = answer.mutable_measurement();
  m->set_measure_id(sent.back().measure_engine().measure_id());
  m->set_worker_id(f.names[i]);
  m->add_decode()->set_batch(i + 1);  // tells the ranks' answers apart
  if (error) {
    m->set_error_code(static_cast<int>(*error));
    m->set_error("refused on " + f.names[i]);
  }
  f.manager->OnWorkerMessage(f.ids[i], answer);
}

TEST(ClusterManager, MeasureEngineGoesToEveryRankAndAnswersWithTheLeadersOnceAllAnswered) {
  Fixture f(4, 2);  // DP 2 x TP 2
  for (const char* id : {"w0", "w1", "w2", "w3"}) f.Connect(id);
  for (int i = 0; i < 4; ++i) f.Ready(i);
  f.JoinAll();
  MeasureOutcome out;
  f.manager->MeasureEngine({}, absl::InfiniteFuture(), out.Callback());
  uint64_t id = 0;
  for (int i = 0; i < 4; ++i) {
    auto sent = f.sessions[i]->Of(cluster::CoordinatorMessage::kMeasureEngine);
    ASSERT_EQ(sent.size(), 1u) << "worker " << i;
    if (i > 0) {
      EXPECT_EQ(sent[0].measure_engine().measure_id(), id);  // one probe, one id
    }
    id = sent[0].measure_engine().measure_id();
  }
  // The leader (rank 0, worker w0) answers among the others; the call waits for all.
  for (int i : {2, 0, 1}) AnswerMeasure(f, i);
  AnswerMeasure(f, 2);  // twice: ignored
  EXPECT_FALSE(out.Get().has_value());
  AnswerMeasure(f, 3);
  ASSERT_TRUE(out.Get().has_value());
  ASSERT_TRUE(out.Get()->ok()) << out.Get()->status();
  const cluster::EngineMeasurement m = **out.Get();
  EXPECT_EQ(m.decode(0).batch(), 1u);  // worker 0's
  EXPECT_EQ(m.worker_id(), "w0");
  EXPECT_EQ(m.world_size(), 4u);
  EXPECT_EQ(m.tp_size(), 2u);
  EXPECT_EQ(m.dp_groups(), 2u);

  // Any rank's refusal ends the call at once, naming the worker.
  MeasureOutcome refused;
  f.manager->MeasureEngine({}, absl::InfiniteFuture(), refused.Callback());
  AnswerMeasure(f, 0);
  AnswerMeasure(f, 3, absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(refused.Get().has_value());
  EXPECT_EQ(refused.Get()->status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.Get()->status().message().find("w3"), std::string::npos);

  // A rank that dies mid-probe, even one that had answered, ends it UNAVAILABLE.
  MeasureOutcome orphaned;
  f.manager->MeasureEngine({}, absl::InfiniteFuture(), orphaned.Callback());
  AnswerMeasure(f, 1);
  f.manager->OnSessionClosed(f.ids[1]);
  ASSERT_TRUE(orphaned.Get().has_value());
  EXPECT_EQ(orphaned.Get()->status().code(), absl::StatusCode::kUnavailable);
}

TEST(ClusterManager, MeasureEngineFailsWhenARankFailsAStepOrTimeRunsOut) {
  Fixture f(2, 1);
  JoinWorkers(f, 2);
  MeasureOutcome reformed;
  f.manager->MeasureEngine({}, absl::InfiniteFuture(), reformed.Callback());
  cluster::WorkerMessage failed;
  failed.mutable_error()->set_message("step failed: peer stalled");
  f.manager->OnWorkerMessage(f.ids[1], failed);
  ASSERT_TRUE(reformed.Get().has_value());
  EXPECT_EQ(reformed.Get()->status().code(), absl::StatusCode::kUnavailable);

  f.Ready(0);
  f.Ready(1);
  f.JoinAll();
  ASSERT_EQ(f.manager->Status().state(), admin::READY);
  MeasureOutcome expired;
  f.manager->MeasureEngine({}, f.clock.TimeNow() + absl::Milliseconds(50), expired.Callback());
  AnswerMeasure(f, 0);
  f.clock.Advance(absl::Milliseconds(51));
  ASSERT_TRUE(Eventually([&] { return expired.Get().has_value(); }));
  EXPECT_EQ(expired.Get()->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(expired.Get()->status().message().find("w1"), std::string::npos)
      << expired.Get()->status();
}

TEST(ClusterManager, GpuRanksLearnTheirDeviceTransport) {
  Fixture f(2, 2);
  f.ConnectGpu("g0", "n0", 0);
  f.ConnectGpu("g1", "n0", 1);
  for (int i = 0; i < 2; ++i) {
    auto a = f.sessions[i]->Of(cluster::CoordinatorMessage::kAssignment);
    ASSERT_EQ(a.size(), 1u);
    EXPECT_EQ(a[0].assignment().comm().backend(),
              cluster::COMM_BACKEND_UCX);  // host control and bootstrap
    EXPECT_EQ(a[0].assignment().comm().device_transport(), cluster::DEVICE_TRANSPORT_CUDA_IPC);
  }
  f.Ready(0);
  f.Ready(1);
  auto sc = f.sessions[0]->Of(cluster::CoordinatorMessage::kStartComm);
  ASSERT_EQ(sc.size(), 1u);
  EXPECT_EQ(sc[0].start_comm().comm().device_transport(), cluster::DEVICE_TRANSPORT_CUDA_IPC);
  EXPECT_EQ(sc[0].start_comm().comm().peer_secret().size(), 64u);  // every generation is keyed
  f.JoinAll();
  ASSERT_TRUE(f.manager->WaitReady(absl::Seconds(1)));
  auto placement = f.manager->GetPlacement();
  ASSERT_TRUE(placement.ok());
  EXPECT_EQ(placement->device_transport(), cluster::DEVICE_TRANSPORT_CUDA_IPC);
  EXPECT_EQ(placement->ranks(1).device_index(), 1);
  EXPECT_GT(placement->ranks(1).device_bytes(), uint64_t{1} << 30);  // the runtime allowance
}

TEST(ClusterManager, RefusedGpuPlacementSaysWhy) {
  Fixture f(2, 0);
  f.ConnectGpu("g0", "n0", 0, uint64_t{512} << 20);
  f.ConnectGpu("g1", "n0", 1, uint64_t{512} << 20);
  EXPECT_TRUE(f.sessions[0]->Of(cluster::CoordinatorMessage::kAssignment).empty());
  admin::ClusterStatus s = f.manager->Status();
  EXPECT_EQ(s.state(), admin::PLACEMENT_REFUSED);
  EXPECT_NE(s.message().find("placement failed: rank 0 (worker 'g0') needs about"),
            std::string::npos)
      << s.message();
  // A worker leaving makes it a wait for workers again.
  f.manager->OnSessionClosed(f.ids[1]);
  EXPECT_EQ(f.manager->Status().state(), admin::WAITING_FOR_WORKERS);
}

TEST(ClusterManager, MixedCpuAndGpuWorkersAreRefused) {
  Fixture f(2, 0);
  f.Connect("c0");
  f.ConnectGpu("g0", "n0", 0);
  admin::ClusterStatus s = f.manager->Status();
  EXPECT_EQ(s.state(), admin::PLACEMENT_REFUSED);
  EXPECT_NE(s.message().find("mix devices"), std::string::npos) << s.message();
}

TEST(ClusterManager, GpuRankGoesOnlyToANewcomerOnItsNode) {
  Fixture f(2, 2);
  f.ConnectGpu("g0", "n0", 0);
  f.ConnectGpu("g1", "n0", 1);
  f.Ready(0);
  f.Ready(1);
  f.JoinAll();
  ASSERT_TRUE(f.manager->WaitReady(absl::Seconds(1)));
  f.manager->OnSessionClosed(f.ids[1]);
  ASSERT_EQ(f.manager->Status().state(), admin::DEGRADED);
  // A GPU on another node would split the TP group: it waits.
  const int far = f.ConnectGpu("far", "n1", 0);
  EXPECT_TRUE(f.sessions[far]->Of(cluster::CoordinatorMessage::kAssignment).empty());
  EXPECT_NE(f.manager->Status().message().find("waiting for worker 'g1'"), std::string::npos)
      << f.manager->Status().message();
  const int near = f.ConnectGpu("near", "n0", 1);
  auto a = f.sessions[near]->Of(cluster::CoordinatorMessage::kAssignment);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].assignment().rank(), 1u);
  EXPECT_EQ(a[0].assignment().comm().device_transport(), cluster::DEVICE_TRANSPORT_CUDA_IPC);
}

TEST(ClusterManager, RankFailingWhileLoadingDegradesTheInstanceWithItsReason) {
  Fixture f(2, 2);
  f.ConnectGpu("g0", "n0", 0);
  f.ConnectGpu("g1", "n0", 1);
  // An error sent before this generation's Ready is about an older one.
  cluster::WorkerMessage stale;
  stale.mutable_error()->set_message("step failed: a peer is gone");
  f.manager->OnWorkerMessage(f.ids[1], stale);
  EXPECT_EQ(f.manager->Status().state(), admin::LOADING);
  f.Ready(0);
  f.Ready(1);
  cluster::WorkerMessage m;
  m.mutable_error()->set_message("joining the communicator failed: no peer");
  f.manager->OnWorkerMessage(f.ids[1], m);
  admin::ClusterStatus s = f.manager->Status();
  EXPECT_EQ(s.state(), admin::DEGRADED);
  EXPECT_EQ(s.message(),
            "rank 1 (worker 'g1') failed while loading: joining the communicator failed: no peer");
}

TEST(ClusterManager, RankFailingAStepFailsInflightAndFormsTheInstanceAgain) {
  Fixture f(2, 1);
  MakeReady(f, 2);
  absl::Status status;
  ASSERT_TRUE(f.manager->Submit(PromptOf({1}), EndInto(&status)).ok());

  // w1 dropped its engine after a failed step but its session lives.
  cluster::WorkerMessage m;
  m.mutable_error()->set_message("step failed: a device wait in combine ran past its bound");
  f.manager->OnWorkerMessage(f.ids[1], m);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(status.message().find("rank 1 (worker 'w1') failed a step"), std::string::npos)
      << status;
  EXPECT_EQ(f.manager->Status().state(), admin::LOADING);
  // Both workers get generation 2 with their old ranks, and serve again.
  for (int i = 0; i < 2; ++i) {
    auto a = f.sessions[i]->Of(cluster::CoordinatorMessage::kAssignment);
    ASSERT_EQ(a.size(), 2u);
    EXPECT_EQ(a.back().assignment().generation(), 2u);
    EXPECT_EQ(a.back().assignment().rank(), static_cast<uint32_t>(i));
  }
  f.Ready(0);
  f.Ready(1);
  f.JoinAll();
  EXPECT_TRUE(f.manager->WaitReady(absl::Seconds(1)));
  EXPECT_TRUE(f.manager->Submit(PromptOf({1}), {}).ok());
}

// ---- drain, survivors told at once, dead ids forgotten ----

// A READY instance of `workers` ranks at tp 1.
// The leader's token update ending request `id` with LENGTH.
cluster::WorkerMessage Finish(uint64_t id) {
  cluster::WorkerMessage m;
  cluster::SequenceUpdate* u = m.mutable_tokens()->add_updates();
  u->set_request_id(id);
  u->add_token_ids(5);
  u->set_finish_reason(common::LENGTH);
  return m;
}

TEST(ClusterManager, DrainRefusesNewRequestsAndLetsThoseInFlightFinish) {
  Fixture f(1, 1);
  MakeReady(f, 1);
  cluster::SubmitSequence req;
  req.add_prompt_ids(1);
  std::mutex mu;
  std::vector<absl::Status> ended;
  auto on_done = [&](const absl::Status& st) {
    std::lock_guard<std::mutex> lock(mu);
    ended.push_back(st);
  };
  std::vector<uint64_t> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(*f.manager->Submit(req, {nullptr, on_done}));
  std::thread drain([&] {
    const DrainResult r = Drain(*f.manager, absl::Seconds(10), [] { return false; });
    EXPECT_EQ(r.in_flight_at_start, 3);
    EXPECT_EQ(r.cut, 0);
  });
  while (!f.manager->draining()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  absl::StatusOr<uint64_t> refused = f.manager->Submit(req, {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(refused.status().message().find("shutting down"), std::string::npos);
  for (uint64_t id : ids) f.manager->OnWorkerMessage(f.ids[0], Finish(id));
  drain.join();
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(ended.size(), 3u);
  for (const absl::Status& st : ended) EXPECT_TRUE(st.ok()) << st;
}

TEST(ClusterManager, DrainTimeoutAndSecondSignalEndWhatIsLeft) {
  for (const bool second_signal : {false, true}) {
    Fixture f(1, 1);
    MakeReady(f, 1);
    cluster::SubmitSequence req;
    req.add_prompt_ids(1);
    absl::Status status;
    ASSERT_TRUE(f.manager->Submit(req, EndInto(&status)).ok());
    // The second signal ends the drain at once: had it waited out the 30 s,
    // it would report a timeout, not the interrupt.
    const DrainResult r =
        Drain(*f.manager, second_signal ? absl::Seconds(30) : absl::Milliseconds(50),
              [second_signal] { return second_signal; });
    EXPECT_EQ(r.cut, 1);
    EXPECT_EQ(r.interrupted, second_signal);
    EXPECT_EQ(r.timed_out, !second_signal);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(status.message().find(second_signal ? "second signal" : "drain timeout"),
              std::string::npos)
        << status;
  }
}

TEST(ClusterManager, SurvivorsAreToldToDropTheGenerationWhenAPeerDies) {
  Fixture f(3, 1);
  MakeReady(f, 3);
  const uint64_t generation = f.manager->Status().generation();
  f.manager->OnSessionClosed(f.ids[1]);
  for (int i : {0, 2}) {
    auto drops = f.sessions[i]->Of(cluster::CoordinatorMessage::kDropGeneration);
    ASSERT_EQ(drops.size(), 1u) << "worker " << i;
    EXPECT_EQ(drops[0].drop_generation().generation(), generation);
    EXPECT_NE(drops[0].drop_generation().reason().find("w1"), std::string::npos);
  }
  EXPECT_TRUE(f.sessions[1]->Of(cluster::CoordinatorMessage::kDropGeneration).empty());
}

TEST(ClusterManager, ARankFailingAStepMakesItsPeersDropTheGeneration) {
  Fixture f(2, 1);
  MakeReady(f, 2);
  const uint64_t generation = f.manager->Status().generation();
  cluster::WorkerMessage err;
  err.mutable_error()->set_message("step failed: rank 0: no message from rank(s) 1 within 10s");
  f.manager->OnWorkerMessage(f.ids[0], err);
  auto drops = f.sessions[1]->Of(cluster::CoordinatorMessage::kDropGeneration);
  ASSERT_EQ(drops.size(), 1u);
  EXPECT_EQ(drops[0].drop_generation().generation(), generation);
  // ... and the new generation's assignment follows it.
  auto& sent = f.sessions[1]->sent;
  ASSERT_GE(sent.size(), 2u);
  EXPECT_TRUE(sent.back().has_assignment());
  EXPECT_EQ(sent.back().assignment().generation(), generation + 1);
}

TEST(ClusterManager, DeadWorkersWithoutARankAreForgotten) {
  Fixture f(1, 1, absl::Seconds(30), 1024, 1 << 30, 0, absl::Milliseconds(100));
  MakeReady(f, 1);
  f.Connect("spare");
  ASSERT_EQ(f.manager->Status().workers_size(), 2);
  f.manager->OnSessionClosed(f.ids[1]);  // the spare dies: no rank
  f.manager->OnSessionClosed(f.ids[0]);  // the rank holder dies: kept, it is missed
  f.clock.Advance(absl::Milliseconds(101));
  ASSERT_TRUE(Eventually([&] { return f.manager->Status().workers_size() == 1; }));
  const admin::ClusterStatus s = f.manager->Status();
  ASSERT_EQ(s.workers_size(), 1);
  EXPECT_EQ(s.workers(0).worker_id(), "w0");
}


// Two instances of 2 workers each, migration on.
Fixture TwoInstances() {
  return Fixture(4, 2, absl::Seconds(30), 1024, 1 << 30, 0, absl::Seconds(60), 2, true);
}

TEST(ClusterManagerInstances, MalformedIsInvalidArgumentAndGoodIsUnavailableNamingEachInstance) {
  Fixture f = TwoInstances();
  cluster::SubmitSequence bad;
  bad.add_prompt_ids(1);
  bad.mutable_sampling()->set_temperature(-1);
  EXPECT_EQ(f.manager->Submit(bad, {}).status().code(), absl::StatusCode::kInvalidArgument);
  cluster::SubmitSequence good;
  good.add_prompt_ids(1);
  absl::StatusOr<uint64_t> refused = f.manager->Submit(good, {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(refused.status().message().find("instance 0"), std::string::npos) << refused.status();
  EXPECT_NE(refused.status().message().find("instance 1"), std::string::npos) << refused.status();
}

TEST(ClusterManagerInstances, ARequestWhoseInstanceLosesAWorkerContinuesOnTheOther) {
  Fixture f = TwoInstances();
  for (const char* id : {"w0", "w1", "w2", "w3"}) f.Connect(id);
  for (int i = 0; i < 4; ++i) f.Ready(i);
  f.JoinAll();
  admin::ClusterStatus s = f.manager->Status();
  ASSERT_EQ(s.instances_size(), 2);
  for (const admin::InstanceStatus& i : s.instances()) ASSERT_EQ(i.state(), admin::READY);
  for (const admin::WorkerStatus& w : s.workers()) {
    EXPECT_EQ(w.instance(), w.worker_id() < "w2" ? 0 : 1) << w.worker_id();
  }

  Streamed out;
  auto id = f.manager->Submit(PromptOf({5, 6}), out.Callbacks());
  ASSERT_TRUE(id.ok()) << id.status();
  // The leader of the instance that took it (rank 0 of w0/w1 or w2/w3).
  int leader = -1;
  for (int i = 0; i < 4; ++i) {
    if (!f.sessions[i]->Of(cluster::CoordinatorMessage::kSubmit).empty()) leader = i;
  }
  ASSERT_GE(leader, 0);
  const uint64_t inner =
      f.sessions[leader]->Of(cluster::CoordinatorMessage::kSubmit)[0].submit().request_id();
  cluster::WorkerMessage m;
  cluster::SequenceUpdate* u = m.mutable_tokens()->add_updates();
  u->set_request_id(inner);
  u->add_token_ids(7);
  u->add_token_ids(8);
  f.manager->OnWorkerMessage(f.ids[leader], m);

  // Its peer dies: the request goes to the other instance with what it streamed.
  const int peer = leader < 2 ? 1 - leader : 5 - leader;
  f.manager->OnSessionClosed(f.ids[peer]);
  EXPECT_FALSE(out.done.has_value()) << *out.done;
  int next = -1;
  for (int i = 0; i < 4; ++i) {
    if ((i < 2) != (leader < 2) && !f.sessions[i]->Of(cluster::CoordinatorMessage::kSubmit).empty()) {
      next = i;
    }
  }
  ASSERT_GE(next, 0) << "not resubmitted to the other instance";
  const cluster::SubmitSequence moved =
      f.sessions[next]->Of(cluster::CoordinatorMessage::kSubmit)[0].submit();
  EXPECT_EQ(std::vector<int>(moved.prompt_ids().begin(), moved.prompt_ids().end()),
            (std::vector<int>{5, 6}));
  EXPECT_EQ(std::vector<int>(moved.resume().output_ids().begin(), moved.resume().output_ids().end()),
            (std::vector<int>{7, 8}));

  cluster::WorkerMessage rest;
  u = rest.mutable_tokens()->add_updates();
  u->set_request_id(moved.request_id());
  u->add_token_ids(9);
  u->set_finish_reason(common::LENGTH);
  f.manager->OnWorkerMessage(f.ids[next], rest);
  EXPECT_EQ(out.tokens, (std::vector<int>{7, 8, 9}));
  ASSERT_TRUE(out.done.has_value());
  EXPECT_TRUE(out.done->ok()) << *out.done;
  EXPECT_EQ(f.manager->Status().requests_migrated(), 1u);
  EXPECT_EQ(f.manager->InflightRequests(), 0);
}

// Both instances of TwoInstances() serving.
void ServeTwoInstances(Fixture& f) {
  for (const char* id : {"w0", "w1", "w2", "w3"}) f.Connect(id);
  for (int i = 0; i < 4; ++i) f.Ready(i);
  f.JoinAll();
}

// The worker (index) whose session got the latest Submit, among `among`.
int SubmittedTo(Fixture& f, const std::vector<int>& among) {
  for (int i : among) {
    if (!f.sessions[i]->Of(cluster::CoordinatorMessage::kSubmit).empty()) return i;
  }
  return -1;
}

void SendUpdate(Fixture& f, int worker, uint64_t request, std::vector<float> logits,
                std::vector<int> tokens, bool last = false) {
  cluster::WorkerMessage m;
  cluster::SequenceUpdate* u = m.mutable_tokens()->add_updates();
  u->set_request_id(request);
  for (float v : logits) u->add_prompt_logits(v);
  for (int t : tokens) u->add_token_ids(t);
  if (last) u->set_finish_reason(common::LENGTH);
  f.manager->OnWorkerMessage(f.ids[worker], m);
}

TEST(ClusterManagerInstances, ARequestMovedWhileItsPromptLogitsStreamSendsEachRowOnce) {
  Fixture f = TwoInstances();
  ServeTwoInstances(f);
  cluster::SubmitSequence req = PromptOf({5, 6});
  req.set_return_prompt_logits(true);
  req.set_prompt_logits_credit_bytes(64);
  Streamed out;
  auto id = f.manager->Submit(req, out.Callbacks());
  ASSERT_TRUE(id.ok()) << id.status();
  const int leader = SubmittedTo(f, {0, 2});
  ASSERT_GE(leader, 0);
  const uint64_t inner =
      f.sessions[leader]->Of(cluster::CoordinatorMessage::kSubmit)[0].submit().request_id();
  SendUpdate(f, leader, inner, {1, 2, 3, 4}, {});

  // Its peer dies mid-logits: the other instance starts the prompt over (the
  // worker cannot resume prompt logits), allowed the 16 bytes it repeats.
  f.manager->OnSessionClosed(f.ids[leader + 1]);
  const int next = SubmittedTo(f, {2 - leader});
  ASSERT_GE(next, 0) << "not resubmitted to the other instance";
  const cluster::SubmitSequence moved =
      f.sessions[next]->Of(cluster::CoordinatorMessage::kSubmit)[0].submit();
  EXPECT_TRUE(moved.return_prompt_logits());
  EXPECT_FALSE(moved.has_resume());
  EXPECT_EQ(moved.prompt_logits_credit_bytes(), 64u + 16u);
  // The client's grants count what it was sent; the new attempt's add the repeat.
  f.manager->GrantPromptLogits(*id, 100);
  auto credits = f.sessions[next]->Of(cluster::CoordinatorMessage::kPromptLogitsCredit);
  ASSERT_EQ(credits.size(), 1u);
  EXPECT_EQ(credits[0].prompt_logits_credit().allowed_bytes(), 116u);

  // The repeated rows are dropped: the client sees 1..6 once, then tokens.
  SendUpdate(f, next, moved.request_id(), {1, 2, 3}, {});
  SendUpdate(f, next, moved.request_id(), {4, 5, 6}, {});
  SendUpdate(f, next, moved.request_id(), {}, {7}, /*last=*/true);
  EXPECT_EQ(out.prompt_logits, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(out.tokens, (std::vector<int>{7}));
  ASSERT_TRUE(out.done.has_value());
  EXPECT_TRUE(out.done->ok()) << *out.done;
}

TEST(ClusterManagerInstances, ARequestMovedAfterItsPromptLogitsResumesWithoutThem) {
  Fixture f = TwoInstances();
  ServeTwoInstances(f);
  cluster::SubmitSequence req = PromptOf({5, 6});
  req.set_return_prompt_logits(true);
  Streamed out;
  ASSERT_TRUE(f.manager->Submit(req, out.Callbacks()).ok());
  const int leader = SubmittedTo(f, {0, 2});
  ASSERT_GE(leader, 0);
  const uint64_t inner =
      f.sessions[leader]->Of(cluster::CoordinatorMessage::kSubmit)[0].submit().request_id();
  SendUpdate(f, leader, inner, {1, 2}, {});
  SendUpdate(f, leader, inner, {}, {7});
  f.manager->OnSessionClosed(f.ids[leader + 1]);
  const int next = SubmittedTo(f, {2 - leader});
  ASSERT_GE(next, 0);
  const cluster::SubmitSequence moved =
      f.sessions[next]->Of(cluster::CoordinatorMessage::kSubmit)[0].submit();
  // The logits were all sent (they come before the first token).
  EXPECT_FALSE(moved.return_prompt_logits());
  EXPECT_EQ(
      std::vector<int>(moved.resume().output_ids().begin(), moved.resume().output_ids().end()),
      (std::vector<int>{7}));
  SendUpdate(f, next, moved.request_id(), {}, {8}, /*last=*/true);
  EXPECT_EQ(out.prompt_logits, (std::vector<float>{1, 2}));
  EXPECT_EQ(out.tokens, (std::vector<int>{7, 8}));
  ASSERT_TRUE(out.done.has_value());
  EXPECT_TRUE(out.done->ok()) << *out.done;
}

// Requests submitted to TwoInstances() (serving) with these prompts, kept in
// flight: how many each instance's workers got.
std::pair<int, int> SpreadOver(Fixture& f, const std::vector<cluster::SubmitSequence>& prompts) {
  for (const cluster::SubmitSequence& p : prompts) {
    const absl::StatusOr<uint64_t> id = f.manager->Submit(p, {});
    EXPECT_TRUE(id.ok()) << id.status();
  }
  int first = 0, second = 0;
  for (int i = 0; i < 4; ++i) {
    const int n = static_cast<int>(f.sessions[i]->Of(cluster::CoordinatorMessage::kSubmit).size());
    (i < 2 ? first : second) += n;
  }
  return {first, second};
}

// Prompts of `opening` shared tokens followed by 16 of their own.
std::vector<cluster::SubmitSequence> Opening(int opening, int count) {
  std::vector<cluster::SubmitSequence> out(count);
  for (int r = 0; r < count; ++r) {
    for (int t = 0; t < opening; ++t) out[r].add_prompt_ids(1 + t % 500);
    for (int t = 0; t < 16; ++t) out[r].add_prompt_ids(600 + 16 * r + t);
  }
  return out;
}

// Every chat request opens with the same Harmony system message (64 tokens of
// o200k for a plain user turn): users who share only that are spread by load,
// not kept together as one tenant.
TEST(ClusterManagerInstances, ChatUsersSharingOnlyTheTemplatesOpeningAreSpread) {
  Fixture f = TwoInstances();
  ServeTwoInstances(f);
  const auto [first, second] = SpreadOver(f, Opening(64, 8));
  EXPECT_GE(first, 3);
  EXPECT_GE(second, 3);
}

// A long shared opening (a tenant's system prompt) keeps its requests on one
// instance while the load allows, so its prefix is computed and cached once.
TEST(ClusterManagerInstances, ATenantsLongSystemPromptKeepsItsRequestsTogether) {
  Fixture f = TwoInstances();
  ServeTwoInstances(f);
  const auto [first, second] = SpreadOver(f, Opening(400, 8));
  EXPECT_TRUE((first == 8 && second == 0) || (first == 0 && second == 8)) << first << " " << second;
}

TEST(ClusterManagerInstances, DrainingAnInstanceMovesItsRequestsAndRoutesAroundIt) {
  Fixture f = TwoInstances();
  for (const char* id : {"w0", "w1", "w2", "w3"}) f.Connect(id);
  for (int i = 0; i < 4; ++i) f.Ready(i);
  f.JoinAll();
  cluster::SubmitSequence req;
  req.add_prompt_ids(5);
  std::optional<absl::Status> done;
  ASSERT_TRUE(f.manager->Submit(req, {nullptr, [&](const absl::Status& st) { done = st; }}).ok());
  int leader = -1;
  for (int i = 0; i < 4; ++i) {
    if (!f.sessions[i]->Of(cluster::CoordinatorMessage::kSubmit).empty()) leader = i;
  }
  ASSERT_GE(leader, 0);
  const int instance = leader < 2 ? 0 : 1;
  absl::StatusOr<admin::DrainResult> r = f.manager->DrainInstance(instance, true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->drained());
  EXPECT_FALSE(done.has_value());
  // Moved: the other instance's leader has it, and new requests go there too.
  for (int k = 0; k < 3; ++k) ASSERT_TRUE(f.manager->Submit(req, {}).ok());
  int on_drained = 0, on_other = 0;
  for (int i = 0; i < 4; ++i) {
    const int n = static_cast<int>(f.sessions[i]->Of(cluster::CoordinatorMessage::kSubmit).size());
    ((i < 2) == (instance == 0) ? on_drained : on_other) += n;
  }
  EXPECT_EQ(on_drained, 1);  // the first submission only
  EXPECT_EQ(on_other, 4);
  const admin::ClusterStatus s = f.manager->Status();
  EXPECT_TRUE(s.instances(instance).drained());
  EXPECT_EQ(s.state(), admin::READY);
  ASSERT_TRUE(f.manager->DrainInstance(instance, false).ok());
  EXPECT_FALSE(f.manager->Status().instances(instance).drained());
}

}  // namespace
}  // namespace flotilla::coordinator
