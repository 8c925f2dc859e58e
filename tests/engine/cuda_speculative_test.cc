// Speculative decoding on the CUDA engine: a run whose steps bring drafted
// tokens (all sequences k of them: a captured graph; fewer near the end:
// launched eagerly) gives exactly the tokens of the same run without them, on the tiny
// preset's synthetic weights and on the golden checkpoints, for greedy
// requests (drawn on the device), seeded sampled ones (the device's Philox
// draws at draws() + j) and penalised ones (verified on the host). The
// drafts are the run's own continuation with every third drafted token
// replaced, so verification accepts some and rejects others, and the
// rejected positions' KV must be overwritten correctly for the tokens to
// stay equal. Every KV block is free once the sequences are.
// Needs a GPU (label gpu); skipped without one.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/device.h"
#include "tests/engine/golden_fixtures.h"
#include "tests/engine/small_cuda_options.h"
#include "worker/engine/cuda_engine.h"
#include "worker/engine/sampler.h"
#include "worker/model/synthetic_weights.h"

namespace flotilla {
namespace {

using testing_util::HaveGpu;

constexpr int kSteps = 24;  // tokens generated per sequence

SamplingParams Greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = 1000;
  return p;
}

SamplingParams Seeded(uint64_t seed) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_p = 0.95f;
  p.seed = seed;
  p.logprobs = true;
  p.top_logprobs = 2;
  p.max_tokens = 1000;
  return p;
}

SamplingParams Penalised() {
  SamplingParams p = Greedy();
  p.frequency_penalty = 0.5f;
  p.repetition_penalty = 1.1f;
  return p;
}

// What a run gave per sequence: its tokens and their logprobs.
struct Run {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> logprobs;
  int64_t drafted = 0, accepted = 0;
};

// Generates kSteps tokens for each prompt, the sequences in one batch, with
// the engine drawing each token. With `reference` (a run without drafts),
// each step drafts up to `k` tokens of the reference's continuation, every
// third drafted token (by output position) replaced by another, as a
// scheduler brings them (accepted_draft from the last verification).
Run Generate(CudaEngine& engine, const std::vector<std::vector<int32_t>>& prompts,
             const SamplingParams& params, const Run* reference, int k) {
  const int V = engine.config().vocab_size;
  const size_t n = prompts.size();
  Run run;
  run.tokens.resize(n);
  run.logprobs.resize(n);
  std::vector<std::unique_ptr<Sampler>> samplers;
  std::vector<int64_t> seqs;
  std::vector<std::vector<int32_t>> accepted(n);
  std::vector<bool> done(n, false);
  for (size_t i = 0; i < n; ++i) {
    absl::StatusOr<std::unique_ptr<Sampler>> s = Sampler::Create(params, V, prompts[i]);
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return run;
    samplers.push_back(std::move(*s));
    seqs.push_back(engine.NewSequence());
  }
  bool first = true;
  while (true) {
    std::vector<StepItem> items;
    std::vector<size_t> which;
    for (size_t i = 0; i < n; ++i) {
      if (done[i]) continue;
      StepItem it{seqs[i], first ? prompts[i] : std::vector<int32_t>{run.tokens[i].back()},
                  LogitsMode::kNone, samplers[i].get()};
      it.accepted_draft = std::move(accepted[i]);
      accepted[i].clear();
      const size_t at = run.tokens[i].size();
      if (!first && reference != nullptr) {
        const std::vector<int32_t>& want = reference->tokens[i];
        for (size_t j = at;
             j < want.size() && j < at + static_cast<size_t>(k) && static_cast<int>(j) < kSteps - 1;
             ++j) {
          it.tokens.push_back(j % 3 == 2 ? (want[j] + 1) % V : want[j]);
          ++it.draft_tokens;
        }
      }
      items.push_back(std::move(it));
      which.push_back(i);
    }
    if (items.empty()) break;
    absl::StatusOr<StepOutput> out = engine.Step(items);
    EXPECT_TRUE(out.ok()) << out.status();
    if (!out.ok()) break;
    for (size_t b = 0; b < which.size(); ++b) {
      const size_t i = which[b];
      run.drafted += items[b].draft_tokens;
      std::vector<TokenLogprob> drawn =
          b < out->accepted.size() ? out->accepted[b] : std::vector<TokenLogprob>{};
      run.accepted += static_cast<int64_t>(drawn.size());
      for (const TokenLogprob& t : drawn) accepted[i].push_back(t.token);
      drawn.push_back(out->sampled[b]);
      for (const TokenLogprob& t : drawn) {
        if (static_cast<int>(run.tokens[i].size()) == kSteps) break;
        run.tokens[i].push_back(t.token);
        run.logprobs[i].push_back(t.logprob);
      }
      done[i] = static_cast<int>(run.tokens[i].size()) == kSteps;
    }
    first = false;
  }
  for (int64_t s : seqs) EXPECT_TRUE(engine.FreeSequence(s).ok());
  return run;
}

