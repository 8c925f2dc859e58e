// Request migration on the GPU engine: a request resumed after k of its
// tokens continues with the tokens k.. of an undisturbed run when the engine
// draws on the device (the draw count is the Philox step; penalties and
// masks go up as the sampler's state after the resumed tokens). One rank,
// a fresh engine per run, as after a migration. Skips without a GPU.
#include <gtest/gtest.h>

#include "kernels/cuda/device.h"
#include "tests/worker/resume_harness.h"
#include "worker/engine/cuda_engine.h"

namespace flotilla::worker {
namespace {

using resume_testing::ExpectResumedRunsContinueExactly;
using resume_testing::Request;
using resume_testing::Updates;

Updates ServeCuda(const cluster::SubmitSequence& submit) {
  CudaEngineOptions o;
  o.kv_num_blocks = 256;
  o.max_context = 2048;
  o.max_batch_tokens = 1024;
  o.max_sequences = 16;
  absl::StatusOr<std::unique_ptr<CudaEngine>> engine =
      CudaEngine::Create(resume_testing::WeightsOf(1, 0), o);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  return resume_testing::ServeOnRank(**engine, nullptr, nullptr, 1, 0, submit);
}

class ResumeCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kernels::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device present";
  }
};

TEST_F(ResumeCudaTest, GreedyContinuesWithTheUndisturbedTokens) {
  ExpectResumedRunsContinueExactly(ServeCuda, Request(16), {1, 6, 15});
}

TEST_F(ResumeCudaTest, SeededSamplingContinuesThePhiloxStream) {
  ExpectResumedRunsContinueExactly(ServeCuda, resume_testing::Seeded(Request(16), 1234), {3, 9});
}

TEST_F(ResumeCudaTest, PenaltiesCountTheResumedOutput) {
  ExpectResumedRunsContinueExactly(
      ServeCuda, resume_testing::Seeded(resume_testing::Penalised(Request(16)), 99), {7});
}

TEST_F(ResumeCudaTest, ConstrainedOutputContinuesInTheGrammarsState) {
  ExpectResumedRunsContinueExactly(
      ServeCuda, resume_testing::Constrained(resume_testing::Seeded(Request(24), 5)), {2, 10});
}

TEST_F(ResumeCudaTest, ReasoningBudgetCountsTheResumedAnalysis) {
  ExpectResumedRunsContinueExactly(ServeCuda, resume_testing::Reasoning(Request(20), 6), {5, 8});
}

TEST_F(ResumeCudaTest, MaxTokensCountsTheResumedOutput) {
  resume_testing::ExpectMaxTokensCountsTheResumedOutput(ServeCuda);
}

}  // namespace
}  // namespace flotilla::worker
