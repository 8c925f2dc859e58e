// EAGLE3 on the GPU engine: the hidden states a CudaEngine step returns are
// the CPU engine's (bf16 activations: within a relative 0.05), and serving
// with the synthetic head drafting gives the tokens of a run without
// speculation (greedy, seeded, penalised). With FLOTILLA_EAGLE3_120B=1, the
// same greedy check on synthetic:120b with the head at the published
// gpt-oss-120b shapes (minutes: the model is generated on the device and the
// head runs on the host). Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>

#include "kernels/cpu/thread_pool.h"
#include "kernels/cuda/device.h"
#include "tests/worker/resume_harness.h"
#include "worker/draft_head.h"
#include "worker/engine/cpu_engine.h"
#include "worker/engine/cuda_engine.h"
#include "worker/model/eagle3_synthetic.h"
#include "worker/model/model_source.h"

namespace flotilla::worker {
namespace {

using resume_testing::Request;
using resume_testing::Updates;

class Eagle3CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kernels::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device present";
  }
};

CudaEngineOptions Options() {
  CudaEngineOptions o;
  o.kv_num_blocks = 256;
  o.max_context = 2048;
  o.max_batch_tokens = 1024;
  o.max_sequences = 16;
  return o;
}

std::shared_ptr<const Eagle3Head> HeadFor(const ModelConfig& target, const ModelWeights* embed) {
  const std::string dir =
      ::testing::TempDir() + "/flotilla_eagle3_cuda_test_h" + std::to_string(target.hidden_size);
  EXPECT_TRUE(WriteSyntheticEagle3Head(dir, target, 7).ok());
  absl::StatusOr<std::unique_ptr<Eagle3Head>> head = LoadEagle3Head(dir, target);
  EXPECT_TRUE(head.ok()) << head.status();
  if (!head.ok()) return nullptr;
  if (embed != nullptr) {
    EXPECT_TRUE((*head)->UseTargetEmbedding(embed->embed, embed->keepalive).ok());
  }
  return std::shared_ptr<const Eagle3Head>(*std::move(head));
}

float RelativeDifference(const std::vector<float>& got, const std::vector<float>& want) {
  float diff = 0, scale = 1;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::fabs(got[i] - want[i]));
    scale = std::max(scale, std::fabs(want[i]));
  }
  return diff / scale;
}

TEST_F(Eagle3CudaTest, HiddenStatesAreTheCpuEnginesAfterEachCapturedLayer) {
  const ModelWeights& w = resume_testing::WeightsOf(1, 0);
  absl::StatusOr<std::unique_ptr<CudaEngine>> gpu = CudaEngine::Create(w, Options());
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  CpuEngineOptions co;
  co.kv_num_blocks = 256;
  std::unique_ptr<CpuEngine> cpu = *CpuEngine::Create(w, co, nullptr);
  const std::vector<int> layers = {0, 1, 3};
  ASSERT_TRUE((*gpu)->SetHiddenCapture(layers).ok());
  ASSERT_TRUE(cpu->SetHiddenCapture(layers).ok());
  Engine* engines[] = {gpu->get(), cpu.get()};
  std::vector<StepOutput> out[2];
  for (int e = 0; e < 2; ++e) {
    const int64_t a = engines[e]->NewSequence(), b = engines[e]->NewSequence();
    StepItem prompt{a, {1000, 1037, 1074, 1111, 1148, 1185, 1222}, LogitsMode::kLast};
    prompt.return_hidden = true;
    StepItem other{b, {3000, 3037}, LogitsMode::kLast};
    absl::StatusOr<StepOutput> first = engines[e]->Step({prompt, other});
    ASSERT_TRUE(first.ok()) << first.status();
    out[e].push_back(*first);
    StepItem decode{a, {1259}, LogitsMode::kLast};  // a decode step (graph-sized) asking too
    decode.return_hidden = true;
    absl::StatusOr<StepOutput> second = engines[e]->Step({decode});
    ASSERT_TRUE(second.ok()) << second.status();
    out[e].push_back(*second);
  }
  for (int s = 0; s < 2; ++s) {
    SCOPED_TRACE(s == 0 ? "prompt step" : "decode step");
    ASSERT_EQ(out[0][s].hidden[0].size(), out[1][s].hidden[0].size());
    ASSERT_FALSE(out[1][s].hidden[0].empty());
    EXPECT_LT(RelativeDifference(out[0][s].hidden[0], out[1][s].hidden[0]), 0.05f);
  }
  EXPECT_TRUE(out[0][0].hidden[1].empty());
}

