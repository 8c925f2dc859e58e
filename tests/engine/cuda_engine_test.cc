// The CUDA engine against the CPU engine (the reference, which matches the
// transformers goldens under tests/data/golden within 1e-4): on the golden
// checkpoints (every prompt logit in one shot and in chunks, batched greedy
// decoding through host logits and through GPU sampling with graph-captured
// decode, decoding through the cache) and on a two-layer model of real
// gpt-oss-120b layer shapes (H = I = 2880, 64 q / 8 kv heads of 64, E = 128,
// K = 4, the real vocabulary: the fast attention and tensor-core paths).
//
// Tolerance: the GPU feeds every matmul bf16 activations (f32 accumulation,
// f32 residual stream, bf16 KV cache) while the reference stays in f32, so
// each layer adds a relative error of a few bf16 ulps (2^-8). Logits are
// compared with |gpu - ref| <= 0.03 * max(1, max |ref|).
//
// Routing is discrete: where two router logits nearly tie (the test models'
// random routers often tie within 1e-3), that noise can send a token to the
// other expert, after which the outputs legitimately differ. So the GPU
// records the experts it chose and the reference follows them
// (CpuEngine::ForceNextRouting) and reports its "regret": how much lower, by
// its own f32 router logits, the GPU's choice was than its own K-th best.
// Every position is compared; the regret must stay within the bf16 noise
// (kMaxRegret: measured up to 1e-2), so a routing bug (wrong expert, wrong order, swapped ids)
// cannot hide behind the forcing. Greedy tokens must agree wherever the
// reference's top-2 logits are further apart than the logit tolerance.
#include "worker/engine/cuda_engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cuda/device.h"
#include "tests/engine/chunked_prefill.h"
#include "tests/engine/golden_fixtures.h"
#include "tests/engine/logit_diff.h"
#include "tests/engine/multi_turn.h"
#include "tests/engine/small_cuda_options.h"
#include "worker/engine/cpu_engine.h"
#include "worker/engine/sampler.h"
#include "worker/model/checkpoint.h"
#include "worker/model/load_weights.h"
#include "worker/model/synthetic_weights.h"

namespace flotilla {
namespace {

namespace fs = std::filesystem;
using testing_golden::Fixtures;
using testing_golden::GoldenDir;
using testing_golden::ReadF32;
constexpr double kRelTolerance = 0.03;

using testing_golden::RelDiff;

using testing_util::HaveGpu;

CudaEngineOptions SmallOptions() { return testing_util::SmallCudaOptions(256, 2048, 1024, 16); }

// An engine of the tiny preset on the synthetic weights of `seed`; null (with
// a failure saying why) when it cannot be made.
std::unique_ptr<CudaEngine> TinyEngine(uint64_t seed) {
  absl::StatusOr<ModelWeights> w = MakeSyntheticWeights(ModelConfig::Tiny(), seed);
  EXPECT_TRUE(w.ok()) << w.status();
  if (!w.ok()) return nullptr;
  absl::StatusOr<std::unique_ptr<CudaEngine>> e = CudaEngine::Create(*w, SmallOptions());
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

// The GPU's residual stream carries ~1% relative noise after a few layers
// (logits differ by up to 2.4e-2 on the fixtures with routing followed), so
// its router logits may mis-order experts that close; a routing bug (another
// expert, order or id) costs the typical spread of router logits, 0.1 to 1.
constexpr float kMaxRegret = 2e-2f;

CudaEngineOptions RecordingOptions() {
  CudaEngineOptions o = SmallOptions();
  o.record_routing = true;
  return o;
}

// Whether the reference's top-2 logits in `row` are further apart than the
// tolerance (so any engine within tolerance must pick the same argmax).
bool Decisive(const float* row, int64_t V) {
  std::vector<float> r(row, row + V);
  std::nth_element(r.begin(), r.begin() + 1, r.end(), std::greater<float>());
  return r[0] - r[1] > 2 * kRelTolerance * std::max(1.0f, std::abs(r[0]));
}

class CudaGolden : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device present";
    dir_ = fs::path(GoldenDir()) / GetParam();
    absl::StatusOr<testing_golden::LoadedFixture> fixture = testing_golden::LoadFixture(GetParam());
    ASSERT_TRUE(fixture.ok()) << fixture.status();
    golden_ = std::move(fixture->golden);
    std::optional<ModelWeights> w = std::move(fixture->weights);
    auto e = CudaEngine::Create(*w, RecordingOptions());
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
    CpuEngineOptions o;
    o.kv_num_blocks = CpuEngine::KvBlocksFor(w->config, w->config.num_key_value_heads, 16, 4, 256);
    auto c = CpuEngine::Create(std::move(*w), o, &pool_);
    ASSERT_TRUE(c.ok()) << c.status();
    cpu_ = std::move(*c);
  }

