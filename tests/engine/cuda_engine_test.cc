// The CUDA engine against the references: the CPU engine (which matches the
// transformers goldens under tests/data/golden within 1e-4) on the golden
// checkpoints (every prompt logit, greedy continuations through host argmax
// and GPU sampling with graph-captured decode, decoding through the cache),
// and on a two-layer model of real gpt-oss-120b layer shapes (H = I = 2880,
// 64 q / 8 kv heads of 64, E = 128, K = 4, the real vocabulary), which runs
// the fast head_dim-64 attention and the tensor-core linear path.
//
// Tolerance: the GPU feeds every matmul bf16 activations (f32 accumulation,
// f32 residual stream, bf16 KV cache) while the reference stays in f32, so
// each layer adds a relative error of a few bf16 ulps (2^-8). Logits are
// compared with |gpu - ref| <= 0.03 * max(1, max |ref|) per position.
//
// Routing is discrete: where the reference's K-th and (K+1)-th router logits
// are closer than that noise (relative margin < 1e-2, recorded by the CPU
// engine), a bf16 engine may pick the other expert and from that position on
// legitimately disagree (later positions attend to it). Comparisons therefore
// run up to the first such position of each sequence; the tests print how
// much was compared and require most of it (a wrong head, rope frequency,
// expert or sink breaks every position, ambiguous or not).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/cuda/device.h"
#include "worker/engine/cpu_engine.h"
#include "worker/engine/cuda_engine.h"
#include "worker/engine/sampler.h"
#include "worker/model/checkpoint.h"
#include "worker/model/load_weights.h"
#include "worker/model/synthetic_weights.h"

namespace flotilla {
namespace {

namespace fs = std::filesystem;
constexpr double kRelTolerance = 0.03;

// The fixtures' directory; FLOTILLA_GOLDEN_DIR in the environment overrides
// the source tree's (test binaries carried to a GPU machine).
std::string GoldenDir() {
  const char* env = std::getenv("FLOTILLA_GOLDEN_DIR");
  return env != nullptr && *env != '\0' ? env : FLOTILLA_GOLDEN_DIR;
}

std::vector<std::string> Fixtures() {
  std::vector<std::string> names;
  if (!fs::is_directory(GoldenDir())) return names;
  for (const auto& entry : fs::directory_iterator(GoldenDir())) {
    if (entry.is_directory() && fs::exists(entry.path() / "golden.json")) {
      names.push_back(entry.path().filename().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<float> ReadF32(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot open " << path;
  in.seekg(0, std::ios::end);
  std::vector<float> v(static_cast<size_t>(in.tellg()) / sizeof(float));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), v.size() * sizeof(float));
  return v;
}

// max |a - b| / max(1, max |b|).
double RelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0, big = 1;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    worst = std::max(worst, std::abs(double(a[i]) - b[i]));
    big = std::max(big, std::abs(double(b[i])));
  }
  return worst / big;
}

bool HaveGpu() { return kernels::cuda::DeviceCount() > 0; }

CudaEngineOptions SmallOptions() {
  CudaEngineOptions o;
  o.kv_num_blocks = 256;
  o.max_context = 2048;
  o.max_batch_tokens = 1024;
  o.max_sequences = 16;
  return o;
}

constexpr float kAmbiguousMargin = 1e-2f;

// Positions before the first one whose routing the reference found ambiguous.
size_t Trusted(const std::vector<float>& margins) {
  size_t n = 0;
  while (n < margins.size() && margins[n] >= kAmbiguousMargin) ++n;
  return n;
}

// Relative difference over the first `rows` rows of V logits.
double RelDiffRows(const std::vector<float>& a, const std::vector<float>& b, size_t rows,
                   int64_t V) {
  return RelDiff(std::vector<float>(a.begin(), a.begin() + rows * V),
                 std::vector<float>(b.begin(), b.begin() + rows * V));
}

class CudaGolden : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device present";
    dir_ = fs::path(GoldenDir()) / GetParam();
    std::ifstream in(dir_ / "golden.json");
    golden_ = nlohmann::json::parse(in);
    auto ck = Checkpoint::Open(dir_.string());
    ASSERT_TRUE(ck.ok()) << ck.status();
    std::shared_ptr<const Checkpoint> checkpoint(std::move(*ck));
    auto w = LoadWeights(checkpoint, ShardSpec{});
    ASSERT_TRUE(w.ok()) << w.status();
    auto e = CudaEngine::Create(*w, SmallOptions());
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
    CpuEngineOptions o;
    o.kv_num_blocks = CpuEngine::KvBlocksFor(w->config, w->config.num_key_value_heads, 16, 4, 256);
    o.record_router_margins = true;
    auto c = CpuEngine::Create(std::move(*w), o, &pool_);
    ASSERT_TRUE(c.ok()) << c.status();
    cpu_ = std::move(*c);
  }