std::map<uint64_t, std::vector<int32_t>> TokensById(const Updates& updates) {
  std::map<uint64_t, std::vector<int32_t>> by_id;
  for (const cluster::SequenceUpdate& u : updates) {
    EXPECT_NE(u.finish_reason(), common::ERROR) << u.error();
    auto& tokens = by_id[u.request_id()];
    tokens.insert(tokens.end(), u.token_ids().begin(), u.token_ids().end());
  }
  return by_id;
}

// Serves `submits` on a fresh engine from `make`: speculation off, or eagle3
// drafting `k` tokens with `memory`'s head.
Updates Serve(const std::function<std::unique_ptr<CudaEngine>()>& make,
              const std::vector<cluster::SubmitSequence>& submits, DraftMemory* memory, int k,
              SpeculativeCounts* counts) {
  std::unique_ptr<CudaEngine> engine = make();
  if (engine == nullptr) return {};
  resume_testing::ServeOptions o;
  o.max_batch_tokens = 64;
  o.counts = counts;
  if (memory != nullptr) {
    EXPECT_TRUE(engine->SetHiddenCapture(memory->eagle3->config.aux_layers).ok());
    o.speculative.method = SpeculativeMethod::kEagle3;
    o.speculative.num_tokens = k;
    o.draft_memory = memory;
  }
  return resume_testing::ServeOnRank(*engine, nullptr, nullptr, 1, 0, submits, o);
}

cluster::SubmitSequence Numbered(cluster::SubmitSequence s, uint64_t id) {
  s.set_request_id(id);
  return s;
}

TEST_F(Eagle3CudaTest, TokensAreThoseWithoutSpeculation) {
  const ModelWeights& w = resume_testing::WeightsOf(1, 0);
  auto make = [&]() -> std::unique_ptr<CudaEngine> {
    absl::StatusOr<std::unique_ptr<CudaEngine>> e = CudaEngine::Create(w, Options());
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? *std::move(e) : nullptr;
  };
  const std::vector<cluster::SubmitSequence> submits = {
      Numbered(Request(24), 1), Numbered(resume_testing::Seeded(Request(20), 77), 2),
      Numbered(resume_testing::Penalised(Request(16)), 3)};
  const auto want = TokensById(Serve(make, submits, nullptr, 0, nullptr));
  ASSERT_EQ(want.size(), submits.size());
  for (int k : {1, 3}) {
    SCOPED_TRACE(testing::Message() << k << " speculative tokens");
    DraftMemory memory;
    memory.eagle3 = HeadFor(w.config, &w);
    ASSERT_NE(memory.eagle3, nullptr);
    SpeculativeCounts counts;
    EXPECT_EQ(TokensById(Serve(make, submits, &memory, k, &counts)), want);
    EXPECT_GT(counts.drafted, 0u);
  }
}

// The published head's shapes on gpt-oss-120b's: hidden 2880, 64 heads of
// 64, MLP 17,280, draft vocabulary 32,000, target layers 1, 17, 32.
TEST_F(Eagle3CudaTest, Synthetic120bWithThePublishedHeadShapes) {
  if (std::getenv("FLOTILLA_EAGLE3_120B") == nullptr) {
    GTEST_SKIP() << "set FLOTILLA_EAGLE3_120B=1 (minutes: synthetic:120b and a host-side head)";
  }
  const ModelConfig c = ModelConfig::Gptoss120b();
  auto make = [&]() -> std::unique_ptr<CudaEngine> {
    absl::StatusOr<std::unique_ptr<CudaEngine>> e = CudaEngine::CreateSynthetic(c, 0, Options());
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? *std::move(e) : nullptr;
  };
  cluster::SubmitSequence greedy = Numbered(Request(32), 1);
  const auto want = TokensById(Serve(make, {greedy}, nullptr, 0, nullptr));
  // The head as a worker loads it: synthetic:eagle3 from the model cache,
  // the synthetic target's embedding made on the host (no host weights).
  absl::StatusOr<std::unique_ptr<ModelSource>> source = ModelSource::Open("synthetic:120b");
  ASSERT_TRUE(source.ok()) << source.status();
  absl::StatusOr<std::shared_ptr<const Eagle3Head>> head =
      LoadDraftHead("synthetic:eagle3", **source, ModelWeights{});
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ((*head)->config.draft_vocab_size, 32000);
  EXPECT_EQ((*head)->config.intermediate_size, 17280);
  EXPECT_EQ((*head)->config.aux_layers, (std::vector<int>{1, 17, 32}));
  DraftMemory memory;
  memory.eagle3 = *head;
  kernels::cpu::ThreadPool pool(16);
  memory.pool = &pool;
  SpeculativeCounts counts;
  EXPECT_EQ(TokensById(Serve(make, {greedy}, &memory, 3, &counts)), want);
  EXPECT_GT(counts.drafted, 0u);
}

}  // namespace
}  // namespace flotilla::worker
