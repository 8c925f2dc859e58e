// GPU sampling against the CPU Sampler (worker/engine/sampler.h) over the
// gpt-oss vocabulary, V = 201088.
//
// - Greedy: the same token as the CPU Argmax, exactly (ties: lower id).
// - logprob / top_n logprobs: within 1e-4 of the CPU LogSoftmax (f32 sum of
//   201088 exponentials on the GPU against a double sum: ~1e-6 apart), top_n
//   ids exactly.
// - Filtered draws (temperature, top-k, top-p, min-p): every draw must lie in
//   the support of the CPU Sampler::Distribution with the same parameters.
// - Frequencies: with the same logits in every row and many (seed, step)
//   pairs, each token's empirical frequency must lie within 6 standard errors
//   (+0.002) of the CPU probability. The seeds are fixed, so the outcome is
//   deterministic; the bound is loose enough that a correct sampler is far
//   from it, while a wrong filter or a biased draw (e.g. off by one in the
//   top-k boundary, temperature not applied) moves some token by much more.
// - The same (seed, step) gives the same token.
// - Penalties and logit bias (LaunchAdjustLogits around a draw): greedy picks
//   the CPU sampler's token exactly, the rows are restored bit for bit, the
//   drawn token's logprob is the raw one, and seeded draws follow the CPU
//   sampler's penalised distribution.
// - Token masks (LaunchMaskLogits): masked rows equal the CPU MaskLogits bit
//   for bit, unmasked rows are untouched, greedy under a mask is the CPU
//   argmax over the allowed tokens, seeded draws land only on allowed
//   tokens, and a mask of one token always gives it.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "kernels/cuda/device.h"
#include "kernels/cuda/sampling.h"
#include "tests/kernels/cuda_test_util.h"
#include "worker/engine/sampler.h"

