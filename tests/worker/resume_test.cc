// Request migration on the worker (SubmitSequence.resume): a request
// submitted again with the first k tokens it streamed continues with exactly
// the tokens k.. of an undisturbed run, and counts those k as generated.
// Real CPU engines over a tiny synthetic model with the o200k vocabulary
// (resume_harness.h): one rank, and a TP 2 pair in threads over comm/local.
// Each run is on a fresh instance, as after a migration.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "comm/local/local_communicator.h"
#include "common/expert_map_proto.h"
#include "tests/worker/fake_coordinator_client.h"
#include "tests/worker/fake_engine.h"
#include "tests/worker/resume_harness.h"
#include "worker/engine/cpu_engine.h"
#include "worker/engine_factory.h"
#include "worker/parallel/host_context.h"
#include "worker/worker_runtime.h"

namespace flotilla::worker {
namespace {

using resume_testing::ExpectMaxTokensCountsTheResumedOutput;
using resume_testing::ExpectResumedRunsContinueExactly;
using resume_testing::OnLocalRanks;
using resume_testing::Request;
using resume_testing::ServeFn;
using resume_testing::TestModel;
using resume_testing::Updates;

constexpr int32_t kChannel = 200005;  // <|channel|>, what a constrained turn starts with

// Rank `rank` of a fresh CPU instance of `world` ranks serving `submit`.
Updates ServeCpuRank(const cluster::SubmitSequence& submit, int world, int rank,
                     comm::Communicator* comm) {
  const ModelConfig c = TestModel();
  std::unique_ptr<parallel::ParallelContext> context =
      resume_testing::HostContextFor(c, world, comm);
  if (comm != nullptr && context == nullptr) return {};
  CpuEngineOptions eo;
  eo.kv_block_size = 4;
  eo.kv_num_blocks = 256;
  absl::StatusOr<std::unique_ptr<CpuEngine>> engine =
      CpuEngine::Create(resume_testing::WeightsOf(world, rank), eo, nullptr, context.get());
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  return resume_testing::ServeOnRank(**engine, comm, context.get(), world, rank, submit);
}

// A fresh CPU instance of `world` ranks (TP `world`, ranks in threads).
Updates ServeCpu(const cluster::SubmitSequence& submit, int world) {
  return OnLocalRanks(world, [&](int rank, comm::Communicator* comm) {
    return ServeCpuRank(submit, world, rank, comm);
  });
}

class ResumeTest : public ::testing::TestWithParam<int> {  // the instance's ranks
 protected:
  ServeFn Serve() const {
    const int world = GetParam();
    return [world](const cluster::SubmitSequence& s) { return ServeCpu(s, world); };
  }
};

TEST_P(ResumeTest, GreedyContinuesWithTheUndisturbedTokens) {
  ExpectResumedRunsContinueExactly(Serve(), Request(16), {0, 1, 6, 15});
}

TEST_P(ResumeTest, SeededSamplingContinuesTheRandomStream) {
  ExpectResumedRunsContinueExactly(Serve(), resume_testing::Seeded(Request(16), 1234), {3, 9});
}

TEST_P(ResumeTest, PenaltiesCountTheResumedOutput) {
  const cluster::SubmitSequence greedy = resume_testing::Penalised(Request(16));
  ExpectResumedRunsContinueExactly(Serve(), greedy, {5, 11});
  ExpectResumedRunsContinueExactly(Serve(), resume_testing::Seeded(greedy, 99), {7});
}

TEST_P(ResumeTest, ConstrainedOutputContinuesInTheGrammarsState) {
  const cluster::SubmitSequence s =
      resume_testing::Constrained(resume_testing::Seeded(Request(24), 5));
  // In the header and inside the JSON body.
  ExpectResumedRunsContinueExactly(Serve(), s, {2, 10});
}

// The budget counts the analysis tokens before the resumption: resumed
// inside the analysis, <|end|> comes where it came in the undisturbed run.
TEST_P(ResumeTest, ReasoningBudgetCountsTheResumedAnalysis) {
  const cluster::SubmitSequence s = resume_testing::Reasoning(Request(20), 6);
  const std::vector<int32_t> tokens = resume_testing::TokensOf(Serve()(s));
  constexpr int32_t kEnd = 200007;  // <|end|>: the budget's end of the analysis
  ASSERT_GT(tokens.size(), 9u);
  ASSERT_EQ(tokens[9], kEnd) << "header of 3 tokens, 6 of analysis";
  ExpectResumedRunsContinueExactly(Serve(), s, {5, 8});
}

TEST_P(ResumeTest, MaxTokensCountsTheResumedOutput) {
  ExpectMaxTokensCountsTheResumedOutput(Serve());
}

INSTANTIATE_TEST_SUITE_P(Ranks, ResumeTest, ::testing::Values(1, 2), [](const auto& info) {
  return info.param == 1 ? "OneRank" : "TensorParallel2";
});

// A resumed output the constraint refuses ends the request with
// INVALID_ARGUMENT naming the position.
TEST(ResumeRefusalTest, ATokenTheGrammarRefusesNamesItsPosition) {
  cluster::SubmitSequence s = Request(16);
  s.mutable_constraint()->set_json_final(true);
  s.mutable_resume()->add_output_ids(kChannel);
  s.mutable_resume()->add_output_ids(42);  // "K": no header goes on with it
  const Updates got = ServeCpu(s, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].finish_reason(), common::ERROR);
  EXPECT_EQ(got[0].error_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(got[0].error().find("resume.output_ids[1]"), std::string::npos) << got[0].error();
}

// The whole worker: a WorkerRuntime (the CPU engine factory on
// synthetic:tiny:3, a fake coordinator client) takes a SubmitSequence with
// resume from its session and streams only the continuation. The same
// worker served the undisturbed run, so the resumed context comes partly
// from its prefix cache.
class WorkerRuntimeResumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto client = std::make_unique<FakeCoordinatorClient>();
    client_ = client.get();
    EngineFactories factories;
    factories.emplace("cpu", MakeCpuEngineFactory());
    WorkerOptions o;
    o.worker_id = "w0";
    o.threads = 1;
    o.kv_block_size = 4;
    o.advertise_address = "127.0.0.1";
    o.kv_host_cache_gb = kv_host_cache_gb_;
    auto runtime = WorkerRuntime::Create(o, std::move(client), std::move(factories));
    ASSERT_TRUE(runtime.ok()) << runtime.status();
    runtime_ = *std::move(runtime);
    thread_ = std::thread([this] { (void)runtime_->Run(); });
  }
  void TearDown() override {
    if (runtime_) runtime_->Stop();
    if (thread_.joinable()) thread_.join();
  }
  // Assignment and StartComm of a one-rank instance (`kv_blocks` KV blocks,
  // 0: the factory's sizing); true once it joined.
  bool Serve(uint64_t kv_blocks = 0) {
    const ModelConfig c = ModelConfig::Tiny();
    cluster::CoordinatorMessage m;
    cluster::Assignment* a = m.mutable_assignment();
    a->set_kv_blocks(kv_blocks);
    a->set_generation(1);
    a->set_model_path("synthetic:tiny:3");
    a->set_world_size(1);
    a->set_tp_size(1);
    *a->mutable_expert_map() =
        ExpertMapToProto(*ExpertMap::Contiguous(c.num_hidden_layers, c.num_local_experts, 1));
    a->set_max_batch_tokens(8);
    a->set_max_sequences(2);
    client_->Push(m);
    if (!client_->WaitFor(
            [](const auto& sent) { return Sent(sent, &cluster::WorkerMessage::has_ready); })) {
      return false;
    }
    cluster::CoordinatorMessage start;
    start.mutable_start_comm()->set_generation(1);
    client_->Push(start);
    return client_->WaitFor(
        [](const auto& sent) { return Sent(sent, &cluster::WorkerMessage::has_joined); });
  }
  static bool Sent(const std::vector<cluster::WorkerMessage>& sent,
                   bool (cluster::WorkerMessage::*has)() const) {
    return std::any_of(sent.begin(), sent.end(), [&](const auto& m) { return (m.*has)(); });
  }
  // Submits `submit` and waits for its end; its updates.
  Updates Run(const cluster::SubmitSequence& submit) {
    cluster::CoordinatorMessage m;
    *m.mutable_submit() = submit;
    client_->Push(m);
    auto updates = [&](const std::vector<cluster::WorkerMessage>& sent) {
      Updates got;
      for (const cluster::WorkerMessage& w : sent) {
        for (const cluster::SequenceUpdate& u : w.tokens().updates()) {
          if (u.request_id() == submit.request_id()) got.push_back(u);
        }
      }
      return got;
    };
    EXPECT_TRUE(client_->WaitFor([&](const auto& sent) {
      const Updates got = updates(sent);
      return !got.empty() && got.back().finish_reason() != common::FINISH_REASON_UNSPECIFIED;
    }));
    return updates(client_->sent());
  }

