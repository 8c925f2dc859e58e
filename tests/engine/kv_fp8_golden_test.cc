// --kv-cache-dtype fp8 on the CPU engine against bf16 KV on the golden
// fixtures (tests/data/golden): every prompt logit, and batched greedy
// decoding through the cache with both engines fed the bf16 engine's tokens.
//
// Bounds. The FP8 cache rounds each full-attention key and value to e4m3:
// 3 mantissa bits, so up to 2^-4 relative error per value, 16x the step of
// the bf16 the GPU engine computes in (whose logits are held to 0.03 *
// max(1, max |ref|) against this same reference in cuda_engine_test, 0.024
// measured). On these fixtures a score sums only head_dim = 16 products, so
// little of that error averages out: FP8 KV moves the logits by 0.04 to 0.11
// of their scale (measured, printed below), 1.5x to 4x the bf16 engine's
// differences. kFp8Tolerance = 0.15 allows that; a real fault (a scale
// ignored or applied to the wrong head, codes of the wrong position) moves
// them by O(1). Greedy agreement is held to the bf16 level: both engines are
// fed the bf16 engine's tokens, and the FP8 engine's argmax must equal it
// wherever the bf16 engine's top-2 logits are further apart than 2 x 0.03 of
// their scale (the criterion cuda_engine_test uses for the GPU engine).
//
// Routing is discrete and the fixtures' random routers nearly tie (within
// 1e-3), so any noise, bf16's too, can send a token to another expert, after
// which outputs legitimately differ. As in cuda_engine_test, the FP8 engine
// follows the bf16 engine's experts (ForceNextRouting) and reports its
// "regret" (how far below its own K-th best, by its own router logits, the
// forced choice was), which must stay within the same relative noise
// (kFp8Tolerance), so the forcing cannot hide a real routing change.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "tests/engine/golden_fixtures.h"
#include "tests/engine/logit_diff.h"
#include "worker/engine/cpu_engine.h"

namespace flotilla {
namespace {

constexpr double kFp8Tolerance = 0.15;
constexpr double kBf16Tolerance = 0.03;
constexpr float kMaxRegret = static_cast<float>(kFp8Tolerance);

int32_t Argmax(const std::vector<float>& row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

bool Decisive(const std::vector<float>& row) {
  std::vector<float> r = row;
  std::nth_element(r.begin(), r.begin() + 1, r.end(), std::greater<float>());
  return r[0] - r[1] > 2 * kBf16Tolerance * std::max(1.0f, std::abs(r[0]));
}

class KvFp8Golden : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    for (KvCacheDtype dtype : {KvCacheDtype::kBf16, KvCacheDtype::kFp8}) {
      absl::StatusOr<testing_golden::LoadedFixture> f = testing_golden::LoadFixture(GetParam());
      ASSERT_TRUE(f.ok()) << f.status();
      golden_ = std::move(f->golden);
      const ModelConfig c = f->weights.config;
      CpuEngineOptions o;
      o.kv_num_blocks = CpuEngine::KvBlocksFor(c, c.num_key_value_heads, 16, 4, 256);
      o.kv_cache_dtype = dtype;
      o.record_routing = dtype == KvCacheDtype::kBf16;
      absl::StatusOr<std::unique_ptr<CpuEngine>> e =
          CpuEngine::Create(std::move(f->weights), o, &pool_);
      ASSERT_TRUE(e.ok()) << e.status();
      (dtype == KvCacheDtype::kFp8 ? fp8_ : bf16_) = std::move(*e);
    }
  }

  std::vector<int32_t> Prompt(size_t i) const {
    return golden_["prompts"][i].get<std::vector<int32_t>>();
  }