  std::vector<int32_t> Prompt(size_t i) { return golden_["prompts"][i].get<std::vector<int32_t>>(); }

  // The reference over `tokens` in one step, following `routing`.
  StepOutput Reference(const std::vector<int32_t>& tokens, std::vector<int32_t> routing) {
    const int64_t s = cpu_->NewSequence();
    cpu_->ForceNextRouting({std::move(routing)});
    auto out = cpu_->Step({StepItem{s, tokens, LogitsMode::kAll}});
    EXPECT_TRUE(out.ok()) << out.status();
    EXPECT_TRUE(cpu_->FreeSequence(s).ok());
    return out.ok() ? *std::move(out) : StepOutput{};
  }

  kernels::cpu::ThreadPool pool_{4};
  fs::path dir_;
  nlohmann::json golden_;
  std::unique_ptr<CudaEngine> engine_;
  std::unique_ptr<CpuEngine> cpu_;
};

TEST_P(CudaGolden, PromptLogitsMatchTheReference) {
  for (size_t i = 0; i < golden_["prompts"].size(); ++i) {
    SCOPED_TRACE("prompt " + std::to_string(i));
    std::vector<int32_t> prompt = Prompt(i);
    std::vector<float> golden = ReadF32(dir_ / golden_["logits_files"][i].get<std::string>());
    for (size_t chunk : {prompt.size(), size_t{5}}) {
      int64_t s = engine_->NewSequence();
      auto got = testing_util::PrefillInChunks(*engine_, s, prompt, chunk);
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_TRUE(engine_->FreeSequence(s).ok());
      StepOutput ref = Reference(prompt, got->routing);
      ASSERT_EQ(ref.logits.size(), 1u);
      const double rel = RelDiff(got->logits, ref.logits[0]);
      EXPECT_LE(rel, kRelTolerance) << "chunk " << chunk;
      EXPECT_LE(ref.routing_regret[0], kMaxRegret) << "chunk " << chunk;
      std::cout << GetParam() << " prompt " << i << " chunk " << chunk << ": rel diff " << rel
                << ", routing regret " << ref.routing_regret[0]
                << " (vs transformers without following the routing: "
                << RelDiff(got->logits, golden) << ")\n";
    }
  }
}

// Batched greedy decoding: the GPU's argmax agrees with the reference's
// wherever the reference is decisive, and GPU sampling (graph replay) gives
// exactly the tokens of the host argmax.
TEST_P(CudaGolden, GreedyDecodingMatchesTheReference) {
  const int64_t V = golden_["vocab_size"];
  const size_t n = golden_["prompts"].size();
  std::vector<std::vector<int32_t>> host_tokens(n), seen(n), routing(n);
  for (bool gpu_sampling : {false, true}) {
    SCOPED_TRACE(gpu_sampling ? "gpu sampling" : "host argmax");
    std::vector<int64_t> seqs;
    std::vector<StepItem> items;
    for (size_t i = 0; i < n; ++i) {
      seqs.push_back(engine_->NewSequence());
      items.push_back(StepItem{seqs[i], Prompt(i), LogitsMode::kLast});
      if (!gpu_sampling) seen[i] = Prompt(i);
    }
    for (int step = 0; step < 24; ++step) {
      std::vector<int32_t> next(n);
      if (gpu_sampling) {
        std::vector<kernels::cuda::SamplingRow> rows(n);
        auto out = engine_->StepAndSample(items, rows);
        ASSERT_TRUE(out.ok()) << out.status();
        for (size_t i = 0; i < n; ++i) next[i] = (*out)[i].token;
      } else {
        auto out = engine_->Step(items);
        ASSERT_TRUE(out.ok()) << out.status();
        for (size_t i = 0; i < n; ++i) {
          next[i] = Argmax(out->logits[i].data(), V);
          routing[i].insert(routing[i].end(), out->routing[i].begin(), out->routing[i].end());
        }
      }
      for (size_t i = 0; i < n; ++i) {
        if (gpu_sampling) {
          EXPECT_EQ(next[i], host_tokens[i][step]) << "prompt " << i << " step " << step;
        } else {
          host_tokens[i].push_back(next[i]);
        }
        items[i].tokens = {next[i]};
      }
    }
    for (int64_t s : seqs) ASSERT_TRUE(engine_->FreeSequence(s).ok());
  }
  // The reference over each prompt and the GPU's continuation (all but the
  // last token were fed back), following the GPU's routing.
  size_t decisive = 0, total = 0, golden_equal = 0;
  for (size_t i = 0; i < n; ++i) {
    std::vector<int32_t> seq = seen[i];
    const size_t prompt_len = seq.size();
    seq.insert(seq.end(), host_tokens[i].begin(), host_tokens[i].end() - 1);
    // Routing of the prompt (one chunk) then of each fed-back token.
    StepOutput ref = Reference(seq, routing[i]);
    ASSERT_EQ(ref.logits.size(), 1u);
    EXPECT_LE(ref.routing_regret[0], kMaxRegret) << "prompt " << i;
    const std::vector<int32_t> want = golden_["greedy"][i].get<std::vector<int32_t>>();
    for (size_t step = 0; step < host_tokens[i].size(); ++step) {
      const float* row = ref.logits[0].data() + (prompt_len - 1 + step) * V;
      ++total;
      if (host_tokens[i][step] == want[step]) ++golden_equal;
      if (!Decisive(row, V)) continue;
      ++decisive;
      EXPECT_EQ(host_tokens[i][step], Argmax(row, V)) << "prompt " << i << " step " << step;
    }
  }
  std::cout << GetParam() << ": " << decisive << " of " << total
            << " greedy steps decisive and compared; " << golden_equal
            << " equal to the transformers greedy tokens\n";
  EXPECT_GE(decisive * 2, total) << "too few decisive steps";
}

TEST_P(CudaGolden, DecodingThroughTheCacheMatchesTheReference) {
  if (!golden_.contains("full_sequence")) GTEST_SKIP() << "fixture has no full_sequence";
  const auto& fs_json = golden_["full_sequence"];
  std::vector<int32_t> tokens = fs_json["tokens"].get<std::vector<int32_t>>();
  const size_t prompt_len = Prompt(fs_json["prompt_index"].get<size_t>()).size();
  int64_t s = engine_->NewSequence();
  auto first = engine_->Step({StepItem{s, {tokens.begin(), tokens.begin() + prompt_len}, LogitsMode::kAll}});
  ASSERT_TRUE(first.ok()) << first.status();
  std::vector<float> got = first->logits[0];
  std::vector<int32_t> routing = first->routing[0];
  for (size_t i = prompt_len; i < tokens.size(); ++i) {
    auto out = engine_->Step({StepItem{s, {tokens[i]}, LogitsMode::kLast}});
    ASSERT_TRUE(out.ok()) << out.status();
    got.insert(got.end(), out->logits[0].begin(), out->logits[0].end());
    routing.insert(routing.end(), out->routing[0].begin(), out->routing[0].end());
  }
  // The full-attention layers hold every block of the sequence, the
  // sliding-window layers only those of the next query's window.
  const int64_t bs = 16, length = static_cast<int64_t>(tokens.size());
  const int64_t window = engine_->config().sliding_window;
  const int64_t keep_begin = std::max<int64_t>(0, length - (window - 1));
  EXPECT_EQ(engine_->KvBlocksHeld(s, 0), (length + bs - 1) / bs);
  EXPECT_EQ(engine_->KvBlocksHeld(s, 1), (length + bs - 1) / bs - keep_begin / bs);
  EXPECT_LT(engine_->KvBlocksHeld(s, 1), engine_->KvBlocksHeld(s, 0));
  ASSERT_TRUE(engine_->FreeSequence(s).ok());
  StepOutput ref = Reference(tokens, routing);
  ASSERT_EQ(ref.logits.size(), 1u);
  const double rel = RelDiff(got, ref.logits[0]);
  EXPECT_LE(rel, kRelTolerance);
  EXPECT_LE(ref.routing_regret[0], kMaxRegret);
  std::cout << GetParam() << " decode through the cache: rel diff " << rel << ", routing regret "
            << ref.routing_regret[0] << "\n";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaGolden, ::testing::ValuesIn(Fixtures()),
                         [](const auto& info) { return info.param; });

TEST(CudaEngineErrors, BadStepsAreRefusedAndChangeNothing) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device present";
  const ModelConfig c = ModelConfig::Tiny();
  std::unique_ptr<CudaEngine> e = TinyEngine(3);
  ASSERT_NE(e, nullptr);
  CudaEngine& engine = *e;
  const int64_t s = engine.NewSequence();
  auto bad_token = engine.Step({StepItem{s, {1, c.vocab_size}, LogitsMode::kLast}});
  EXPECT_EQ(bad_token.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_token.status().message().find("out of range"), std::string::npos);
  EXPECT_EQ(engine.Step({StepItem{s + 100, {1}, LogitsMode::kLast}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine.Step({StepItem{s, {}, LogitsMode::kLast}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> too_many(2000, 1);
  EXPECT_EQ(engine.Step({StepItem{s, too_many, LogitsMode::kLast}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*engine.SequenceLength(s), 0);
  auto ok = engine.Step({StepItem{s, {1, 2, 3}, LogitsMode::kLast}});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*engine.SequenceLength(s), 3);
  const int64_t before = engine.free_kv_blocks();
  ASSERT_TRUE(engine.FreeSequence(s).ok());
  EXPECT_GT(engine.free_kv_blocks(), before);
  EXPECT_EQ(engine.FreeSequence(s).code(), absl::StatusCode::kInvalidArgument);
}

// Two layers of the real 120b shapes: GPU engine vs CPU engine on the same
// synthetic weights, prefill of a mixed batch then graph-captured decode, the
// reference following the GPU's routing and fed the same tokens.
// Both engines with the KV cache `dtype`: with fp8 they round the
// full-attention layer's K and V by the same rule (kernels/cpu/kv_fp8.h), so
// they differ only by the GPU's bf16 arithmetic, as with bf16 KV.
void ExpectRealShapesMatchTheCpuEngine(KvCacheDtype dtype) {
  ModelConfig c = ModelConfig::Gptoss120b();
  c.num_hidden_layers = 2;
  c.layer_types.resize(2);  // one sliding-window layer, one full-attention layer
  auto w = MakeSyntheticWeights(c, 11);
  ASSERT_TRUE(w.ok()) << w.status();
  CudaEngineOptions options = RecordingOptions();
  options.kv_cache_dtype = dtype;
  auto g = CudaEngine::Create(*w, options);
  ASSERT_TRUE(g.ok()) << g.status();
  kernels::cpu::ThreadPool pool(8);
  CpuEngineOptions co;
  co.kv_num_blocks = CpuEngine::KvBlocksFor(c, c.num_key_value_heads, 16, 3, 400);
  co.kv_cache_dtype = dtype;
  auto cpu = CpuEngine::Create(*std::move(w), co, &pool);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  const int64_t V = c.vocab_size;
  // Three sequences: prompts of 1, 37 and 300 tokens (the last over the
  // sliding window and over 16 tokens: tensor-core linears).
  std::vector<std::vector<int32_t>> prompts(3);
  const int lens[3] = {1, 37, 300};
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < lens[i]; ++j) prompts[i].push_back((j * 7919 + i * 104729) % 200000);
  }
  std::vector<StepItem> gi, ci;
  for (int i = 0; i < 3; ++i) {
    gi.push_back(StepItem{(*g)->NewSequence(), prompts[i], LogitsMode::kLast});
    ci.push_back(StepItem{(*cpu)->NewSequence(), prompts[i], LogitsMode::kLast});
  }
  for (int step = 0; step < 8; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    auto go = (*g)->Step(gi);
    ASSERT_TRUE(go.ok()) << go.status();
    (*cpu)->ForceNextRouting(go->routing);
    auto co2 = (*cpu)->Step(ci);
    ASSERT_TRUE(co2.ok()) << co2.status();
    for (int i = 0; i < 3; ++i) {
      const double rel = RelDiff(go->logits[i], co2->logits[i]);
      EXPECT_LE(rel, kRelTolerance) << "sequence " << i;
      EXPECT_LE(co2->routing_regret[i], kMaxRegret) << "sequence " << i;
      if (step == 0 || step == 7) {
        std::cout << "real shapes (" << KvCacheDtypeName(dtype) << " KV) step " << step << " seq "
                  << i << ": rel diff " << rel << ", routing regret " << co2->routing_regret[i]
                  << "\n";
      }
      const int32_t next = Argmax(co2->logits[i].data(), V);
      if (Decisive(co2->logits[i].data(), V)) {
        EXPECT_EQ(Argmax(go->logits[i].data(), V), next) << "sequence " << i;
      }
      gi[i].tokens = {next};
      ci[i].tokens = {next};
    }
  }
}

TEST(CudaEngineRealShapes, MatchesTheCpuEngine) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device present";
  ExpectRealShapesMatchTheCpuEngine(KvCacheDtype::kBf16);
}

TEST(CudaEngineRealShapes, MatchesTheCpuEngineWithFp8Kv) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device present";
  ExpectRealShapesMatchTheCpuEngine(KvCacheDtype::kFp8);
}

// Deterministic numerics: the same prompts (1, 37, 300 and 700 tokens: the
// GEMV, cuBLASLt and grouped-GEMM MoE paths) and then graph-replayed decode
// steps, run twice on fresh sequences of one engine, give the same logits
// bit for bit at every step. Without the option a token's expert outputs
// are summed with float atomics in finishing order, and these runs can differ.
TEST(CudaEngineRealShapes, DeterministicStepsRepeatBitForBit) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device present";
  ModelConfig c = ModelConfig::Gptoss120b();
  c.num_hidden_layers = 2;
  c.layer_types.resize(2);
  auto w = MakeSyntheticWeights(c, 12);
  ASSERT_TRUE(w.ok()) << w.status();
  CudaEngineOptions options = testing_util::SmallCudaOptions(256, 2048, 1100, 16);
  options.deterministic = true;
  options.prefix_cache = false;  // the second run computes everything again
  auto g = CudaEngine::Create(*w, options);
  ASSERT_TRUE(g.ok()) << g.status();
  const int lens[4] = {1, 37, 300, 700};
  std::vector<std::vector<std::vector<float>>> runs(2);  // [run][step * 4 + seq]
  for (int run = 0; run < 2; ++run) {
    std::vector<StepItem> items;
    for (int i = 0; i < 4; ++i) {
      std::vector<int32_t> prompt;
      for (int j = 0; j < lens[i]; ++j) prompt.push_back((j * 7919 + i * 104729) % 200000);
      items.push_back(StepItem{(*g)->NewSequence(), prompt, LogitsMode::kLast});
    }
    for (int step = 0; step < 6; ++step) {
      auto out = (*g)->Step(items);
      ASSERT_TRUE(out.ok()) << out.status();
      for (int i = 0; i < 4; ++i) {
        runs[run].push_back(out->logits[i]);
        items[i].tokens = {Argmax(out->logits[i].data(), c.vocab_size)};
      }
    }
    for (const StepItem& it : items) ASSERT_TRUE((*g)->FreeSequence(it.sequence).ok());
  }
  ASSERT_EQ(runs[0].size(), runs[1].size());
  for (size_t i = 0; i < runs[0].size(); ++i) {
    EXPECT_TRUE(runs[0][i] == runs[1][i]) << "step " << i / 4 << " sequence " << i % 4;
  }
}

// Prefix caching on the GPU: each turn repeats the previous turn's prompt
// plus 64 new tokens (past the sliding window); with the cache a turn
// computes only what is new, and its logits and greedy tokens are those of
// the engine without the cache (tokens wherever the logits are decisive:
// the shorter prefill runs other kernel shapes, so bf16 rounding differs).
TEST(CudaEnginePrefixCache, MultiTurnGreedyTokensMatchWithoutTheCache) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device present";
  ModelConfig c = ModelConfig::Tiny();
  c.sliding_window = 32;
  auto w = MakeSyntheticWeights(c, 5);
  ASSERT_TRUE(w.ok()) << w.status();
  CudaEngineOptions on = SmallOptions(), off = SmallOptions();
  off.prefix_cache = false;
  auto with = CudaEngine::Create(*w, on);
  auto without = CudaEngine::Create(*w, off);
  ASSERT_TRUE(with.ok()) << with.status();
  ASSERT_TRUE(without.ok()) << without.status();
  testing::MultiTurnOptions o;
  o.turns = 5;
  o.first_prompt = 100;
  o.keep_answers = false;
  o.generate = 8;
  o.prefill_chunk = 96;
  const auto cached = testing::RunTurns(**with, o);
  const auto plain = testing::RunTurns(**without, o);
  ASSERT_EQ(cached.size(), plain.size());
  const int64_t V = c.vocab_size;
  for (size_t t = 0; t < cached.size(); ++t) {
    SCOPED_TRACE("turn " + std::to_string(t));
    EXPECT_EQ(plain[t].cached, 0);
    const int64_t want = t == 0 ? 0 : static_cast<int64_t>(cached[t - 1].prompt.size()) / 16 * 16;
    EXPECT_EQ(cached[t].cached, want);
    EXPECT_EQ(cached[t].computed, plain[t].computed - cached[t].cached);
    EXPECT_LE(RelDiff(cached[t].first_logits, plain[t].first_logits), 1e-2);
    ASSERT_EQ(cached[t].tokens.size(), plain[t].tokens.size());
    for (size_t i = 0; i < plain[t].tokens.size(); ++i) {
      if (cached[t].tokens[i] == plain[t].tokens[i]) continue;
      EXPECT_FALSE(Decisive(plain[t].logits[i].data(), V)) << "token " << i;
      break;  // the two now decode different tokens
    }
  }
  EXPECT_EQ((*with)->KvFreeBlocks(), (*with)->KvTotalBlocks());
}

}  // namespace
}  // namespace flotilla

