// The two FP8 options of the CPU engine against its default on the golden
// fixtures (tests/data/golden): every prompt logit (also against the
// fixture's transformers f32 logits), and batched greedy decoding with both
// engines fed the default engine's tokens.
// - kv fp8 (--kv-cache-dtype fp8): full-attention keys and values rounded to
//   e4m3 with a bf16 scale per (position, kv head) as the FP8 cache stores
//   them;
// - moe fp8 (--moe-activation fp8): the experts' inputs (x before gate_up,
//   the SwiGLU output before down) rounded through MXFP8 blocks of 32 values
//   (kernels/cpu/mxfp8.h), the numerics of a W4A8 MoE kernel.
//
// Bounds. Both round values to e4m3: 3 mantissa bits, so up to 2^-4
// relative error per value, 16x the step of the bf16 the GPU engine
// computes in (whose logits are held to 0.03 * max(1, max |ref|) against
// this same reference in cuda_engine_test, 0.024 measured). On these
// fixtures little of that error averages out (a score sums head_dim = 16
// or 32 products, an expert 64 or 96): the logits move by a few hundredths
// to a tenth of their scale (measured, printed below), 1.5x to 4x the bf16
// engine's differences. kFp8Tolerance = 0.15 allows that; a real fault (a
// scale ignored or applied to the wrong block or head, codes of the wrong
// position) moves them by O(1). The FP8 activations round both inputs of
// every expert in every layer, and an expert here sums only 64 or 96
// products: they moved the logits by 0.06 / 0.14 (prompts) and 0.10 / 0.18
// (decoding) on tiny_e8 / tiny_e16_sharded, so that variant is held to
// kMoeFp8Tolerance = 0.25. Greedy agreement is held to the bf16 level:
// both engines are fed the default engine's tokens, and the FP8 engine's
// argmax must equal it wherever the default engine's top-2 logits are
// further apart than 2 x 0.03 of their scale (the criterion
// cuda_engine_test uses for the GPU engine).
//
// Routing is discrete and the fixtures' random routers nearly tie (within
// 1e-3), so any noise, bf16's too, can send a token to another expert, after
// which outputs legitimately differ. As in cuda_engine_test, the FP8 engine
// follows the default engine's experts (ForceNextRouting) and reports its
// "regret" (how far below its own K-th best, by its own router logits, the
// forced choice was), which must stay within the same relative noise
// (the variant's tolerance), so the forcing cannot hide a real routing
// change.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/mxfp8.h"
#include "tests/engine/golden_fixtures.h"
#include "tests/engine/logit_diff.h"
#include "worker/engine/cpu_engine.h"

namespace flotilla {
namespace {

constexpr double kFp8Tolerance = 0.15;
constexpr double kMoeFp8Tolerance = 0.25;
constexpr double kBf16Tolerance = 0.03;

int32_t Argmax(const std::vector<float>& row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

bool Decisive(const std::vector<float>& row) {
  std::vector<float> r = row;
  std::nth_element(r.begin(), r.begin() + 1, r.end(), std::greater<float>());
  return r[0] - r[1] > 2 * kBf16Tolerance * std::max(1.0f, std::abs(r[0]));
}

// Which FP8 option the engine under test has.
enum class Variant { kKvFp8, kMoeFp8 };

std::string VariantName(Variant v) { return v == Variant::kKvFp8 ? "kv_fp8" : "moe_fp8"; }

using Param = std::tuple<std::string, Variant>;  // fixture, variant

class Fp8Golden : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    for (bool variant : {false, true}) {
      absl::StatusOr<testing_golden::LoadedFixture> f =
          testing_golden::LoadFixture(std::get<0>(GetParam()));
      ASSERT_TRUE(f.ok()) << f.status();
      golden_ = std::move(f->golden);
      const ModelConfig c = f->weights.config;
      CpuEngineOptions o;
      o.kv_num_blocks = CpuEngine::KvBlocksFor(c, c.num_key_value_heads, 16, 4, 256);
      if (variant && std::get<1>(GetParam()) == Variant::kKvFp8) {
        o.kv_cache_dtype = KvCacheDtype::kFp8;
      }
      if (variant && std::get<1>(GetParam()) == Variant::kMoeFp8) {
        o.moe_activation = MoeActivation::kFp8;
      }
      o.record_routing = !variant;
      absl::StatusOr<std::unique_ptr<CpuEngine>> e =
          CpuEngine::Create(std::move(f->weights), o, &pool_);
      ASSERT_TRUE(e.ok()) << e.status();
      (variant ? fp8_ : bf16_) = std::move(*e);
    }
  }

  std::vector<int32_t> Prompt(size_t i) const {
    return golden_["prompts"][i].get<std::vector<int32_t>>();
  }
  // The transformers f32 logits of prompt i's positions.
  std::vector<float> GoldenLogits(size_t i) const {
    return testing_golden::ReadF32(std::filesystem::path(testing_golden::GoldenDir()) /
                                   std::get<0>(GetParam()) /
                                   golden_["logits_files"][i].get<std::string>());
  }
  // The bound on relative logit differences and on the routing regret.
  double Tolerance() const {
    return std::get<1>(GetParam()) == Variant::kMoeFp8 ? kMoeFp8Tolerance : kFp8Tolerance;
  }
  std::string Name() const {
    return std::get<0>(GetParam()) + " " + VariantName(std::get<1>(GetParam()));
  }