  double kv_host_cache_gb_ = 0;  // WorkerOptions::kv_host_cache_gb
  FakeCoordinatorClient* client_ = nullptr;
  std::unique_ptr<WorkerRuntime> runtime_;
  std::thread thread_;
};

TEST_F(WorkerRuntimeResumeTest, AResumedSubmitStreamsOnlyTheContinuation) {
  ASSERT_TRUE(Serve());
  cluster::SubmitSequence first;
  first.set_request_id(1);
  for (int32_t t : {3, 1, 4, 1, 5, 9, 2, 6, 5, 3}) first.add_prompt_ids(t);
  first.mutable_sampling()->set_max_tokens(12);
  first.mutable_sampling()->set_temperature(0.0f);
  first.mutable_sampling()->set_ignore_eos(true);
  const Updates whole = Run(first);
  const std::vector<int32_t> tokens = resume_testing::TokensOf(whole);
  ASSERT_EQ(tokens.size(), 12u) << whole.back().error();
  const uint64_t hits_before = client_->Load().prefix_cache_hits_tokens();

  cluster::SubmitSequence resumed = resume_testing::ResumedAfter(first, tokens, 5);
  resumed.set_request_id(2);
  const Updates rest = Run(resumed);
  EXPECT_EQ(resume_testing::TokensOf(rest), std::vector<int32_t>(tokens.begin() + 5, tokens.end()));
  EXPECT_EQ(rest.back().finish_reason(), common::LENGTH);
  EXPECT_EQ(rest.back().completion_tokens(), 12u);
  EXPECT_EQ(rest.back().prompt_tokens(), 10u);
  EXPECT_GT(client_->Load().prefix_cache_hits_tokens(), hits_before);
}

