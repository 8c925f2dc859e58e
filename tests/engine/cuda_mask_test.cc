// Structured outputs on the CUDA engine: a row whose sampler carries a token
// mask draws only allowed tokens (greedy: the best allowed logit), beside an
// unmasked row that keeps sampling on the device; graphs stay valid for the
// unmasked steps that follow.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>

#include "kernels/cuda/device.h"
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
  CudaEngineOptions o;
  o.kv_num_blocks = 64;
  o.max_context = 512;
  o.max_batch_tokens = 256;
  o.max_sequences = 4;
  auto e = CudaEngine::Create(*w, o);
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
    // Greedy: the allowed token with the largest logit, from the logits.
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

}  // namespace
}  // namespace flotilla