namespace flotilla {
namespace {

namespace cuda = kernels::cuda;
using kernels::CudaTest;
using kernels::Dev;
constexpr int kVocab = 201088;

class SamplingCudaTest : public CudaTest {};

// Logits shaped like a language model's: a few strong candidates over a broad tail.
std::vector<float> ModelLikeLogits(int rows, uint32_t seed, float spread) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> tail(0.0f, spread);
  std::uniform_int_distribution<int> pick(0, kVocab - 1);
  std::vector<float> l(static_cast<size_t>(rows) * kVocab);
  for (int r = 0; r < rows; ++r) {
    float* row = l.data() + static_cast<size_t>(r) * kVocab;
    for (int i = 0; i < kVocab; ++i) row[i] = tail(rng);
    for (int j = 0; j < 40; ++j) row[pick(rng)] += 6.0f + 0.25f * static_cast<float>(j % 9);
  }
  return l;
}

SamplingParams CpuParams(const cuda::SamplingRow& r) {
  SamplingParams p;
  p.temperature = r.temperature;
  p.top_k = r.top_k;
  p.top_p = r.top_p;
  p.min_p = r.min_p;
  p.seed = 1;
  return p;
}

std::vector<std::pair<int32_t, float>> CpuDistribution(const cuda::SamplingRow& r,
                                                       const float* logits) {
  auto s = Sampler::Create(CpuParams(r), kVocab);
  EXPECT_TRUE(s.ok());
  return (*s)->Distribution(logits);
}

struct Result {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
};

Result RunSample(const Dev<float>& logits, int rows, const std::vector<cuda::SamplingRow>& params,
           int top_n) {
  Dev<cuda::SamplingRow> d_params(params);
  Dev<int32_t> d_tokens(rows), d_top_ids(static_cast<size_t>(rows) * std::max(top_n, 1));
  Dev<float> d_logprobs(rows), d_top_lp(static_cast<size_t>(rows) * std::max(top_n, 1));
  Dev<uint8_t> ws(std::max<size_t>(cuda::SampleWorkspaceBytes(rows, kVocab), 1));
  EXPECT_EQ(cuda::LaunchSample(logits.p, rows, kVocab, d_params.p, d_tokens.p, d_logprobs.p, top_n,
                               d_top_ids.p, d_top_lp.p, ws.p, ws.n, nullptr),
            cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  Result res{d_tokens.Get(), d_logprobs.Get(), d_top_ids.Get(), d_top_lp.Get()};
  return res;
}

TEST_F(SamplingCudaTest, GreedyLogprobsAndTopNMatchCpu) {
  for (int rows : {1, 64}) {
    std::vector<float> logits = ModelLikeLogits(rows, 10 + rows, 2.0f);
    // A tie at the maximum in row 0: the lower id must win.
    {
      float* row = logits.data();
      const int32_t best = Argmax(row, kVocab);
      row[best / 2] = row[best];
      row[kVocab - 1] = row[best];
    }
    Dev<float> d_logits(logits);
    std::vector<cuda::SamplingRow> params(rows);  // temperature 0: greedy
    // 20 (the OpenAI limit) comes from the segment lists, 32 from the radix select.
    for (int top_n : {20, 32}) {
      SCOPED_TRACE(::testing::Message() << "rows=" << rows << " top_n=" << top_n);
      Result res = RunSample(d_logits, rows, params, top_n);
      std::vector<float> lp(kVocab);
      for (int r = 0; r < rows; ++r) {
        const float* row = logits.data() + static_cast<size_t>(r) * kVocab;
        LogSoftmax(row, kVocab, lp.data());
        const int32_t want = Argmax(row, kVocab);
        ASSERT_EQ(res.tokens[r], want) << "row " << r;
        EXPECT_NEAR(res.logprobs[r], lp[want], 1e-4f) << "row " << r;
        std::vector<int32_t> idx(kVocab);
        std::iota(idx.begin(), idx.end(), 0);
        std::partial_sort(idx.begin(), idx.begin() + top_n, idx.end(), [&](int32_t a, int32_t b) {
          return lp[a] > lp[b] || (lp[a] == lp[b] && a < b);
        });
        for (int j = 0; j < top_n; ++j) {
          ASSERT_EQ(res.top_ids[static_cast<size_t>(r) * top_n + j], idx[j])
              << "row " << r << " j " << j;
          EXPECT_NEAR(res.top_logprobs[static_cast<size_t>(r) * top_n + j], lp[idx[j]], 1e-4f);
        }
      }
    }
  }
}

// Parameter sets exercising each filter alone and together.
std::vector<cuda::SamplingRow> FilterConfigs() {
  std::vector<cuda::SamplingRow> c;
  auto add = [&](float t, int k, float p, float m) {
    cuda::SamplingRow r;
    r.temperature = t, r.top_k = k, r.top_p = p, r.min_p = m;
    c.push_back(r);
  };
  add(1.0f, 0, 1.0f, 0.0f);     // plain temperature
  add(0.7f, 50, 1.0f, 0.0f);    // top-k
  add(1.0f, 0, 0.9f, 0.0f);     // top-p
  add(1.0f, 0, 1.0f, 0.05f);    // min-p
  add(1.3f, 1000, 0.8f, 0.0f);  // top-k then top-p
  add(0.8f, 20, 0.95f, 0.01f);  // all three
  add(1.0f, 1, 1.0f, 0.0f);     // top-k 1 = greedy
  add(2.0f, 0, 0.5f, 0.0f);     // flat: top-p over many ids
  return c;
}

TEST_F(SamplingCudaTest, FilteredDrawsStayInsideTheCpuSupport) {
  const int rows = 64;
  std::vector<float> logits = ModelLikeLogits(rows, 77, 1.5f);
  Dev<float> d_logits(logits);
  const std::vector<cuda::SamplingRow> configs = FilterConfigs();
  std::vector<std::set<int32_t>> support(rows);
  std::vector<cuda::SamplingRow> params(rows);
  for (int r = 0; r < rows; ++r) {
    params[r] = configs[r % configs.size()];
    params[r].seed = 1000 + r;
    for (const auto& [t, p] : CpuDistribution(params[r], logits.data() + static_cast<size_t>(r) * kVocab)) {
      support[r].insert(t);
    }
  }
  std::vector<float> lp(kVocab);
  for (uint64_t step = 0; step < 40; ++step) {
    for (auto& p : params) p.step = step;
    Result res = RunSample(d_logits, rows, params, 0);
    for (int r = 0; r < rows; ++r) {
      ASSERT_TRUE(support[r].count(res.tokens[r]))
          << "row " << r << " (config " << r % configs.size() << ") drew " << res.tokens[r]
          << " outside the CPU support of " << support[r].size() << " ids";
      if (step == 0) {
        LogSoftmax(logits.data() + static_cast<size_t>(r) * kVocab, kVocab, lp.data());
        EXPECT_NEAR(res.logprobs[r], lp[res.tokens[r]], 1e-4f) << "row " << r;
      }
    }
  }
}

TEST_F(SamplingCudaTest, FrequenciesMatchTheCpuDistribution) {
  const int rows = 256, steps = 40;  // 10240 draws per configuration
  std::vector<float> one = ModelLikeLogits(1, 99, 1.0f);
  std::vector<float> logits(static_cast<size_t>(rows) * kVocab);
  for (int r = 0; r < rows; ++r) std::copy(one.begin(), one.end(), logits.begin() + static_cast<size_t>(r) * kVocab);
  Dev<float> d_logits(logits);
  const int n_configs = static_cast<int>(FilterConfigs().size());
  for (int ci = 0; ci < n_configs; ++ci) {
    const cuda::SamplingRow cfg = FilterConfigs()[ci];
    SCOPED_TRACE(::testing::Message() << "config " << ci);
    std::map<int32_t, double> want;
    for (const auto& [t, p] : CpuDistribution(cfg, one.data())) want[t] = p;
    std::map<int32_t, int> got;
    std::vector<cuda::SamplingRow> params(rows, cfg);
    for (int s = 0; s < steps; ++s) {
      for (int r = 0; r < rows; ++r) {
        params[r].seed = 5000 + r;
        params[r].step = static_cast<uint64_t>(s);
      }
      Result res = RunSample(d_logits, rows, params, 0);
      for (int32_t t : res.tokens) ++got[t];
    }
    const double n = static_cast<double>(rows) * steps;
    for (const auto& [t, c] : got) ASSERT_TRUE(want.count(t)) << "drew " << t << " outside the support";
    for (const auto& [t, p] : want) {
      const double f = (got.count(t) ? got[t] : 0) / n;
      const double se = std::sqrt(p * (1 - p) / n);
      EXPECT_NEAR(f, p, 6 * se + 0.002) << "token " << t;
    }
  }
}

TEST_F(SamplingCudaTest, SameSeedAndStepGiveTheSameToken) {
  const int rows = 64;
  std::vector<float> logits = ModelLikeLogits(rows, 5, 2.5f);
  Dev<float> d_logits(logits);
  std::vector<cuda::SamplingRow> params(rows);
  for (int r = 0; r < rows; ++r) {
    params[r] = FilterConfigs()[r % FilterConfigs().size()];
    params[r].seed = 42 + r / 2;
    params[r].step = 7;
  }
  Result a = RunSample(d_logits, rows, params, 5);
  Result b = RunSample(d_logits, rows, params, 5);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.top_ids, b.top_ids);
  // A different step draws anew: over 64 rows some token changes.
  for (auto& p : params) p.step = 8;
  Result c = RunSample(d_logits, rows, params, 0);
  EXPECT_NE(a.tokens, c.tokens);
}

// A CPU sampler that has already drawn some tokens, with every kind of
// adjustment in force, and its adjustments as device entries for `row`.
struct Penalised {
  std::unique_ptr<Sampler> sampler;
  std::vector<cuda::LogitAdjustmentEntry> entries;
};

Penalised MakePenalised(const float* logits, int row, float temperature, uint32_t seed) {
  SamplingParams p;
  p.temperature = temperature;
  p.seed = seed;
  p.frequency_penalty = 0.8f;
  p.presence_penalty = 0.5f;
  p.repetition_penalty = 1.3f;
  p.logprobs = true;
  p.top_logprobs = 5;
  std::vector<int32_t> order(kVocab);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + 8, order.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  // The favourite is penalised, the runner-up biased down, a tail id up.
  p.logit_bias = {{order[1], -3.0f}, {static_cast<int32_t>(seed % kVocab), 12.0f}};
  const std::vector<int32_t> prompt = {order[2], order[3], 17, 17};
  Penalised out;
  out.sampler = std::move(Sampler::Create(p, kVocab, prompt)).value();
  out.sampler->Record(order[0]);
  out.sampler->Record(order[0]);
  out.sampler->Record(order[4]);
  for (const LogitAdjustment& a : out.sampler->Adjustments()) {
    out.entries.push_back(cuda::LogitAdjustmentEntry{row, a.token, a.repetition, a.add});
  }
  return out;
}

TEST_F(SamplingCudaTest, PenaltiesAndBiasMatchTheCpuSampler) {
  const int rows = 16;
  std::vector<float> logits = ModelLikeLogits(rows, 31, 1.5f);
  Dev<float> d_logits(logits);
  std::vector<Penalised> cpu;
  std::vector<cuda::LogitAdjustmentEntry> entries;
  for (int r = 0; r < rows; ++r) {
    cpu.push_back(MakePenalised(logits.data() + static_cast<size_t>(r) * kVocab, r, 0.0f, 7 + r));
    entries.insert(entries.end(), cpu.back().entries.begin(), cpu.back().entries.end());
  }
  const int cap = static_cast<int>(entries.size()) + 5;  // spare capacity is never read
  Dev<cuda::LogitAdjustmentEntry> d_entries(entries);
  Dev<int32_t> d_count(std::vector<int32_t>{static_cast<int32_t>(entries.size())});
  Dev<float> d_saved(cap);
  ASSERT_EQ(cuda::LaunchAdjustLogits(d_logits.p, kVocab, d_entries.p, d_count.p, cap, d_saved.p,
                                     nullptr),
            cudaSuccess);
  Result drawn = RunSample(d_logits, rows, std::vector<cuda::SamplingRow>(rows), 0);
  ASSERT_EQ(cuda::LaunchRestoreLogits(d_logits.p, kVocab, d_entries.p, d_count.p, cap, d_saved.p,
                                      nullptr),
            cudaSuccess);
  EXPECT_EQ(d_logits.Get(), logits) << "the rows were not restored exactly";
  Result raw = RunSample(d_logits, rows, std::vector<cuda::SamplingRow>(rows), 5);
  Dev<int32_t> d_drawn(drawn.tokens), d_ref(raw.tokens);
  Dev<float> d_ref_lp(raw.logprobs), d_lp(rows);
  ASSERT_EQ(cuda::LaunchLogprobsFromReference(d_logits.p, rows, kVocab, d_drawn.p, d_ref.p,
                                              d_ref_lp.p, d_lp.p, nullptr),
            cudaSuccess);
  const std::vector<float> lp = d_lp.Get();
  for (int r = 0; r < rows; ++r) {
    TokenLogprob want;
    const int32_t token =
        cpu[r].sampler->Sample(logits.data() + static_cast<size_t>(r) * kVocab, &want);
    ASSERT_EQ(drawn.tokens[r], token) << "row " << r;
    EXPECT_NEAR(lp[r], want.logprob, 1e-4f) << "row " << r;
    for (int j = 0; j < 5; ++j) EXPECT_EQ(raw.top_ids[r * 5 + j], want.top[j].first);
  }
}

TEST_F(SamplingCudaTest, PenalisedDrawsFollowTheCpuDistribution) {
  const int rows = 256, steps = 30;
  std::vector<float> one = ModelLikeLogits(1, 123, 1.0f);
  Penalised cpu = MakePenalised(one.data(), 0, 1.0f, 3);
  std::map<int32_t, double> want;
  for (const auto& [t, p] : cpu.sampler->Distribution(one.data())) want[t] = p;
  std::vector<float> logits(static_cast<size_t>(rows) * kVocab);
  std::vector<cuda::LogitAdjustmentEntry> entries;
  for (int r = 0; r < rows; ++r) {
    std::copy(one.begin(), one.end(), logits.begin() + static_cast<size_t>(r) * kVocab);
    for (cuda::LogitAdjustmentEntry e : cpu.entries) {
      e.row = r;
      entries.push_back(e);
    }
  }
  Dev<float> d_logits(logits);
  Dev<cuda::LogitAdjustmentEntry> d_entries(entries);
  Dev<int32_t> d_count(std::vector<int32_t>{static_cast<int32_t>(entries.size())});
  Dev<float> d_saved(entries.size());
  const int cap = static_cast<int>(entries.size());
  ASSERT_EQ(cuda::LaunchAdjustLogits(d_logits.p, kVocab, d_entries.p, d_count.p, cap, d_saved.p,
                                     nullptr),
            cudaSuccess);
  std::map<int32_t, int> got;
  std::vector<cuda::SamplingRow> params(rows);
  for (int s = 0; s < steps; ++s) {
    for (int r = 0; r < rows; ++r) {
      params[r].temperature = 1.0f;
      params[r].seed = 900 + r;
      params[r].step = static_cast<uint64_t>(s);
    }
    for (int32_t t : RunSample(d_logits, rows, params, 0).tokens) ++got[t];
  }
  const double n = static_cast<double>(rows) * steps;
  for (const auto& [t, c] : got) ASSERT_TRUE(want.count(t)) << "drew " << t << " outside the support";
  for (const auto& [t, p] : want) {
    const double f = (got.count(t) ? got[t] : 0) / n;
    EXPECT_NEAR(f, p, 6 * std::sqrt(p * (1 - p) / n) + 0.002) << "token " << t;
  }
}

// A mask allowing `allowed` tokens (the CPU sampler's layout).
std::vector<uint32_t> MaskOf(const std::vector<int32_t>& allowed) {
  std::vector<uint32_t> bits((kVocab + 31) / 32, 0u);
  for (int32_t t : allowed) bits[t >> 5] |= 1u << (t & 31);
  return bits;
}

TEST_F(SamplingCudaTest, TokenMasksMatchTheCpuReference) {
  const int rows = 6;
  std::vector<float> logits = ModelLikeLogits(rows, 41, 1.5f);
  // Rows 1, 3, 4 masked: a random tenth of the vocabulary, one token, and
  // every token but the row's argmax.
  std::mt19937 rng(5);
  std::vector<int32_t> tenth;
  for (int t = 0; t < kVocab; ++t) {
    if (rng() % 10 == 0) tenth.push_back(t);
  }
  const float* row4 = logits.data() + 4 * static_cast<size_t>(kVocab);
  const int32_t argmax4 = static_cast<int32_t>(std::max_element(row4, row4 + kVocab) - row4);
  std::vector<uint32_t> all_but = MaskOf({});
  for (uint32_t& w : all_but) w = ~0u;
  all_but[argmax4 >> 5] &= ~(1u << (argmax4 & 31));
  const std::vector<int32_t> masked_rows = {1, 3, 4};
  const std::vector<std::vector<uint32_t>> masks = {MaskOf(tenth), MaskOf({123457}), all_but};
  std::vector<uint32_t> packed;
  for (const auto& m : masks) packed.insert(packed.end(), m.begin(), m.end());
  const int cap = 8;  // spare capacity is never read
  packed.resize(static_cast<size_t>(cap) * masks[0].size(), 0u);
  std::vector<int32_t> row_ids = masked_rows;
  row_ids.resize(cap, 0);

  std::vector<float> expected = logits;
  for (size_t m = 0; m < masked_rows.size(); ++m) {
    MaskLogits(masks[m].data(), kVocab, expected.data() + masked_rows[m] * static_cast<size_t>(kVocab));
  }
  Dev<float> d_logits(logits);
  Dev<uint32_t> d_masks(packed);
  Dev<int32_t> d_rows(row_ids), d_count(std::vector<int32_t>{3});
  ASSERT_EQ(cuda::LaunchMaskLogits(d_logits.p, kVocab, d_rows.p, d_masks.p, d_count.p, cap, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(d_logits.Get(), expected) << "masked rows differ from MaskLogits, or others changed";

  // Greedy: the argmax over the allowed tokens.
  Result greedy = RunSample(d_logits, rows, std::vector<cuda::SamplingRow>(rows), 0);
  for (int r = 0; r < rows; ++r) {
    const float* row = expected.data() + static_cast<size_t>(r) * kVocab;
    EXPECT_EQ(greedy.tokens[r], std::max_element(row, row + kVocab) - row) << "row " << r;
  }
  EXPECT_EQ(greedy.tokens[3], 123457);
  EXPECT_NE(greedy.tokens[4], argmax4);
  // Seeded draws at temperature 1 only ever land on allowed tokens.
  for (uint64_t step = 0; step < 32; ++step) {
    std::vector<cuda::SamplingRow> params(rows);
    for (auto& p : params) p.temperature = 1.0f, p.seed = 9, p.step = step;
    Result drawn = RunSample(d_logits, rows, params, 0);
    for (size_t m = 0; m < masked_rows.size(); ++m) {
      const int32_t t = drawn.tokens[masked_rows[m]];
      EXPECT_TRUE((masks[m][t >> 5] >> (t & 31)) & 1u) << "row " << masked_rows[m] << " drew " << t;
    }
    EXPECT_EQ(drawn.tokens[3], 123457);
  }
}

// The masks the host writes while the step runs: the kernel is launched
// first, the host then fills pinned masks and publishes the step's number;
// the masked rows equal LaunchMaskLogits's. A second launch numbered 2 waits
// for the new number (the stale 1 does not pass). A number that never comes
// raises the late flag within the bound and masks nothing.
TEST_F(SamplingCudaTest, TokenMasksWrittenAfterTheLaunchAreWaitedFor) {
  const int rows = 4, cap = 4;
  const int words = (kVocab + 31) / 32;
  std::vector<float> logits = ModelLikeLogits(rows, 43, 1.5f);
  std::vector<uint32_t> mask = MaskOf({7, 99, 123457});
  std::vector<float> expected = logits;
  MaskLogits(mask.data(), kVocab, expected.data() + 2 * static_cast<size_t>(kVocab));

  uint32_t* host_masks = nullptr;
  int32_t* ready = nullptr;
  ASSERT_EQ(cudaMallocHost(&host_masks, static_cast<size_t>(cap) * words * sizeof(uint32_t)),
            cudaSuccess);
  ASSERT_EQ(cudaMallocHost(&ready, sizeof(int32_t)), cudaSuccess);
  *ready = 0;
  Dev<int32_t> d_late(1);
  for (int32_t step : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    std::fill(host_masks, host_masks + static_cast<size_t>(cap) * words, 0u);
    Dev<float> d_logits(logits);
    Dev<int32_t> d_rows(std::vector<int32_t>{2, 0, 0, 0, /*count*/ 1, /*step*/ step});
    ASSERT_EQ(cuda::LaunchMaskLogitsWhenReady(d_logits.p, kVocab, d_rows.p, host_masks, cap, ready,
                                              30ull * 1000 * 1000 * 1000, d_late.p, nullptr),
              cudaSuccess);
    std::copy(mask.begin(), mask.end(), host_masks);
    std::atomic_ref<int32_t>(*ready).store(step, std::memory_order_release);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(d_logits.Get(), expected);
    EXPECT_EQ(d_late.Get(), std::vector<int32_t>{0});
  }
  Dev<float> d_logits(logits);
  Dev<int32_t> d_rows(std::vector<int32_t>{2, 0, 0, 0, 1, 3});
  ASSERT_EQ(cuda::LaunchMaskLogitsWhenReady(d_logits.p, kVocab, d_rows.p, host_masks, cap, ready,
                                            1000 * 1000, d_late.p, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(d_late.Get(), std::vector<int32_t>{1});
  EXPECT_EQ(d_logits.Get(), logits) << "nothing is masked when the masks never came";
  cudaFreeHost(host_masks);
  cudaFreeHost(ready);
}

// Several rows' masks written after the launch, one of them dense and
// irregular: each row equals LaunchMaskLogits's (each block of the kernel
// stages its own slice of a row's words, so every slice boundary is hit).
TEST_F(SamplingCudaTest, SeveralTokenMasksWrittenAfterTheLaunchMatchTheReference) {
  const int rows = 5, cap = 8;
  const int words = (kVocab + 31) / 32;
  std::vector<float> logits = ModelLikeLogits(rows, 47, 1.5f);
  std::mt19937 rng(11);
  std::vector<int32_t> half, last_tokens;
  for (int t = 0; t < kVocab; ++t) {
    if (rng() % 2 == 0) half.push_back(t);
  }
  for (int t = kVocab - 40; t < kVocab; ++t) last_tokens.push_back(t);
  const std::vector<int32_t> masked_rows = {4, 0, 2};
  const std::vector<std::vector<uint32_t>> masks = {MaskOf(half), MaskOf(last_tokens),
                                                    MaskOf({0, 31, 32, 8191, 8192, 123457})};
  std::vector<float> expected = logits;
  for (size_t m = 0; m < masked_rows.size(); ++m) {
    MaskLogits(masks[m].data(), kVocab,
               expected.data() + masked_rows[m] * static_cast<size_t>(kVocab));
  }
  uint32_t* host_masks = nullptr;
  int32_t* ready = nullptr;
  ASSERT_EQ(cudaMallocHost(&host_masks, static_cast<size_t>(cap) * words * sizeof(uint32_t)),
            cudaSuccess);
  ASSERT_EQ(cudaMallocHost(&ready, sizeof(int32_t)), cudaSuccess);
  *ready = 0;
  std::fill(host_masks, host_masks + static_cast<size_t>(cap) * words, 0u);
  Dev<int32_t> d_late(1);
  Dev<float> d_logits(logits);
  std::vector<int32_t> row_ids = masked_rows;
  row_ids.resize(cap, 0);
  row_ids.push_back(static_cast<int32_t>(masked_rows.size()));  // count
  row_ids.push_back(1);                                         // the step's number
  Dev<int32_t> d_rows(row_ids);
  ASSERT_EQ(cuda::LaunchMaskLogitsWhenReady(d_logits.p, kVocab, d_rows.p, host_masks, cap, ready,
                                            30ull * 1000 * 1000 * 1000, d_late.p, nullptr),
            cudaSuccess);
  for (size_t m = 0; m < masks.size(); ++m) {
    std::copy(masks[m].begin(), masks[m].end(), host_masks + m * words);
  }
  std::atomic_ref<int32_t>(*ready).store(1, std::memory_order_release);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(d_late.Get(), std::vector<int32_t>{0});
  EXPECT_EQ(d_logits.Get(), expected) << "masked rows differ from MaskLogits, or others changed";
  cudaFreeHost(host_masks);
  cudaFreeHost(ready);
}

}  // namespace
}  // namespace flotilla