// --kv-host-cache-gb on the whole worker: a prompt whose blocks another
// prompt evicted from a one-sequence arena comes back from the host tier,
// with the same tokens, and the worker's load reports the tier's counters.
class WorkerRuntimeHostTierTest : public WorkerRuntimeResumeTest {
 protected:
  void SetUp() override {
    kv_host_cache_gb_ = 0.01;
    WorkerRuntimeResumeTest::SetUp();
  }
};

TEST_F(WorkerRuntimeHostTierTest, AnEvictedPromptComesBackFromTheHostTier) {
  const ModelConfig c = ModelConfig::Tiny();
  ASSERT_TRUE(Serve(static_cast<uint64_t>(
      CpuEngine::KvBlocksFor(c, c.num_key_value_heads, 4, 1, 40, /*prefix_cache=*/true))));
  auto submit = [](uint64_t id, int32_t first) {
    cluster::SubmitSequence s;
    s.set_request_id(id);
    for (int32_t i = 0; i < 30; ++i) s.add_prompt_ids(first + 7 * i % 97);
    s.mutable_sampling()->set_max_tokens(8);
    s.mutable_sampling()->set_temperature(0.0f);
    s.mutable_sampling()->set_ignore_eos(true);
    return s;
  };
  const std::vector<int32_t> first = resume_testing::TokensOf(Run(submit(1, 11)));
  ASSERT_EQ(first.size(), 8u);
  Run(submit(2, 500));  // needs the whole arena: the first prompt's blocks go to the host
  EXPECT_EQ(client_->Load().kv_host_hit_blocks(), 0u);
  EXPECT_EQ(resume_testing::TokensOf(Run(submit(3, 11))), first);
  // Published with the request's last tokens; a heartbeat later at most.
  for (int i = 0; i < 500 && client_->Load().kv_host_hit_blocks() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GT(client_->Load().kv_host_hit_blocks(), 0u);
  EXPECT_GT(client_->Load().kv_host_bytes_to_device(), 0u);
  EXPECT_GT(client_->Load().kv_host_bytes_to_host(), 0u);
}

// The refusals that need no engine, with the scheduler over a fake one.
class ResumeSchedulerTest : public ::testing::Test {
 protected:
  // Admits `submit`; the refusal's update, if any.
  std::optional<cluster::SequenceUpdate> Admit(const cluster::SubmitSequence& submit) {
    cluster::TokenBatch refused;
    scheduler_.Enqueue(submit, &refused);
    plan_ = scheduler_.Plan(&refused);
    if (refused.updates().empty()) return std::nullopt;
    return refused.updates(0);
  }
  static cluster::SubmitSequence Resumed(std::vector<int32_t> output, uint32_t max_tokens = 8) {
    cluster::SubmitSequence s;
    s.set_request_id(3);
    for (int32_t t : {10, 11, 12}) s.add_prompt_ids(t);
    s.mutable_sampling()->set_max_tokens(max_tokens);
    s.mutable_sampling()->set_temperature(0.0f);
    s.mutable_resume()->mutable_output_ids()->Add(output.begin(), output.end());
    return s;
  }
  void ExpectRefused(const cluster::SubmitSequence& submit, const std::string& says) {
    std::optional<cluster::SequenceUpdate> refused = Admit(submit);
    ASSERT_TRUE(refused.has_value());
    EXPECT_EQ(refused->error_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_NE(refused->error().find(says), std::string::npos) << refused->error();
    EXPECT_EQ(scheduler_.running(), 0u);
    EXPECT_EQ(scheduler_.kv_reserved(), 0);
  }

  static SchedulerLimits Limits() {
    SchedulerLimits limits;
    limits.max_batch_tokens = 64;
    limits.max_sequences = 4;
    return limits;
  }

  FakeEngine engine_{ModelConfig::Tiny(), /*total_blocks=*/64, /*block_size=*/4};
  Scheduler scheduler_{&engine_, Limits(), [] { return uint64_t{1000}; }};
  cluster::StepPlan plan_;
};

TEST_F(ResumeSchedulerTest, PrefillsThePromptAndTheOutputAndDrawsFromThere) {
  ASSERT_FALSE(Admit(Resumed({50, 51, 52})).has_value());
  ASSERT_EQ(plan_.items_size(), 1);
  EXPECT_EQ(std::vector<int32_t>(plan_.items(0).tokens().begin(), plan_.items(0).tokens().end()),
            (std::vector<int32_t>{10, 11, 12, 50, 51, 52}));
  EXPECT_EQ(plan_.items(0).logits(), cluster::PLAN_LOGITS_LAST);
  // The sampler has drawn three tokens already: the next draw is the fourth.
  Sampler* sampler = scheduler_.SamplerFor(plan_.items(0));
  ASSERT_NE(sampler, nullptr);
  EXPECT_EQ(sampler->draws(), 3u);
  // KV for the whole length, as an undisturbed run reserves.
  EXPECT_EQ(scheduler_.kv_reserved(), engine_.KvBlocksForLength(3 + 8));
}

TEST_F(ResumeSchedulerTest, RefusesWhatCannotContinue) {
  cluster::SubmitSequence logits = Resumed({50});
  logits.set_return_prompt_logits(true);
  ExpectRefused(logits, "return_prompt_logits");
  ExpectRefused(Resumed({50, 1024}), "resume.output_ids[1] = 1024 is outside");
  ExpectRefused(Resumed({1000}), "resume.output_ids[0] = 1000 is a stop token");
  ExpectRefused(Resumed({50, 51, 52, 53}, /*max_tokens=*/4), "nothing is left to generate");
  // A constraint needs the vocabulary, which this scheduler lacks.
  cluster::SubmitSequence constrained = Resumed({50});
  constrained.mutable_constraint()->set_json_final(true);
  std::optional<cluster::SequenceUpdate> refused = Admit(constrained);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->error_code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
}

}  // namespace
}  // namespace flotilla::worker