// Speculation on and off give the same tokens (logprobs within float noise
// of the differently batched rows) for `params`, and the blocks all return.
// `added_graphs`: the graphs the run with drafts captured beyond the run
// without.
void ExpectSameWithDrafts(CudaEngine& engine, const std::vector<std::vector<int32_t>>& prompts,
                          const SamplingParams& params, int k, size_t* added_graphs = nullptr) {
  const int64_t free_before = engine.KvFreeBlocks();
  const Run off = Generate(engine, prompts, params, nullptr, 0);
  const size_t graphs = engine.captured_graphs();
  const Run on = Generate(engine, prompts, params, &off, k);
  if (added_graphs != nullptr) *added_graphs = engine.captured_graphs() - graphs;
  ASSERT_EQ(on.tokens.size(), off.tokens.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(on.tokens[i], off.tokens[i]) << "sequence " << i;
    if (!params.logprobs) continue;
    ASSERT_EQ(on.logprobs[i].size(), off.logprobs[i].size());
    for (size_t j = 0; j < on.logprobs[i].size(); ++j) {
      EXPECT_NEAR(on.logprobs[i][j], off.logprobs[i][j], 0.05f) << "sequence " << i << " " << j;
    }
  }
  EXPECT_GT(on.drafted, 0);
  EXPECT_GT(on.accepted, 0) << "no drafted token was accepted";
  EXPECT_LT(on.accepted, on.drafted) << "every third drafted token is wrong";
  EXPECT_EQ(engine.KvFreeBlocks(), free_before);
}

// 32 sequences: 4 drafting 4 tokens take 20 sampling rows, all on the device.
std::unique_ptr<CudaEngine> TinyDraftingEngine(uint64_t seed) {
  absl::StatusOr<ModelWeights> w = MakeSyntheticWeights(ModelConfig::Tiny(), seed);
  EXPECT_TRUE(w.ok()) << w.status();
  if (!w.ok()) return nullptr;
  absl::StatusOr<std::unique_ptr<CudaEngine>> e =
      CudaEngine::Create(*w, testing_util::SmallCudaOptions(256, 1024, 512, 32));
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

const std::vector<std::vector<int32_t>> kPrompts = {
    {1, 2, 3, 4, 5}, {9, 9, 8, 7, 9, 9, 8, 7}, {40, 41}, {7, 100, 7, 100, 7}};

TEST(CudaSpeculative, GreedyTokensEqualWithDraftsOnTheDevice) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device present";
  std::unique_ptr<CudaEngine> e = TinyDraftingEngine(21);
  ASSERT_NE(e, nullptr);
  for (int k : {1, 3, 4}) {
    SCOPED_TRACE(k);
    // Steps whose sequences all bring k drafted tokens replay a graph of
    // their own (4 sequences of k + 1 tokens) beside the decode steps'.
    size_t added = 0;
    ExpectSameWithDrafts(*e, kPrompts, Greedy(), k, &added);
    EXPECT_GE(added, 1u);
  }
  EXPECT_EQ(e->host_sampled_steps(), 0) << "greedy drafts are verified on the device";
}

