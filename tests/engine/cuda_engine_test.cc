// The CUDA engine against the references: the transformers goldens under
// tests/data/golden (every prompt logit, greedy continuations, decoding
// through the cache) and the CPU engine on a two-layer model of real
// gpt-oss-120b layer shapes (H = I = 2880, 64 q / 8 kv heads of 64, E = 128,
// K = 4, the real vocabulary), which runs the fast head_dim-64 attention path,
// the tensor-core linear path and CUDA-graph decode.
//
// Tolerance: the GPU feeds every matmul bf16 activations (f32 accumulation,
// f32 residual stream) while the references stay in f32, so each layer adds a
// relative error of a few bf16 ulps (2^-8). Logits are compared with
// |gpu - ref| <= 0.03 * max(1, max |ref|) over a prompt; one wrong head, rope
// frequency, expert or sink moves logits by far more. Greedy tokens must be
// identical where the reference's top-2 margin exceeds that tolerance (the
// fixtures record it).
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
  }

  std::vector<int32_t> Prompt(size_t i) { return golden_["prompts"][i].get<std::vector<int32_t>>(); }

  fs::path dir_;
  nlohmann::json golden_;
  std::unique_ptr<CudaEngine> engine_;
};

TEST_P(CudaGolden, PromptLogitsMatchTransformers) {
  const int64_t V = golden_["vocab_size"];
  for (size_t i = 0; i < golden_["prompts"].size(); ++i) {
    SCOPED_TRACE("prompt " + std::to_string(i));
    std::vector<int32_t> prompt = Prompt(i);
    std::vector<float> want = ReadF32(dir_ / golden_["logits_files"][i].get<std::string>());
    ASSERT_EQ(want.size(), prompt.size() * V);
    for (size_t chunk : {prompt.size(), size_t{5}}) {
      int64_t s = engine_->NewSequence();
      std::vector<float> got;
      for (size_t b = 0; b < prompt.size(); b += chunk) {
        size_t end = std::min(prompt.size(), b + chunk);
        auto out = engine_->Step({StepItem{s, {prompt.begin() + b, prompt.begin() + end}, LogitsMode::kAll}});
        ASSERT_TRUE(out.ok()) << out.status();
        got.insert(got.end(), out->logits[0].begin(), out->logits[0].end());
      }
      const double rel = RelDiff(got, want);
      EXPECT_LE(rel, kRelTolerance) << "chunk " << chunk;
      std::cout << GetParam() << " prompt " << i << " chunk " << chunk
                << ": max |logit diff| / max |logit| " << rel << "\n";
      ASSERT_TRUE(engine_->FreeSequence(s).ok());
    }
  }
}

// Batched greedy decoding, both through host logits and through GPU sampling
// (graph-captured decode), gives the fixture's tokens.
TEST_P(CudaGolden, GreedyContinuationsAreIdentical) {
  const int64_t V = golden_["vocab_size"];
  const size_t n = golden_["prompts"].size();
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
      EXPECT_EQ(got[i], golden_["greedy"][i].get<std::vector<int32_t>>()) << "prompt " << i;
    }
    for (int64_t s : seqs) ASSERT_TRUE(engine_->FreeSequence(s).ok());
  }
}

TEST_P(CudaGolden, DecodingThroughTheCacheMatchesTheFullSequence) {
  if (!golden_.contains("full_sequence")) GTEST_SKIP() << "fixture has no full_sequence";
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
  const double rel = RelDiff(got, want);
  EXPECT_LE(rel, kRelTolerance);
  std::cout << GetParam() << " decode through the cache: rel diff " << rel << "\n";
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
// synthetic weights, prefill of a mixed batch then graph-captured decode.
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
    auto co2 = (*cpu)->Step(ci);
    ASSERT_TRUE(co2.ok()) << co2.status();
    for (int i = 0; i < 3; ++i) {
      const double rel = RelDiff(go->logits[i], co2->logits[i]);
      EXPECT_LE(rel, kRelTolerance) << "sequence " << i;
      if (step == 0 || step == 7) {
        std::cout << "real shapes step " << step << " seq " << i << ": rel diff " << rel << "\n";
      }
      const int32_t next = Argmax(co2->logits[i].data(), V);
      gi[i].tokens = {next};
      ci[i].tokens = {next};
    }
  }
}

}  // namespace
}  // namespace flotilla