  std::vector<int32_t> Prompt(size_t i) { return golden_["prompts"][i].get<std::vector<int32_t>>(); }

  kernels::cpu::ThreadPool pool_{4};
  fs::path dir_;
  nlohmann::json golden_;
  std::unique_ptr<CudaEngine> engine_;
  std::unique_ptr<CpuEngine> cpu_;
};

TEST_P(CudaGolden, PromptLogitsMatchTheReference) {
  const int64_t V = golden_["vocab_size"];
  size_t compared = 0, total = 0;
  for (size_t i = 0; i < golden_["prompts"].size(); ++i) {
    SCOPED_TRACE("prompt " + std::to_string(i));
    std::vector<int32_t> prompt = Prompt(i);
    const int64_t cs = cpu_->NewSequence();
    auto ref = cpu_->Step({StepItem{cs, prompt, LogitsMode::kAll}});
    ASSERT_TRUE(ref.ok()) << ref.status();
    ASSERT_TRUE(cpu_->FreeSequence(cs).ok());
    const size_t trusted = Trusted(ref->router_margins[0]);
    // The reference itself against transformers, as golden_test checks.
    std::vector<float> want = ReadF32(dir_ / golden_["logits_files"][i].get<std::string>());
    ASSERT_LE(RelDiff(ref->logits[0], want), 1e-4);
    for (size_t chunk : {prompt.size(), size_t{5}}) {
      int64_t s = engine_->NewSequence();
      std::vector<float> got;
      for (size_t b = 0; b < prompt.size(); b += chunk) {
        size_t end = std::min(prompt.size(), b + chunk);
        auto out = engine_->Step({StepItem{s, {prompt.begin() + b, prompt.begin() + end}, LogitsMode::kAll}});
        ASSERT_TRUE(out.ok()) << out.status();
        got.insert(got.end(), out->logits[0].begin(), out->logits[0].end());
      }
      const double rel = trusted > 0 ? RelDiffRows(got, ref->logits[0], trusted, V) : 0.0;
      EXPECT_LE(rel, kRelTolerance) << "chunk " << chunk;
      std::cout << GetParam() << " prompt " << i << " chunk " << chunk << ": " << trusted << " of "
                << prompt.size() << " positions before an ambiguous routing; rel diff " << rel
                << " (all positions: " << RelDiff(got, ref->logits[0]) << ")\n";
      ASSERT_TRUE(engine_->FreeSequence(s).ok());
    }
    compared += trusted;
    total += prompt.size();
  }
  EXPECT_GE(compared * 2, total) << "too few positions had unambiguous routing to compare";
}

// Batched greedy decoding, through host logits and through GPU sampling
// (graph-captured decode), gives the fixture's tokens until the reference
// meets an ambiguous routing or a top-2 logit tie within the tolerance.
TEST_P(CudaGolden, GreedyContinuationsAreIdentical) {
  const int64_t V = golden_["vocab_size"];
  const size_t n = golden_["prompts"].size();
  // How many greedy steps of each prompt the reference decides unambiguously.
  std::vector<size_t> trusted_steps(n);
  size_t compared = 0, total = 0;
  for (size_t i = 0; i < n; ++i) {
    std::vector<int32_t> greedy = golden_["greedy"][i].get<std::vector<int32_t>>();
    std::vector<int32_t> seq = Prompt(i);
    const size_t prompt_len = seq.size();
    seq.insert(seq.end(), greedy.begin(), greedy.end());
    const int64_t cs = cpu_->NewSequence();
    auto ref = cpu_->Step({StepItem{cs, seq, LogitsMode::kAll}});
    ASSERT_TRUE(ref.ok()) << ref.status();
    ASSERT_TRUE(cpu_->FreeSequence(cs).ok());
    const std::vector<float>& m = ref->router_margins[0];
    size_t steps = 0;
    // Step j's token comes from the logits at position prompt_len - 1 + j,
    // which depend on every position up to it.
    for (; steps < greedy.size(); ++steps) {
      const size_t pos = prompt_len - 1 + steps;
      if (Trusted(std::vector<float>(m.begin(), m.begin() + pos + 1)) <= pos) break;
      std::vector<float> row(ref->logits[0].begin() + pos * V, ref->logits[0].begin() + (pos + 1) * V);
      std::vector<float> sorted = row;
      std::nth_element(sorted.begin(), sorted.begin() + 1, sorted.end(), std::greater<float>());
      const float big = std::max(1.0f, std::abs(sorted[0]));
      if (sorted[0] - sorted[1] < 2 * kRelTolerance * big) break;
    }
    trusted_steps[i] = steps;
    compared += steps;
    total += greedy.size();
  }
  std::cout << GetParam() << ": " << compared << " of " << total
            << " greedy steps decided unambiguously by the reference\n";
  EXPECT_GE(compared * 2, total) << "too few unambiguous greedy steps to compare";
  for (bool gpu_sampling : {false, true}) {
    SCOPED_TRACE(gpu_sampling ? "gpu sampling" : "host argmax");
    std::vector<int64_t> seqs;
    std::vector<StepItem> items;
    for (size_t i = 0; i < n; ++i) {
      seqs.push_back(engine_->NewSequence());
      items.push_back(StepItem{seqs[i], Prompt(i), LogitsMode::kLast});
    }
    std::vector<std::vector<int32_t>> got(n);
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
        for (size_t i = 0; i < n; ++i) next[i] = Argmax(out->logits[i].data(), V);
      }
      for (size_t i = 0; i < n; ++i) {
        got[i].push_back(next[i]);
        items[i].tokens = {next[i]};
      }
    }
    for (size_t i = 0; i < n; ++i) {
      std::vector<int32_t> want = golden_["greedy"][i].get<std::vector<int32_t>>();
      want.resize(trusted_steps[i]);
      got[i].resize(trusted_steps[i]);
      EXPECT_EQ(got[i], want) << "prompt " << i;
    }
    for (int64_t s : seqs) ASSERT_TRUE(engine_->FreeSequence(s).ok());
  }
}