  kernels::cpu::ThreadPool pool_{2};
  nlohmann::json golden_;
  std::unique_ptr<CpuEngine> bf16_, fp8_;  // the default engine, the one with the FP8 option
};

TEST_P(Fp8Golden, PromptLogitsStayWithinBf16LevelDifferences) {
  double worst = 0, smallest = 1e30, default_vs_golden = 0, fp8_vs_golden = 0;
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
    EXPECT_LE(rel, Tolerance()) << "prompt " << i;
    worst = std::max(worst, rel);
    smallest = std::min(smallest, testing_golden::MaxAbsDiff(logits[1], logits[0]));
    // Against transformers (the FP8 engine follows the default engine's
    // routing, which may differ from transformers' on a near tie: reported,
    // not bounded).
    const std::vector<float> golden = GoldenLogits(i);
    default_vs_golden = std::max(default_vs_golden, testing_golden::RelDiff(logits[0], golden));
    fp8_vs_golden = std::max(fp8_vs_golden, testing_golden::RelDiff(logits[1], golden));
  }
  // The FP8 option is in use: the logits move (by less than the bound).
  EXPECT_GT(smallest, 0.0);
  EXPECT_LE(regret, Tolerance());
  std::cout << Name() << " vs the default engine: max |logit diff| / max(1, max |logit|) " << worst
            << " over " << golden_["prompts"].size() << " prompts, routing regret " << regret
            << "; against transformers f32: default " << default_vs_golden << ", "
            << VariantName(std::get<1>(GetParam())) << " " << fp8_vs_golden << "\n";
}

TEST_P(Fp8Golden, GreedyTokensAgreeThroughTheCache) {
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
  EXPECT_LE(worst, Tolerance());
  EXPECT_LE(regret, Tolerance());
  std::cout << Name() << " greedy: " << equal << "/" << steps << " tokens equal (" << decisive_equal
            << "/" << decisive << " decisive), max relative logit diff " << worst
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

INSTANTIATE_TEST_SUITE_P(Fixtures, Fp8Golden,
                         ::testing::Combine(::testing::ValuesIn(testing_golden::Fixtures()),
                                            ::testing::Values(Variant::kKvFp8, Variant::kMoeFp8)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  VariantName(std::get<1>(info.param));
                         });

TEST(MoeActivation, ParsesTheFlagsValues) {
  EXPECT_EQ(*ParseMoeActivation("auto"), MoeActivation::kDefault);
  EXPECT_EQ(*ParseMoeActivation("bf16"), MoeActivation::kDefault);
  EXPECT_EQ(*ParseMoeActivation("fp8"), MoeActivation::kFp8);
  const absl::StatusOr<MoeActivation> bad = ParseMoeActivation("fp4");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("\"fp4\" is not one of auto, bf16, fp8"), std::string::npos)
      << bad.status();
}

// The MXFP8 rule itself (kernels/cpu/mxfp8.h).
TEST(Mxfp8, TheScaleIsTheSmallestPowerOfTwoThatKeeps448) {
  using kernels::cpu::Mxfp8ScaleExponent;
  EXPECT_EQ(Mxfp8ScaleExponent(448.0f), 0);
  EXPECT_EQ(Mxfp8ScaleExponent(448.5f), 1);
  EXPECT_EQ(Mxfp8ScaleExponent(1.0f), -8);  // 256 <= 448 < 512
  EXPECT_EQ(Mxfp8ScaleExponent(1.9f), -7);  // 1.9 x 256 > 448
  EXPECT_EQ(Mxfp8ScaleExponent(0.0f), 0);
  EXPECT_EQ(Mxfp8ScaleExponent(NAN), 0);
  EXPECT_EQ(Mxfp8ScaleExponent(1e-45f), -127);  // clamped to the e8m0 range
}

TEST(Mxfp8, BlocksRoundTripWithinTheE4m3Step) {
  std::vector<float> x(3 * 32 + 7);  // three whole blocks and a short one
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = std::sin(0.7f * static_cast<float>(i)) * (i % 32 == 5 ? 40.0f : 1.0f) *
           (i < 32 ? 1e-3f : 1.0f);
  }
  x[40] = 0.0f;
  std::vector<float> y = x;
  kernels::cpu::RoundTripMxfp8Rows(y.data(), 1, static_cast<int64_t>(y.size()));
  for (size_t b = 0; b < x.size(); b += 32) {
    const size_t n = std::min<size_t>(32, x.size() - b);
    float amax = 0;
    for (size_t i = b; i < b + n; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float scale = std::ldexp(1.0f, kernels::cpu::Mxfp8ScaleExponent(amax));
    for (size_t i = b; i < b + n; ++i) {
      // Normal e4m3: half a step of 3 mantissa bits; below, the subnormal
      // step 2^-9 of the scale.
      EXPECT_LE(std::fabs(y[i] - x[i]), std::fabs(x[i]) / 16 + scale / 1024) << i;
      // Idempotent: a value already on the grid stays.
      float again = y[i];
      kernels::cpu::RoundTripMxfp8Block(&again, 1);
      EXPECT_EQ(again, y[i]) << i;
    }
  }
  EXPECT_EQ(y[40], 0.0f);
  EXPECT_NE(y, x);
  // The largest value of a block never saturates.
  std::vector<float> big = {509.0f, -1.0f};
  kernels::cpu::RoundTripMxfp8Block(big.data(), 2);
  EXPECT_EQ(big[0], 512.0f);  // 1.0 x 2^9 (scale 2^1: 254.5 rounds to 256)
  EXPECT_EQ(big[1], -1.0f);
}

}  // namespace
}  // namespace flotilla