namespace flotilla {
namespace {

// The serving step: items carry their request's Sampler and the engine draws
// on the GPU. Same engine, same steps, same logits: the device draws must be
// the host sampler's draws over the returned logits (greedy, with every
// penalty and a logit bias in force), with the raw logprobs and top logprobs.
SamplingParams PenalisedGreedy(int32_t biased_token) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.seed = 5;
  p.frequency_penalty = 0.7f;
  p.presence_penalty = 0.3f;
  p.repetition_penalty = 1.2f;
  p.logit_bias = {{biased_token, 4.0f}};
  p.logprobs = true;
  p.top_logprobs = 3;
  p.max_tokens = 1000;
  return p;
}

TEST(CudaEngineSampling, DeviceDrawsEqualHostDrawsOfTheSameLogits) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device present";
  const ModelConfig c = ModelConfig::Tiny();
  std::unique_ptr<CudaEngine> e = TinyEngine(11);
  ASSERT_NE(e, nullptr);
  CudaEngine& engine = *e;
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4, 5}, {9, 9, 8, 7}, {40, 41}};
  const int n = static_cast<int>(prompts.size());
  std::vector<std::vector<int32_t>> device_tokens(n);
  std::vector<std::vector<float>> device_logprobs(n);
  for (bool device : {true, false}) {
    SCOPED_TRACE(device ? "device" : "host");
    std::vector<std::unique_ptr<Sampler>> samplers;
    std::vector<int64_t> seqs;
    std::vector<StepItem> items;
    for (int i = 0; i < n; ++i) {
      samplers.push_back(*Sampler::Create(PenalisedGreedy(100 + i), c.vocab_size, prompts[i]));
      seqs.push_back(engine.NewSequence());
      items.push_back(StepItem{seqs[i], prompts[i], LogitsMode::kNone, samplers[i].get()});
    }
    for (int step = 0; step < 12; ++step) {
      if (!device) {
        for (StepItem& it : items) {
          it.logits = LogitsMode::kLast;
          it.sampler = nullptr;
        }
      }
      auto out = engine.Step(items);
      ASSERT_TRUE(out.ok()) << out.status();
      for (int i = 0; i < n; ++i) {
        TokenLogprob drawn;
        if (device) {
          drawn = out->sampled[i];
          EXPECT_TRUE(out->logits[i].empty());
          ASSERT_EQ(drawn.top.size(), 3u);
          device_tokens[i].push_back(drawn.token);
          device_logprobs[i].push_back(drawn.logprob);
        } else {
          drawn.token = samplers[i]->Sample(out->logits[i].data(), &drawn);
          ASSERT_EQ(drawn.token, device_tokens[i][step]) << "item " << i << " step " << step;
          EXPECT_NEAR(drawn.logprob, device_logprobs[i][step], 1e-4f);
        }
        items[i].tokens = {drawn.token};
      }
    }
    for (int64_t s : seqs) ASSERT_TRUE(engine.FreeSequence(s).ok());
  }
}

TEST(CudaEngineSampling, PromptLogitsBesideADrawFallBackToTheHostSampler) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device present";
  const ModelConfig c = ModelConfig::Tiny();
  std::unique_ptr<CudaEngine> e = TinyEngine(12);
  ASSERT_NE(e, nullptr);
  CudaEngine& engine = *e;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  auto sampler = *Sampler::Create(greedy, c.vocab_size);
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9};
  const int64_t a = engine.NewSequence(), b = engine.NewSequence();
  auto out = engine.Step({StepItem{a, prompt, LogitsMode::kAll, sampler.get()},
                          StepItem{b, prompt, LogitsMode::kNone, nullptr}});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->logits[0].size(), prompt.size() * c.vocab_size);
  EXPECT_TRUE(out->logits[1].empty());
  const float* last = out->logits[0].data() + (prompt.size() - 1) * c.vocab_size;
  EXPECT_EQ(out->sampled[0].token, Argmax(last, c.vocab_size));
  EXPECT_EQ(out->sampled[1].token, -1);
  EXPECT_EQ(sampler->draws(), 1u);
}

}  // namespace
}  // namespace flotilla
