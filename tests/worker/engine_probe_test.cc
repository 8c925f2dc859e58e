#include "worker/engine_probe.h"

#include <gtest/gtest.h>

#include "tests/engine/small_cpu_engine.h"
#include "worker/engine/cpu_engine.h"

namespace flotilla::worker {
namespace {

std::unique_ptr<CpuEngine> MakeEngine(int64_t blocks = 256) {
  return testing_util::SmallCpuEngine(ModelConfig::Tiny(), blocks);
}

// Forwards to a CpuEngine and records every step it is asked for.
class RecordingEngine : public Engine {
 public:
  explicit RecordingEngine(Engine* inner) : inner_(inner) {}
  int64_t NewSequence() override {
    ++created;
    return inner_->NewSequence();
  }
  absl::Status FreeSequence(int64_t s) override {
    ++freed;
    return inner_->FreeSequence(s);
  }
  absl::StatusOr<int64_t> SequenceLength(int64_t s) const override {
    return inner_->SequenceLength(s);
  }
  absl::Status Validate(const std::vector<StepItem>& items) const override {
    return inner_->Validate(items);
  }
  absl::StatusOr<StepOutput> Step(const std::vector<StepItem>& items) override {
    steps.push_back(items);
    return inner_->Step(items);
  }
  int64_t MaxSequenceLength() const override { return inner_->MaxSequenceLength(); }
  const ModelConfig& config() const override { return inner_->config(); }
  int64_t KvTotalBlocks() const override { return inner_->KvTotalBlocks(); }
  int64_t KvFreeBlocks() const override { return inner_->KvFreeBlocks(); }
  int64_t KvBlocksForLength(int64_t t) const override { return inner_->KvBlocksForLength(t); }

  std::vector<std::vector<StepItem>> steps;
  int created = 0, freed = 0;

 private:
  Engine* inner_;
};

cluster::MeasureEngineRequest SmallRequest() {
  cluster::MeasureEngineRequest r;
  for (uint32_t b : {4u, 1u, 2u, 2u}) r.add_batch_sizes(b);
  r.set_context_tokens(40);
  r.add_prefill_tokens(30);
  r.set_steps(3);
  r.set_warmup_steps(1);
  r.set_prefill_repeats(2);
  return r;
}

ProbeLimits Limits(const Engine& e) {
  ProbeLimits l;
  l.kv_blocks_available = e.KvFreeBlocks();
  l.max_batch_tokens = 16;
  l.max_sequences = 8;
  return l;
}

TEST(EngineProbe, TimesDecodePerBatchAndPrefillPerLengthLikeTheServingLoop) {
  auto cpu = MakeEngine();
  RecordingEngine e(cpu.get());
  auto m = MeasureEngine(e, SmallRequest(), Limits(e));
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->decode_size(), 3);  // sorted, duplicates dropped
  EXPECT_EQ(m->decode(0).batch(), 1u);
  EXPECT_EQ(m->decode(1).batch(), 2u);
  EXPECT_EQ(m->decode(2).batch(), 4u);
  EXPECT_EQ(m->decode(0).context_tokens(), 40u);
  // The first sequences are reused: batch 1 grew one by 4 tokens, batch 2 two more.
  EXPECT_EQ(m->decode(1).context_tokens(), 42u);
  EXPECT_EQ(m->decode(2).context_tokens(), 43u);
  for (const auto& d : m->decode()) {
    EXPECT_EQ(d.steps(), 3u);
    EXPECT_GT(d.step_ms_p50(), 0);
    EXPECT_LE(d.step_ms_min(), d.step_ms_p50());
    EXPECT_LE(d.step_ms_p50(), d.step_ms_max());
  }
  ASSERT_EQ(m->prefill_size(), 1);
  EXPECT_EQ(m->prefill(0).prompt_tokens(), 30u);
  EXPECT_EQ(m->prefill(0).chunk_tokens(), 16u);
  EXPECT_GT(m->prefill(0).ms_p50(), 0);
  // Prefills are chunked by the step budget; decode steps bring one token per
  // sequence; as in the serving loop, each draws its next token through a
  // sampler on the engine's device and asks for no logit rows.
  for (const auto& step : e.steps) {
    for (const StepItem& item : step) {
      EXPECT_LE(item.tokens.size(), 16u);
      if (step.size() > 1) {
        EXPECT_EQ(item.tokens.size(), 1u);
        EXPECT_EQ(item.logits, LogitsMode::kNone);
        EXPECT_NE(item.sampler, nullptr);
      }
    }
  }
  EXPECT_EQ(e.created, e.freed);
  EXPECT_EQ(cpu->KvFreeBlocks(), cpu->KvTotalBlocks());
}

TEST(EngineProbe, LeavesRunningSequencesAsTheyWere) {
  auto measured = MakeEngine();
  auto untouched = MakeEngine();
  const std::vector<int32_t> prompt = {3, 14, 15, 92, 65, 35, 89, 79};
  const int64_t a = measured->NewSequence(), b = untouched->NewSequence();
  ASSERT_TRUE(measured->Step({StepItem{a, prompt, LogitsMode::kLast}}).ok());
  ASSERT_TRUE(untouched->Step({StepItem{b, prompt, LogitsMode::kLast}}).ok());
  const int64_t free_before = measured->KvFreeBlocks();
  ASSERT_TRUE(MeasureEngine(*measured, SmallRequest(), Limits(*measured)).ok());
  EXPECT_EQ(measured->KvFreeBlocks(), free_before);
  EXPECT_EQ(*measured->SequenceLength(a), 8);
  auto next_a = measured->Step({StepItem{a, {7}, LogitsMode::kLast}});
  auto next_b = untouched->Step({StepItem{b, {7}, LogitsMode::kLast}});
  ASSERT_TRUE(next_a.ok() && next_b.ok());
  EXPECT_EQ(next_a->logits[0], next_b->logits[0]);
}

TEST(EngineProbe, ClampsBatchesToMaxSequences) {
  auto e = MakeEngine();
  cluster::MeasureEngineRequest r = SmallRequest();
  r.clear_batch_sizes();
  r.add_batch_sizes(64);
  ProbeLimits l = Limits(*e);
  l.max_sequences = 2;
  auto m = MeasureEngine(*e, r, l);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->decode_size(), 1);
  EXPECT_EQ(m->decode(0).batch(), 2u);
}

