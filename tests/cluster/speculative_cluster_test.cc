// Speculative decoding end to end: local clusters (one CPU worker, and four
// as TP 2 x DP 2) whose coordinator sets --speculative-method ngram (and
// eagle3 with synthetic:eagle3 on four). A request that leaves the
// choice to the server drafts (the /metrics counters move) and streams the
// tokens of the same request with speculation turned off in its own
// SamplingParams; an unknown method is INVALID_ARGUMENT naming it.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "proto/flotilla.grpc.pb.h"
#include "tests/local_cluster_suite.h"

namespace flotilla {
namespace {

class SpeculativeCluster : public testing_util::LocalClusterSuite<SpeculativeCluster> {
 public:
  static void Configure(cli::LocalClusterOptions& o) {
    o.coordinator_args = {"--speculative-method", "ngram", "--num-speculative-tokens", "4"};
  }
};

struct Generated {
  grpc::Status status;
  std::vector<int32_t> tokens;
};

// A prompt that repeats itself, biased toward its own tokens (a random
// model's output hardly repeats on its own), greedy or seeded;
// `method` empty: the server's choice.
Generated Generate(const std::string& address, const std::string& method, bool seeded) {
  auto stub =
      v1::Flotilla::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  v1::GenerateRequest req;
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 9; ++i) req.mutable_prompt_ids()->add_ids(1000 + 37 * i);
  }
  common::SamplingParams* s = req.mutable_sampling();
  for (int i = 0; i < 9; ++i) (*s->mutable_logit_bias())[1000 + 37 * i] = 50.0f;
  s->set_max_tokens(32);
  s->set_ignore_eos(true);
  if (seeded) {
    s->set_temperature(1.0f);
    s->set_seed(11);
  } else {
    s->set_temperature(0.0f);
  }
  if (!method.empty()) s->mutable_speculative()->set_method(method);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  auto reader = stub->Generate(&ctx, req);
  Generated out;
  v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    out.tokens.insert(out.tokens.end(), resp.token_ids().begin(), resp.token_ids().end());
  }
  out.status = reader->Finish();
  return out;
}

TEST_F(SpeculativeCluster, DraftsByDefaultAndStreamsTheTokensOfARunWithout) {
  for (bool seeded : {false, true}) {
    SCOPED_TRACE(seeded ? "seeded" : "greedy");
    const Generated off = Generate(cluster_->address(), "off", seeded);
    ASSERT_TRUE(off.status.ok()) << off.status.error_message();
    ASSERT_EQ(off.tokens.size(), 32u);
    const Generated on = Generate(cluster_->address(), "", seeded);
    ASSERT_TRUE(on.status.ok()) << on.status.error_message();
    EXPECT_EQ(on.tokens, off.tokens);
  }
  ASSERT_TRUE(WaitIdle());
  const double drafted = Metric("flotilla_spec_decode_num_draft_tokens_total");
  const double accepted = Metric("flotilla_spec_decode_num_accepted_tokens_total");
  const double steps = Metric("flotilla_spec_decode_num_verify_steps_total");
  EXPECT_GT(drafted, 0);
  EXPECT_GE(accepted, 0);
  EXPECT_LE(accepted, drafted);
  EXPECT_GT(steps, 0);
  // Printed with six significant digits.
  EXPECT_NEAR(Metric("flotilla_spec_decode_mean_acceptance_length"), 1 + accepted / steps, 1e-4);
}

// Four workers as TP 2 x DP 2: the plans carry the drafts and the accepted
// tokens to the peer of each leader.
class SpeculativeTpCluster : public testing_util::LocalClusterSuite<SpeculativeTpCluster> {
 public:
  static void Configure(cli::LocalClusterOptions& o) {
    o.workers = 4;
    o.tp = 2;
    o.threads_per_worker = 1;
    o.coordinator_args = {"--speculative-method", "ngram", "--num-speculative-tokens", "3"};
  }
};

TEST_F(SpeculativeTpCluster, GreedyAndSeededTokensAreThoseWithoutSpeculation) {
  for (bool seeded : {false, true}) {
    SCOPED_TRACE(seeded ? "seeded" : "greedy");
    const Generated off = Generate(cluster_->address(), "off", seeded);
    ASSERT_TRUE(off.status.ok()) << off.status.error_message();
    const Generated on = Generate(cluster_->address(), "", seeded);
    ASSERT_TRUE(on.status.ok()) << on.status.error_message();
    EXPECT_EQ(on.tokens, off.tokens);
  }
  ASSERT_TRUE(WaitIdle());
  EXPECT_GT(Metric("flotilla_spec_decode_num_draft_tokens_total"), 0);
}

// EAGLE3 on four workers as TP 2 x DP 2: each leader loads the synthetic
// head (written once into the model cache) and drafts from its engine's
// hidden states; the tokens are those of a run without speculation.
class SpeculativeEagle3Cluster : public testing_util::LocalClusterSuite<SpeculativeEagle3Cluster> {
 public:
  static void Configure(cli::LocalClusterOptions& o) {
    o.workers = 4;
    o.tp = 2;
    o.threads_per_worker = 1;
    o.coordinator_args = {"--speculative-method",     "eagle3",
                          "--speculative-model",      "synthetic:eagle3",
                          "--num-speculative-tokens", "3"};
  }
};

TEST_F(SpeculativeEagle3Cluster, GreedyAndSeededTokensAreThoseWithoutSpeculation) {
  for (bool seeded : {false, true}) {
    SCOPED_TRACE(seeded ? "seeded" : "greedy");
    const Generated off = Generate(cluster_->address(), "off", seeded);
    ASSERT_TRUE(off.status.ok()) << off.status.error_message();
    const Generated on = Generate(cluster_->address(), "", seeded);
    ASSERT_TRUE(on.status.ok()) << on.status.error_message();
    EXPECT_EQ(on.tokens, off.tokens);
  }
  ASSERT_TRUE(WaitIdle());
  EXPECT_GT(Metric("flotilla_spec_decode_num_draft_tokens_total"), 0);
}

TEST_F(SpeculativeCluster, AnUnknownMethodIsRefusedByName) {
  const Generated got = Generate(cluster_->address(), "medusa", false);
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(got.status.error_message().find("medusa"), std::string::npos)
      << got.status.error_message();
}

// The benchmark-only replay drafter needs the opt-in this cluster lacks.
TEST_F(SpeculativeCluster, TheReplayDrafterIsRefusedWithoutItsOptIn) {
  const Generated got = Generate(cluster_->address(), "replay", false);
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(got.status.error_message().find("--allow-replay-drafter"), std::string::npos)
      << got.status.error_message();
}

}  // namespace
}  // namespace flotilla