TEST_P(CudaGolden, DecodingThroughTheCacheMatchesTheFullSequence) {
  if (!golden_.contains("full_sequence")) GTEST_SKIP() << "fixture has no full_sequence";
  const int64_t V = golden_["vocab_size"];
  const auto& fs_json = golden_["full_sequence"];
  std::vector<int32_t> tokens = fs_json["tokens"].get<std::vector<int32_t>>();
  const int64_t cs = cpu_->NewSequence();
  auto ref = cpu_->Step({StepItem{cs, tokens, LogitsMode::kAll}});
  ASSERT_TRUE(ref.ok()) << ref.status();
  const size_t trusted = Trusted(ref->router_margins[0]);
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
  const double rel = trusted > 0 ? RelDiffRows(got, ref->logits[0], trusted, V) : 0.0;
  EXPECT_LE(rel, kRelTolerance);
  EXPECT_GE(trusted * 2, tokens.size()) << "too few unambiguous positions";
  std::cout << GetParam() << " decode through the cache: " << trusted << " of " << tokens.size()
            << " positions compared, rel diff " << rel << "\n";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaGolden, ::testing::ValuesIn(Fixtures()),
                         [](const auto& info) { return info.param; });

TEST(CudaEngineErrors, BadStepsAreRefusedAndChangeNothing) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device present";
  ModelConfig c = ModelConfig::Tiny();
  auto w = MakeSyntheticWeights(c, 3);
  ASSERT_TRUE(w.ok()) << w.status();
  auto e = CudaEngine::Create(*w, SmallOptions());
  ASSERT_TRUE(e.ok()) << e.status();
  CudaEngine& engine = **e;
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
// synthetic weights, prefill of a mixed batch then graph-captured decode,
// teacher-forced with the reference's tokens while its routing is unambiguous.
TEST(CudaEngineRealShapes, MatchesTheCpuEngine) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device present";
  ModelConfig c = ModelConfig::Gptoss120b();
  c.num_hidden_layers = 2;
  c.layer_types.resize(2);
  auto w = MakeSyntheticWeights(c, 11);
  ASSERT_TRUE(w.ok()) << w.status();
  CudaEngineOptions o = SmallOptions();
  auto g = CudaEngine::Create(*w, o);
  ASSERT_TRUE(g.ok()) << g.status();
  kernels::cpu::ThreadPool pool(8);
  CpuEngineOptions co;
  co.kv_num_blocks = CpuEngine::KvBlocksFor(c, c.num_key_value_heads, 16, 3, 400);
  co.record_router_margins = true;
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
  std::vector<bool> ambiguous(3, false);
  int compared = 0;
  for (int step = 0; step < 8; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    auto go = (*g)->Step(gi);
    ASSERT_TRUE(go.ok()) << go.status();
    auto co2 = (*cpu)->Step(ci);
    ASSERT_TRUE(co2.ok()) << co2.status();
    for (int i = 0; i < 3; ++i) {
      const auto& m = co2->router_margins[i];
      ambiguous[i] = ambiguous[i] || Trusted(m) < m.size();
      const double rel = RelDiff(go->logits[i], co2->logits[i]);
      if (!ambiguous[i]) {
        EXPECT_LE(rel, kRelTolerance) << "sequence " << i;
        ++compared;
      }
      if (step == 0 || step == 7) {
        std::cout << "real shapes step " << step << " seq " << i << ": rel diff " << rel
                  << (ambiguous[i] ? " (after an ambiguous routing: not compared)" : "") << "\n";
      }
      const int32_t next = Argmax(co2->logits[i].data(), V);
      gi[i].tokens = {next};
      ci[i].tokens = {next};
    }
  }
  EXPECT_GE(compared, 12) << "too few unambiguous steps to compare";
}

}  // namespace
}  // namespace flotilla
