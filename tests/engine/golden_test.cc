// Parity with Hugging Face transformers on every fixture under
// tests/data/golden/ (see its README): every prompt logit within 1e-3, greedy
// continuations identical, and decoding through the KV cache matches the
// recorded logits of the whole continued sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tests/engine/chunked_prefill.h"
#include "tests/engine/golden_fixtures.h"
#include "tests/engine/logit_diff.h"
#include "worker/engine/cpu_engine.h"
#include "worker/engine/sampler.h"
#include "worker/model/checkpoint.h"
#include "worker/model/load_weights.h"

namespace flotilla {
namespace {

namespace fs = std::filesystem;
using testing_golden::Fixtures;
using testing_golden::ReadF32;
constexpr double kTolerance = 1e-3;

using testing_golden::MaxAbsDiff;

class Golden : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = fs::path(testing_golden::GoldenDir()) / GetParam();
    absl::StatusOr<testing_golden::LoadedFixture> fixture = testing_golden::LoadFixture(GetParam());
    ASSERT_TRUE(fixture.ok()) << fixture.status();
    golden_ = std::move(fixture->golden);
    std::optional<ModelWeights> w = std::move(fixture->weights);
    ASSERT_EQ(w->config.vocab_size, golden_["vocab_size"].get<int>());
    CpuEngineOptions o;
    o.kv_block_size = 16;
    o.kv_num_blocks = CpuEngine::KvBlocksFor(w->config, w->config.num_key_value_heads, 16, 2, 256);
    auto e = CpuEngine::Create(std::move(*w), o, &pool_);
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
  }

  std::vector<int32_t> Prompt(size_t i) { return golden_["prompts"][i].get<std::vector<int32_t>>(); }

  kernels::cpu::ThreadPool pool_{2};
  fs::path dir_;
  nlohmann::json golden_;
  std::unique_ptr<CpuEngine> engine_;
};

TEST_P(Golden, PromptLogitsMatchTransformers) {
  const int64_t V = golden_["vocab_size"];
  for (size_t i = 0; i < golden_["prompts"].size(); ++i) {
    SCOPED_TRACE("prompt " + std::to_string(i));
    std::vector<int32_t> prompt = Prompt(i);
    std::vector<float> want = ReadF32(dir_ / golden_["logits_files"][i].get<std::string>());
    ASSERT_EQ(want.size(), prompt.size() * V);
    // One-shot prefill and prefill in chunks of 5 must both match.
    for (size_t chunk : {prompt.size(), size_t{5}}) {
      int64_t s = engine_->NewSequence();
      auto got = testing_util::PrefillInChunks(*engine_, s, prompt, chunk);
      ASSERT_TRUE(got.ok()) << got.status();
      const double worst = MaxAbsDiff(got->logits, want);
      EXPECT_LE(worst, kTolerance) << "chunk " << chunk;
      std::cout << GetParam() << " prompt " << i << " chunk " << chunk << ": max |logit diff| "
                << worst << "\n";
      ASSERT_TRUE(engine_->FreeSequence(s).ok());
    }
  }
}

TEST_P(Golden, GreedyContinuationsAreIdentical) {
  const int64_t V = golden_["vocab_size"];
  // All prompts decode together in one batch.
  const size_t n = golden_["prompts"].size();
  std::vector<int64_t> seqs;
  std::vector<StepItem> items;
  for (size_t i = 0; i < n; ++i) {
    seqs.push_back(engine_->NewSequence());
    items.push_back(StepItem{seqs[i], Prompt(i), LogitsMode::kLast});
  }
  std::vector<std::vector<int32_t>> got(n);
  for (int step = 0; step < 24; ++step) {
    auto out = engine_->Step(items);
    ASSERT_TRUE(out.ok()) << out.status();
    for (size_t i = 0; i < n; ++i) {
      int32_t t = Argmax(out->logits[i].data(), V);
      got[i].push_back(t);
      items[i].tokens = {t};
    }
  }
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(got[i], golden_["greedy"][i].get<std::vector<int32_t>>()) << "prompt " << i;
  }
}

TEST_P(Golden, DecodingThroughTheCacheMatchesTheFullSequence) {
  if (!golden_.contains("full_sequence")) {
    GTEST_SKIP() << "fixture has no full_sequence";
  }
  const int64_t V = golden_["vocab_size"];
  const auto& fs_json = golden_["full_sequence"];
  std::vector<int32_t> tokens = fs_json["tokens"].get<std::vector<int32_t>>();
  std::vector<float> want = ReadF32(dir_ / fs_json["logits_file"].get<std::string>());
  ASSERT_EQ(want.size(), tokens.size() * V);
  const size_t prompt_len = Prompt(fs_json["prompt_index"].get<size_t>()).size();
  int64_t s = engine_->NewSequence();
  auto first = engine_->Step({StepItem{s, {tokens.begin(), tokens.begin() + prompt_len}, LogitsMode::kAll}});
  ASSERT_TRUE(first.ok()) << first.status();
  std::vector<float> got = first->logits[0];
  for (size_t i = prompt_len; i < tokens.size(); ++i) {
    auto out = engine_->Step({StepItem{s, {tokens[i]}, LogitsMode::kLast}});
    ASSERT_TRUE(out.ok()) << out.status();
    got.insert(got.end(), out->logits[0].begin(), out->logits[0].end());
  }
  const double worst = MaxAbsDiff(got, want);
  EXPECT_LE(worst, kTolerance);
  std::cout << GetParam() << " decode through the cache: max |logit diff| " << worst << "\n";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Golden, ::testing::ValuesIn(Fixtures()),
                         [](const auto& info) { return info.param; });

TEST(GoldenFixtures, AtLeastOneIsPresent) {
  EXPECT_FALSE(Fixtures().empty()) << "no fixtures under " << FLOTILLA_GOLDEN_DIR;
}

}  // namespace
}  // namespace flotilla
