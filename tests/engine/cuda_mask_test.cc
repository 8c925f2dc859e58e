// Structured outputs on the CUDA engine: a row whose sampler carries a token
// mask draws only allowed tokens (greedy: the best allowed logit), beside an
// unmasked row; the mask goes to the device with the step's inputs, so such
// steps keep device sampling (and decode graphs), and graphs stay valid for
// the unmasked steps that follow. Rows that want logprobs or their logits
// under a mask sample on the host, with the same guarantees.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>

#include "kernels/cuda/device.h"
#include "tests/engine/small_cuda_options.h"
#include "tests/engine/token_filter.h"
#include "worker/engine/cuda_engine.h"
#include "worker/engine/sampler.h"
#include "worker/model/synthetic_weights.h"

namespace flotilla {
namespace {

TEST(CudaEngineMask, MaskedRowsDrawOnlyAllowedTokens) {
  if (kernels::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device present";
  ModelConfig c = ModelConfig::Tiny();
  auto w = MakeSyntheticWeights(c, 21);
  ASSERT_TRUE(w.ok()) << w.status();
  auto e = CudaEngine::Create(*w, testing_util::SmallCudaOptions());
  ASSERT_TRUE(e.ok()) << e.status();
  CudaEngine& engine = **e;
  const std::vector<int32_t> allowed = {5, 77, 300, 901};
  for (float temperature : {0.0f, 1.0f}) {
    SamplingParams p;
    p.temperature = temperature;
    p.seed = 3;
    p.max_tokens = 100;
    std::vector<int32_t> seen;
    auto masked = *Sampler::Create(p, c.vocab_size);
    masked->SetFilter(std::make_unique<testing_filter::FixedFilter>(c.vocab_size, allowed, &seen));
    auto free = *Sampler::Create(p, c.vocab_size);
    const int64_t a = engine.NewSequence(), b = engine.NewSequence();
    std::vector<StepItem> items = {StepItem{a, {1, 2, 3}, LogitsMode::kNone, masked.get()},
                                   StepItem{b, {1, 2, 3}, LogitsMode::kNone, free.get()}};
    const int64_t host_steps = engine.host_sampled_steps();
    for (int step = 0; step < 8; ++step) {
      auto out = engine.Step(items);
      ASSERT_TRUE(out.ok()) << out.status();
      const int32_t t = out->sampled[0].token;
      EXPECT_TRUE(std::find(allowed.begin(), allowed.end(), t) != allowed.end()) << t;
      ASSERT_EQ(seen.size(), static_cast<size_t>(step + 1));
      EXPECT_EQ(seen.back(), t);
      items[0].tokens = {t};
      items[1].tokens = {out->sampled[1].token};
    }
    EXPECT_EQ(engine.host_sampled_steps(), host_steps) << "masked rows left the device sampler";
    // Greedy: the allowed token with the largest logit, from the logits
    // (a masked row that wants its logits samples on the host).
    if (temperature == 0.0f) {
      items[0].logits = LogitsMode::kLast;
      auto out = engine.Step(items);
      ASSERT_TRUE(out.ok()) << out.status();
      const std::vector<float>& logits = out->logits[0];
      int32_t best = allowed[0];
      for (int32_t t : allowed) {
        if (logits[logits.size() - c.vocab_size + t] > logits[logits.size() - c.vocab_size + best]) best = t;
      }
      EXPECT_EQ(out->sampled[0].token, best);
    }
    ASSERT_TRUE(engine.FreeSequence(a).ok());
    ASSERT_TRUE(engine.FreeSequence(b).ok());
  }
}

struct MaskFixture {
  ModelConfig config = ModelConfig::Tiny();
  std::unique_ptr<CudaEngine> engine;

  void Build(bool graphs) {
    auto w = MakeSyntheticWeights(config, 21);
    ASSERT_TRUE(w.ok()) << w.status();
    CudaEngineOptions o = testing_util::SmallCudaOptions();
    o.cuda_graphs = graphs;
    auto e = CudaEngine::Create(*w, o);
    ASSERT_TRUE(e.ok()) << e.status();
    engine = *std::move(e);
  }
  std::unique_ptr<Sampler> MakeSampler(float temperature, uint64_t seed,
                                       const std::vector<int32_t>* allowed,
                                       std::vector<int32_t>* seen) {
    SamplingParams p;
    p.temperature = temperature;
    p.seed = seed;
    p.max_tokens = 100;
    auto s = *Sampler::Create(p, config.vocab_size);
    if (allowed != nullptr) {
      s->SetFilter(std::make_unique<testing_filter::FixedFilter>(config.vocab_size, *allowed, seen));
    }
    return s;
  }
};

// Greedy under a mask on the device is the argmax over the allowed tokens of
// the same logits, which an unmasked twin row (same tokens, same position)
// brings back; with and without decode graphs.
TEST(CudaEngineMask, DeviceGreedyIsTheBestAllowedLogit) {
  if (kernels::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device present";
  for (bool graphs : {false, true}) {
    MaskFixture f;
    f.Build(graphs);
    ASSERT_NE(f.engine, nullptr);
    CudaEngine& engine = *f.engine;
    const int V = f.config.vocab_size;
    std::vector<int32_t> allowed;
    for (int32_t t = 3; t < V; t += 97) allowed.push_back(t);
    std::vector<int32_t> seen;
    auto masked = f.MakeSampler(0.0f, 1, &allowed, &seen);
    const int64_t a = engine.NewSequence(), twin = engine.NewSequence();
    std::vector<StepItem> items = {StepItem{a, {4, 5, 6}, LogitsMode::kNone, masked.get()},
                                   StepItem{twin, {4, 5, 6}, LogitsMode::kLast, nullptr}};
    const int64_t host_steps = engine.host_sampled_steps();
    for (int step = 0; step < 6; ++step) {
      auto out = engine.Step(items);
      ASSERT_TRUE(out.ok()) << out.status();
      const float* logits = out->logits[1].data() + out->logits[1].size() - V;
      int32_t best = allowed[0];
      for (int32_t t : allowed) {
        if (logits[t] > logits[best]) best = t;
      }
      // The twin's row holds the masked row's logits (up to the float order
      // of the batch), so the drawn token's is the best allowed one.
      const int32_t drawn = out->sampled[0].token;
      ASSERT_TRUE(std::find(allowed.begin(), allowed.end(), drawn) != allowed.end()) << drawn;
      EXPECT_GE(logits[drawn], logits[best] - 1e-3f) << "graphs " << graphs << " step " << step
                                                      << ": drew " << drawn << ", best " << best;
      items[0].tokens = {out->sampled[0].token};
      items[1].tokens = {out->sampled[0].token};
    }
    EXPECT_EQ(engine.host_sampled_steps(), host_steps);
    EXPECT_EQ(seen.size(), 6u);
  }
}

// Several masked rows in one step, each with its own mask: a one-token mask
// always gives its token, a sampled row only allowed ones, a mask allowing
// nothing is ignored (as on the CPU); a row that wants logprobs under a mask
// samples on the host and still draws only allowed tokens.
TEST(CudaEngineMask, SeveralMasksInOneStep) {
  if (kernels::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device present";
  MaskFixture f;
  f.Build(true);
  ASSERT_NE(f.engine, nullptr);
  CudaEngine& engine = *f.engine;
  const std::vector<int32_t> one = {777}, few = {10, 20, 30, 40, 50, 60}, none = {};
  std::vector<int32_t> seen_one, seen_few, seen_none;
  auto s_one = f.MakeSampler(1.0f, 7, &one, &seen_one);
  auto s_few = f.MakeSampler(1.0f, 8, &few, &seen_few);
  auto s_none = f.MakeSampler(1.0f, 9, &none, &seen_none);
  const int64_t a = engine.NewSequence(), b = engine.NewSequence(), c = engine.NewSequence();
  std::vector<StepItem> items = {StepItem{a, {1, 2}, LogitsMode::kNone, s_one.get()},
                                 StepItem{b, {3, 4}, LogitsMode::kNone, s_few.get()},
                                 StepItem{c, {5, 6}, LogitsMode::kNone, s_none.get()}};
  const int64_t host_steps = engine.host_sampled_steps();
  for (int step = 0; step < 10; ++step) {
    auto out = engine.Step(items);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->sampled[0].token, 777);
    EXPECT_TRUE(std::find(few.begin(), few.end(), out->sampled[1].token) != few.end())
        << out->sampled[1].token;
    for (size_t i = 0; i < items.size(); ++i) items[i].tokens = {out->sampled[i].token};
  }
  EXPECT_EQ(engine.host_sampled_steps(), host_steps);
  EXPECT_EQ(seen_none.size(), 10u);

  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 10;
  p.max_tokens = 100;
  p.logprobs = true;
  std::vector<int32_t> seen_lp;
  auto with_logprobs = *Sampler::Create(p, f.config.vocab_size);
  with_logprobs->SetFilter(
      std::make_unique<testing_filter::FixedFilter>(f.config.vocab_size, few, &seen_lp));
  items[1].sampler = with_logprobs.get();
  auto out = engine.Step(items);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(engine.host_sampled_steps(), host_steps + 1);
  EXPECT_EQ(out->sampled[0].token, 777);
  EXPECT_TRUE(std::find(few.begin(), few.end(), out->sampled[1].token) != few.end());
}

}  // namespace
}  // namespace flotilla