// More drafted rows than the sampling buffers hold (max_sequences): the
// step verifies on the host, with the same tokens.
TEST(CudaSpeculative, DraftsPastTheSamplingRowsAreVerifiedOnTheHost) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device present";
  absl::StatusOr<ModelWeights> w = MakeSyntheticWeights(ModelConfig::Tiny(), 25);
  ASSERT_TRUE(w.ok()) << w.status();
  absl::StatusOr<std::unique_ptr<CudaEngine>> e =
      CudaEngine::Create(*w, testing_util::SmallCudaOptions(256, 1024, 512, 8));
  ASSERT_TRUE(e.ok()) << e.status();
  ExpectSameWithDrafts(**e, kPrompts, Greedy(), 4);  // 4 x 5 rows > 8
  EXPECT_GT((*e)->host_sampled_steps(), 0);
}

TEST(CudaSpeculative, SeededTokensEqualWithDraftsOnTheDevice) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device present";
  std::unique_ptr<CudaEngine> e = TinyDraftingEngine(22);
  ASSERT_NE(e, nullptr);
  ExpectSameWithDrafts(*e, kPrompts, Seeded(77), 3);
  EXPECT_EQ(e->host_sampled_steps(), 0) << "seeded drafts are verified on the device";
}

TEST(CudaSpeculative, PenalisedTokensEqualWithDraftsVerifiedOnTheHost) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device present";
  std::unique_ptr<CudaEngine> e = TinyDraftingEngine(23);
  ASSERT_NE(e, nullptr);
  ExpectSameWithDrafts(*e, kPrompts, Penalised(), 3);
  EXPECT_GT(e->host_sampled_steps(), 0) << "penalised drafts go through the host sampler";
}

TEST(CudaSpeculative, AWrongAcceptedDraftIsRefused) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device present";
  std::unique_ptr<CudaEngine> e = TinyDraftingEngine(24);
  ASSERT_NE(e, nullptr);
  const int64_t s = e->NewSequence();
  ASSERT_TRUE(e->Step({StepItem{s, {1, 2, 3}, LogitsMode::kLast}}).ok());
  StepItem drafted{s, {4, 5, 6}, LogitsMode::kLast};
  drafted.draft_tokens = 2;
  absl::StatusOr<StepOutput> out = e->Step({drafted});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->logits[0].size(), 3u * e->config().vocab_size) << "one row per verified position";
  EXPECT_EQ(*e->SequenceLength(s), 4) << "drafted tokens are not committed";
  StepItem wrong{s, {7}, LogitsMode::kLast};
  wrong.accepted_draft = {6};
  absl::Status st = e->Step({wrong}).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("not the start of its last step's draft"), std::string::npos) << st;
  StepItem right{s, {7}, LogitsMode::kLast};
  right.accepted_draft = {5};
  ASSERT_TRUE(e->Step({right}).ok());
  EXPECT_EQ(*e->SequenceLength(s), 6);
  ASSERT_TRUE(e->FreeSequence(s).ok());
  EXPECT_EQ(e->KvFreeBlocks(), e->KvTotalBlocks());
}

class CudaSpeculativeGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaSpeculativeGolden, GreedyTokensEqualWithDrafts) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device present";
  absl::StatusOr<testing_golden::LoadedFixture> fixture = testing_golden::LoadFixture(GetParam());
  ASSERT_TRUE(fixture.ok()) << fixture.status();
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& p : fixture->golden["prompts"]) prompts.push_back(p.get<std::vector<int32_t>>());
  absl::StatusOr<std::unique_ptr<CudaEngine>> e =
      CudaEngine::Create(fixture->weights, testing_util::SmallCudaOptions(256, 2048, 1024, 16));
  ASSERT_TRUE(e.ok()) << e.status();
  ExpectSameWithDrafts(**e, prompts, Greedy(), 3);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaSpeculativeGolden,
                         ::testing::ValuesIn(testing_golden::Fixtures()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace flotilla