  kernels::cpu::ThreadPool pool_{2};
  nlohmann::json golden_;
  std::unique_ptr<CpuEngine> bf16_, fp8_;
};

TEST_P(KvFp8Golden, PromptLogitsStayWithinBf16LevelDifferences) {
  double worst = 0, smallest = 1e30;
  float regret = 0;
  for (size_t i = 0; i < golden_["prompts"].size(); ++i) {
    std::vector<std::vector<float>> logits;
    std::vector<std::vector<int32_t>> routing;
    for (CpuEngine* e : {bf16_.get(), fp8_.get()}) {
      const int64_t s = e->NewSequence();
      if (e == fp8_.get()) e->ForceNextRouting(routing);
      absl::StatusOr<StepOutput> out = e->Step({StepItem{s, Prompt(i), LogitsMode::kAll}});
      ASSERT_TRUE(out.ok()) << out.status();
      logits.push_back(out->logits[0]);
      if (e == bf16_.get()) routing = out->routing;
      if (e == fp8_.get()) regret = std::max(regret, out->routing_regret[0]);
      ASSERT_TRUE(e->FreeSequence(s).ok());
    }
    const double rel = testing_golden::RelDiff(logits[1], logits[0]);
    EXPECT_LE(rel, kFp8Tolerance) << "prompt " << i;
    worst = std::max(worst, rel);
    smallest = std::min(smallest, testing_golden::MaxAbsDiff(logits[1], logits[0]));
  }
  // The FP8 cache is in use: the logits move (by less than the bound).
  EXPECT_GT(smallest, 0.0);
  EXPECT_LE(regret, kMaxRegret);
  std::cout << GetParam() << " fp8 KV vs bf16 KV: max |logit diff| / max(1, max |logit|) " << worst
            << " over " << golden_["prompts"].size() << " prompts, routing regret " << regret
            << "\n";
}

TEST_P(KvFp8Golden, GreedyTokensAgreeThroughTheCache) {
  const size_t n = golden_["prompts"].size();
  std::vector<StepItem> a, b;
  for (size_t i = 0; i < n; ++i) {
    a.push_back(StepItem{bf16_->NewSequence(), Prompt(i), LogitsMode::kLast});
    b.push_back(StepItem{fp8_->NewSequence(), Prompt(i), LogitsMode::kLast});
  }
  int steps = 0, equal = 0, decisive = 0, decisive_equal = 0;
  double worst = 0;
  float regret = 0;
  for (int step = 0; step < 24; ++step) {
    absl::StatusOr<StepOutput> ref = bf16_->Step(a);
    ASSERT_TRUE(ref.ok()) << ref.status();
    fp8_->ForceNextRouting(ref->routing);
    absl::StatusOr<StepOutput> got = fp8_->Step(b);
    ASSERT_TRUE(got.ok()) << got.status();
    for (size_t i = 0; i < n; ++i) {
      regret = std::max(regret, got->routing_regret[i]);
      const int32_t want = Argmax(ref->logits[i]);
      const bool same = Argmax(got->logits[i]) == want;
      ++steps;
      equal += same;
      if (Decisive(ref->logits[i])) {
        ++decisive;
        decisive_equal += same;
        EXPECT_TRUE(same) << "prompt " << i << " step " << step;
      }
      worst = std::max(worst, testing_golden::RelDiff(got->logits[i], ref->logits[i]));
      // Both continue with the bf16 engine's token, so every step compares
      // the same sequence.
      a[i].tokens = {want};
      b[i].tokens = {want};
    }
  }
  EXPECT_LE(worst, kFp8Tolerance);
  EXPECT_LE(regret, kMaxRegret);
  std::cout << GetParam() << " fp8 KV greedy: " << equal << "/" << steps << " tokens equal ("
            << decisive_equal << "/" << decisive << " decisive), max relative logit diff " << worst
            << ", routing regret " << regret << "\n";
}

TEST(KvCacheDtype, ParsesTheFlagsValues) {
  EXPECT_EQ(*ParseKvCacheDtype("auto"), KvCacheDtype::kBf16);
  EXPECT_EQ(*ParseKvCacheDtype("bf16"), KvCacheDtype::kBf16);
  EXPECT_EQ(*ParseKvCacheDtype("fp8"), KvCacheDtype::kFp8);
  const absl::StatusOr<KvCacheDtype> bad = ParseKvCacheDtype("fp16");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("\"fp16\" is not one of auto, bf16, fp8"),
            std::string::npos)
      << bad.status();
}

INSTANTIATE_TEST_SUITE_P(Fixtures, KvFp8Golden, ::testing::ValuesIn(testing_golden::Fixtures()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace flotilla
