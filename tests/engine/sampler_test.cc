#include "worker/engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <memory>
#include <vector>

#include "tests/engine/token_filter.h"

namespace flotilla {
namespace {

std::vector<float> LogitsOf(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

std::unique_ptr<Sampler> Make(SamplingParams p, int vocab) {
  auto s = Sampler::Create(p, vocab);
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(*s);
}

TEST(Sampler, GreedyIsArgmaxWithLowestIndexOnTies) {
  SamplingParams p;
  p.temperature = 0;
  auto s = Make(p, 5);
  std::vector<float> l = {0.1f, 2.0f, -1.0f, 2.0f, 1.5f};
  EXPECT_EQ(s->Sample(l.data(), nullptr), 1);
  l[4] = 9;
  EXPECT_EQ(s->Sample(l.data(), nullptr), 4);
}

TEST(Sampler, SameSeedSameTokens) {
  std::vector<float> l(50);
  for (int i = 0; i < 50; ++i) l[i] = std::sin(i * 0.7f) * 2;
  auto run = [&](uint64_t seed) {
    SamplingParams p;
    p.seed = seed;
    auto s = Make(p, 50);
    std::vector<int> out;
    for (int i = 0; i < 64; ++i) out.push_back(s->Sample(l.data(), nullptr));
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
}

// Request migration: a sampler that records the first k tokens another one
// drew (same seed, same logits) draws what that one drew from token k on,
// through the draws where only one token was left to choose from too.
TEST(Sampler, RecordingEarlierDrawsContinuesTheSeededStream) {
  const int vocab = 50;
  std::vector<float> l(vocab);
  for (int i = 0; i < vocab; ++i) l[i] = std::sin(i * 0.7f) * 2;
  std::vector<float> one_sided(vocab, 0.0f);
  one_sided[17] = 50.0f;  // top_p keeps only this token
  SamplingParams p;
  p.seed = 42;
  p.top_p = 0.95f;
  p.frequency_penalty = 0.4f;
  auto logits_at = [&](int i) { return i % 5 == 2 ? one_sided.data() : l.data(); };
  auto whole = Make(p, vocab);
  std::vector<int32_t> drawn;
  for (int i = 0; i < 40; ++i) drawn.push_back(whole->Sample(logits_at(i), nullptr));
  for (int k : {0, 1, 13, 39}) {
    auto resumed = Make(p, vocab);
    for (int i = 0; i < k; ++i) resumed->Record(drawn[i]);
    EXPECT_EQ(resumed->draws(), static_cast<uint64_t>(k));
    for (int i = k; i < 40; ++i) {
      EXPECT_EQ(resumed->Sample(logits_at(i), nullptr), drawn[i]) << "k " << k << " token " << i;
    }
  }
}

TEST(Sampler, TopKTopPMinPRestrictTheSupport) {
  std::vector<float> l = LogitsOf({0.5, 0.3, 0.15, 0.05});
  auto support = [&](SamplingParams p) {
    p.seed = 1;
    auto s = Make(p, 4);
    std::set<int> seen;
    for (int i = 0; i < 400; ++i) seen.insert(s->Sample(l.data(), nullptr));
    std::set<int> dist;
    for (auto [t, pr] : s->Distribution(l.data())) dist.insert(t);
    EXPECT_EQ(seen, dist);
    return dist;
  };
  SamplingParams p;
  EXPECT_EQ(support(p), (std::set<int>{0, 1, 2, 3}));
  p.top_k = 2;
  EXPECT_EQ(support(p), (std::set<int>{0, 1}));
  p = {};
  p.top_p = 0.7f;
  EXPECT_EQ(support(p), (std::set<int>{0, 1}));
  p.top_p = 0.85f;
  EXPECT_EQ(support(p), (std::set<int>{0, 1, 2}));
  p = {};
  p.min_p = 0.25f;  // keeps p >= 0.125
  EXPECT_EQ(support(p), (std::set<int>{0, 1, 2}));
  p.min_p = 0.7f;
  EXPECT_EQ(support(p), (std::set<int>{0}));
}

TEST(Sampler, DistributionIsRenormalisedAndTemperatureSharpens) {
  std::vector<float> l = LogitsOf({0.5, 0.3, 0.15, 0.05});
  SamplingParams p;
  p.top_k = 2;
  auto d = Make(p, 4)->Distribution(l.data());
  ASSERT_EQ(d.size(), 2u);
  EXPECT_NEAR(d[0].second, 0.5 / 0.8, 1e-6);
  p = {};
  p.temperature = 0.5f;
  d = Make(p, 4)->Distribution(l.data());
  double z = 0.25 + 0.09 + 0.0225 + 0.0025;
  EXPECT_NEAR(d[0].second, 0.25 / z, 1e-6);
}

TEST(Sampler, PenaltiesFollowOpenAiSemantics) {
  std::vector<float> l = {1.0f, 1.0f, 1.0f};
  SamplingParams p;
  p.temperature = 0;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.3f;
  auto s = Make(p, 3);
  EXPECT_EQ(s->Sample(l.data(), nullptr), 0);  // counts: {0: 1}
  EXPECT_EQ(s->Sample(l.data(), nullptr), 1);  // 0 is penalised by 0.8
  // Now check the exact penalised distribution with temperature 1.
  SamplingParams q;
  q.frequency_penalty = 0.5f;
  q.presence_penalty = 0.3f;
  q.seed = 3;
  auto t = Make(q, 3);
  std::vector<float> peaked = {10.0f, 0.0f, 0.0f};
  ASSERT_EQ(t->Sample(peaked.data(), nullptr), 0);
  ASSERT_EQ(t->Sample(peaked.data(), nullptr), 0);  // count 2 -> penalty 2 * 0.5 + 0.3
  auto d = t->Distribution(l.data());
  double p0 = 0, p1 = 0;
  for (auto [tok, pr] : d) {
    if (tok == 0) p0 = pr;
    if (tok == 1) p1 = pr;
  }
  EXPECT_NEAR(p0 / p1, std::exp(-1.3), 1e-5);
  // Negative penalties encourage repetition.
  SamplingParams r;
  r.temperature = 0;
  r.presence_penalty = -1.0f;
  auto u = Make(r, 3);
  std::vector<float> l2 = {1.0f, 1.5f, 0.0f};
  EXPECT_EQ(u->Sample(l2.data(), nullptr), 1);
  std::vector<float> l3 = {1.9f, 1.0f, 0.0f};
  EXPECT_EQ(u->Sample(l3.data(), nullptr), 1);  // 1.0 + 1 > 1.9
}

TEST(Sampler, LogprobsAreLogSoftmaxOfTheModelLogits) {
  std::vector<float> l = {0.3f, -1.2f, 2.5f, 0.0f, 2.5f};
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = true;
  p.top_logprobs = 3;
  auto s = Make(p, 5);
  TokenLogprob lp;
  int tok = s->Sample(l.data(), &lp);
  double z = 0;
  for (float x : l) z += std::exp(double(x));
  EXPECT_EQ(tok, 2);
  EXPECT_EQ(lp.token, 2);
  EXPECT_NEAR(lp.logprob, 2.5 - std::log(z), 1e-6);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].first, 2);
  EXPECT_EQ(lp.top[1].first, 4);
  EXPECT_EQ(lp.top[2].first, 0);
  EXPECT_NEAR(lp.top[2].second, 0.3 - std::log(z), 1e-6);
}

TEST(Sampler, BadParametersAreRejectedByName) {
  auto msg = [](SamplingParams p) {
    auto s = Sampler::Create(p, 10);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(s.status().message());
  };
  SamplingParams p;
  p.temperature = -1;
  EXPECT_NE(msg(p).find("temperature"), std::string::npos);
  p = {};
  p.top_p = 0;
  EXPECT_NE(msg(p).find("top_p"), std::string::npos);
  p = {};
  p.min_p = 2;
  EXPECT_NE(msg(p).find("min_p"), std::string::npos);
  p = {};
  p.frequency_penalty = 3;
  EXPECT_NE(msg(p).find("frequency_penalty"), std::string::npos);
  p = {};
  p.logprobs = true;
  p.top_logprobs = 21;
  EXPECT_NE(msg(p).find("top_logprobs"), std::string::npos);
  p = {};
  p.stop_token_ids = std::vector<int>{10};
  EXPECT_NE(msg(p).find("stop token id 10"), std::string::npos);
  p = {};
  p.max_tokens = 0;
  EXPECT_NE(msg(p).find("max_tokens"), std::string::npos);
}

}  // namespace
}  // namespace flotilla