TEST(EngineProbe, RefusesCleanlyWhenKvIsShortOrLengthsDoNotFit) {
  auto cpu = MakeEngine();
  RecordingEngine e(cpu.get());
  ProbeLimits l = Limits(e);
  l.kv_blocks_available = 10;
  auto short_kv = MeasureEngine(e, SmallRequest(), l);
  EXPECT_EQ(short_kv.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(short_kv.status().message().find("KV blocks"), std::string::npos);
  EXPECT_TRUE(e.steps.empty());
  EXPECT_EQ(e.created, 0);

  cluster::MeasureEngineRequest too_long = SmallRequest();
  too_long.set_context_tokens(1 << 20);
  EXPECT_EQ(MeasureEngine(e, too_long, Limits(e)).status().code(),
            absl::StatusCode::kInvalidArgument);
  cluster::MeasureEngineRequest empty_prompt = SmallRequest();
  empty_prompt.add_prefill_tokens(0);
  EXPECT_EQ(MeasureEngine(e, empty_prompt, Limits(e)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(e.steps.empty());
}

// On a sharded instance every probe step goes through the step-token
// agreement first, with the tokens the step runs; a TP peer draws no tokens.
TEST(EngineProbe, EveryStepPassesTheLockstepAgreementAndPeersDoNotSample) {
  auto cpu = MakeEngine();
  RecordingEngine e(cpu.get());
  std::vector<int64_t> agreed;
  ProbeLockstep lockstep;
  lockstep.sample = false;
  lockstep.before_step = [&](int64_t tokens) {
    agreed.push_back(tokens);
    return absl::OkStatus();
  };
  ASSERT_TRUE(MeasureEngine(e, SmallRequest(), Limits(e), lockstep).ok());
  ASSERT_EQ(agreed.size(), e.steps.size());
  for (size_t i = 0; i < e.steps.size(); ++i) {
    int64_t tokens = 0;
    for (const StepItem& item : e.steps[i]) {
      tokens += static_cast<int64_t>(item.tokens.size());
      EXPECT_EQ(item.sampler, nullptr);
    }
    EXPECT_EQ(agreed[i], tokens) << "step " << i;
  }

  // Two ranks running the same request step the same tokens.
  auto other_cpu = MakeEngine();
  RecordingEngine other(other_cpu.get());
  ASSERT_TRUE(MeasureEngine(other, SmallRequest(), Limits(other)).ok());
  ASSERT_EQ(other.steps.size(), e.steps.size());
  for (size_t i = 0; i < e.steps.size(); ++i) {
    ASSERT_EQ(other.steps[i].size(), e.steps[i].size());
    for (size_t j = 0; j < e.steps[i].size(); ++j) {
      EXPECT_EQ(other.steps[i][j].tokens, e.steps[i][j].tokens) << "step " << i;
    }
  }

  // A failed agreement (a peer gone) stops the probe and frees its sequences.
  auto failing_cpu = MakeEngine();
  RecordingEngine failing(failing_cpu.get());
  int calls = 0;
  lockstep.before_step = [&](int64_t) {
    return ++calls < 3 ? absl::OkStatus() : absl::UnavailableError("peer gone");
  };
  EXPECT_EQ(MeasureEngine(failing, SmallRequest(), Limits(failing), lockstep).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(failing.steps.size(), 2u);
  EXPECT_EQ(failing.created, failing.freed);
  EXPECT_EQ(failing_cpu->KvFreeBlocks(), failing_cpu->KvTotalBlocks());
}

}  // namespace
}  // namespace flotilla::worker