namespace flotilla {
namespace {

// Structured outputs: a filter's mask restricts every draw (greedy and
// sampled) to the allowed tokens, and the filter hears of each token drawn.
TEST(Sampler, FilterRestrictsDrawsToTheAllowedTokens) {
  const int vocab = 64;
  std::vector<float> logits(vocab);
  for (int t = 0; t < vocab; ++t) logits[t] = static_cast<float>(t % 7);
  for (float temperature : {0.0f, 1.5f}) {
    SamplingParams p;
    p.temperature = temperature;
    p.seed = 11;
    auto s = *Sampler::Create(p, vocab);
    std::vector<int32_t> seen;
    s->SetFilter(std::make_unique<testing_filter::FixedFilter>(vocab, std::vector<int32_t>{3, 40, 63}, &seen));
    for (int i = 0; i < 50; ++i) {
      const int32_t t = s->Sample(logits.data(), nullptr);
      EXPECT_TRUE(t == 3 || t == 40 || t == 63) << t;
      if (temperature == 0.0f) {
        EXPECT_EQ(t, 40);  // logits 3, 5, 0: the best allowed
      }
    }
    EXPECT_EQ(seen.size(), 50u);
  }
}

// The distribution holds only tokens that can be drawn: masked ones and
// ones whose probability is 0 in float are left out, so Sample's fallback
// (its last entry, for a draw past a sum rounded below 1) is never one.
TEST(Sampler, DistributionLeavesOutMaskedAndImpossibleTokens) {
  const int vocab = 64;
  std::vector<float> logits(vocab, 0.0f);
  logits[63] = 5.0f;
  logits[10] = -200.0f;  // exp(-200) is 0 in float
  SamplingParams p;
  p.temperature = 1.0f;
  auto s = *Sampler::Create(p, vocab);
  std::vector<int32_t> seen;
  s->SetFilter(
      std::make_unique<testing_filter::FixedFilter>(vocab, std::vector<int32_t>{3, 10, 40}, &seen));
  std::set<int32_t> tokens;
  double total = 0;
  for (auto [t, pr] : s->Distribution(logits.data())) {
    tokens.insert(t);
    total += pr;
  }
  EXPECT_EQ(tokens, (std::set<int32_t>{3, 40}));
  EXPECT_NEAR(total, 1.0, 1e-6);
}

// logit_bias +100 makes a token the greedy choice over any model logit.
TEST(Sampler, LogitBiasOfAHundredWinsGreedy) {
  const int vocab = 1000;
  std::vector<float> logits(vocab);
  for (int t = 0; t < vocab; ++t) logits[t] = static_cast<float>((t * 37) % 101) / 5.0f;
  SamplingParams p;
  p.temperature = 0.0f;
  p.logit_bias = {{7, 100.0f}};
  auto s = *Sampler::Create(p, vocab);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(s->Sample(logits.data(), nullptr), 7);
}

// min_tokens: the stop tokens are never drawn before that many tokens (even
// when they are by far the likeliest), then they may be; a filter allowing
// only a stop token still gets it (the constraint wins); min_tokens over
// max_tokens is refused.
TEST(Sampler, MinTokensSuppressesTheStopTokensUntilReached) {
  const int vocab = 16;
  std::vector<float> logits(vocab, 0.0f);
  logits[5] = 20.0f;  // a stop token
  logits[9] = 19.0f;  // another
  for (float temperature : {0.0f, 1.0f}) {
    SamplingParams p;
    p.temperature = temperature;
    p.seed = 3;
    p.stop_token_ids = std::vector<int>{5, 9};
    p.max_tokens = 8;
    p.min_tokens = 4;
    auto s = *Sampler::Create(p, vocab);
    for (int i = 0; i < 4; ++i) {
      const int32_t t = s->Sample(logits.data(), nullptr);
      EXPECT_NE(t, 5) << i;
      EXPECT_NE(t, 9) << i;
    }
    const int32_t after = s->Sample(logits.data(), nullptr);  // the others weigh e^-19 of it
    EXPECT_TRUE(after == 5 || after == 9) << after;
    if (temperature == 0.0f) {
      EXPECT_EQ(after, 5);
    }
  }
  SamplingParams p;
  p.temperature = 0.0f;
  p.stop_token_ids = std::vector<int>{5, 9};
  p.max_tokens = 8;
  p.min_tokens = 8;
  auto s = *Sampler::Create(p, vocab);
  std::vector<int32_t> seen;
  s->SetFilter(std::make_unique<testing_filter::FixedFilter>(vocab, std::vector<int32_t>{9}, &seen));
  EXPECT_EQ(s->Sample(logits.data(), nullptr), 9);
  p.min_tokens = 9;
  EXPECT_FALSE(Sampler::Create(p, vocab).ok());
}

}  // namespace
}  // namespace flotilla
