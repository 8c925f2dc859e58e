// Speculative decoding on the worker: prompt-lookup drafting
// (ngram_drafter.h), the request's settings (speculation.h), verification
// (worker/engine/draft_verify.h) and the whole serving loop on real CPU
// engines (resume_harness.h's): greedy and seeded requests give the tokens
// of a run without speculation, on one rank and a TP 2 pair, on a tiny
// synthetic model, the golden fixtures and the trained demo model;
// structured outputs stay valid; acceptance is counted; KV blocks come back.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>
#include <unordered_set>

#include "comm/local/local_communicator.h"
#include "tests/engine/golden_fixtures.h"
#include "tests/engine/token_filter.h"
#include "tests/worker/resume_harness.h"
#include "worker/engine/cpu_engine.h"
#include "worker/engine/draft_verify.h"
#include "worker/model/eagle3_head.h"
#include "worker/model/eagle3_synthetic.h"
#include "worker/model/model_source.h"
#include "worker/ngram_drafter.h"
#include "worker/parallel/host_context.h"
#include "worker/replay_drafter.h"
#include "worker/speculation.h"

namespace flotilla::worker {
namespace {

using resume_testing::OnLocalRanks;
using resume_testing::Request;
using resume_testing::ServeOptions;
using resume_testing::TestModel;
using resume_testing::TokensOf;
using resume_testing::Updates;

// ---- drafting and settings ----

TEST(NgramDraftTest, ProposesWhatFollowedTheLatestMatchWithAWholeDraft) {
  const std::vector<int32_t> context = {1, 5, 1, 6, 1};
  EXPECT_EQ(ProposeNgramDraft(context, 1, 1, 1), (std::vector<int32_t>{6}));
  EXPECT_EQ(ProposeNgramDraft(context, 1, 1, 2), (std::vector<int32_t>{6, 1}));
  // Only the first match is followed by 3 tokens.
  EXPECT_EQ(ProposeNgramDraft(context, 1, 1, 3), (std::vector<int32_t>{5, 1, 6}));
  // None is followed by 5: the earliest, followed by the most.
  EXPECT_EQ(ProposeNgramDraft(context, 1, 1, 5), (std::vector<int32_t>{5, 1, 6, 1}));
  // A run of one token drafts more of it.
  EXPECT_EQ(ProposeNgramDraft(std::vector<int32_t>{3, 9, 9, 9, 9}, 1, 2, 2),
            (std::vector<int32_t>{9, 9}));
}

TEST(NgramDraftTest, PrefersTheLongestMatch) {
  const std::vector<int32_t> context = {2, 1, 7, 3, 1, 8, 2, 1};
  EXPECT_EQ(ProposeNgramDraft(context, 1, 2, 2), (std::vector<int32_t>{7, 3}));
  EXPECT_EQ(ProposeNgramDraft(context, 1, 1, 3), (std::vector<int32_t>{8, 2, 1}));
  // Only bigrams and longer: "2 1" is the one that matches.
  EXPECT_EQ(ProposeNgramDraft(context, 2, 4, 1), (std::vector<int32_t>{7}));
}

TEST(NgramDraftTest, NothingWithoutAMatch) {
  EXPECT_TRUE(ProposeNgramDraft(std::vector<int32_t>{1, 2, 3, 4}, 1, 3, 4).empty());
  EXPECT_TRUE(ProposeNgramDraft(std::vector<int32_t>{7}, 1, 3, 4).empty());
  EXPECT_TRUE(ProposeNgramDraft(std::vector<int32_t>{}, 1, 3, 4).empty());
  EXPECT_TRUE(ProposeNgramDraft(std::vector<int32_t>{1, 1, 1}, 1, 3, 0).empty());
  // "4 5" occurs only at the end.
  EXPECT_TRUE(ProposeNgramDraft(std::vector<int32_t>{4, 9, 4, 5}, 2, 2, 4).empty());
}

TEST(SpeculativeSettingsTest, ARequestOverridesTheWorkersDefault) {
  SpeculativeConfig worker;  // off, 3 tokens, n-grams 1..4
  common::SpeculativeParams p;
  absl::StatusOr<SpeculativeConfig> same = SpeculativeFor(p, worker);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->method, SpeculativeMethod::kOff);
  p.set_method("ngram");
  p.set_num_speculative_tokens(5);
  p.set_prompt_lookup_max(2);
  absl::StatusOr<SpeculativeConfig> on = SpeculativeFor(p, worker);
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_EQ(on->method, SpeculativeMethod::kNgram);
  EXPECT_EQ(on->num_tokens, 5);
  EXPECT_EQ(on->lookup_min, 1);
  EXPECT_EQ(on->lookup_max, 2);
  worker.method = SpeculativeMethod::kNgram;
  common::SpeculativeParams off;
  off.set_method("off");
  EXPECT_EQ(SpeculativeFor(off, worker)->method, SpeculativeMethod::kOff);
}

TEST(SpeculativeSettingsTest, RefusesWhatItCannotDo) {
  auto refused = [](common::SpeculativeParams p, const std::string& says) {
    absl::StatusOr<SpeculativeConfig> got = SpeculativeFor(p, SpeculativeConfig{});
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(got.status().message().find(says), std::string::npos) << got.status();
  };
  common::SpeculativeParams p;
  p.set_method("replay");
  refused(p, "--allow-replay-drafter");
  p.set_method("suffix");
  p.set_replay_error_rate(1.5);
  refused(p, "replay_error_rate must be in [0, 1]");
  p.clear_replay_error_rate();
  p.set_method("medusa");
  refused(p, "unknown speculative method \"medusa\"");
  p.set_method("ngram");
  p.set_num_speculative_tokens(17);
  refused(p, "num_speculative_tokens must be in [1, 16]");
  p.set_num_speculative_tokens(2);
  p.set_prompt_lookup_min(5);
  p.set_prompt_lookup_max(3);
  refused(p, "prompt_lookup_min and prompt_lookup_max");
  EXPECT_FALSE(ParseSpeculativeMethod("").ok());
}

// ---- verification ----

constexpr int kVocab = 6;

// Rows of logits whose argmax is `tops` (one row per entry).
std::vector<float> RowsWithArgmax(const std::vector<int32_t>& tops) {
  std::vector<float> rows(tops.size() * kVocab, 0.0f);
  for (size_t r = 0; r < tops.size(); ++r) rows[r * kVocab + tops[r]] = 3.0f;
  return rows;
}

std::unique_ptr<Sampler> MakeSampler(float temperature, uint64_t seed) {
  SamplingParams p;
  p.temperature = temperature;
  p.seed = seed;
  p.max_tokens = 100;
  p.logprobs = true;
  return *Sampler::Create(p, kVocab);
}

std::vector<int32_t> TokensOf(const std::vector<TokenLogprob>& drawn) {
  std::vector<int32_t> tokens;
  for (const TokenLogprob& t : drawn) tokens.push_back(t.token);
  return tokens;
}

TEST(VerifyDraftTest, GreedyAcceptsWhileTheArgmaxMatches) {
  const std::vector<float> rows = RowsWithArgmax({5, 2, 4});
  std::unique_ptr<Sampler> s = MakeSampler(0.0f, 1);
  VerifiedDraft v = VerifyDraft(*s, rows.data(), kVocab, std::vector<int32_t>{5, 3});
  EXPECT_EQ(TokensOf(v.accepted), std::vector<int32_t>{5});
  EXPECT_EQ(v.next.token, 2);  // the model's own at the rejected position
  EXPECT_EQ(s->draws(), 2u);   // the accepted token and the one after it
  s = MakeSampler(0.0f, 1);
  v = VerifyDraft(*s, rows.data(), kVocab, std::vector<int32_t>{5, 2});
  EXPECT_EQ(TokensOf(v.accepted), (std::vector<int32_t>{5, 2}));
  EXPECT_EQ(v.next.token, 4);  // one more after the whole draft
  // The logprobs are the model's (log-softmax of the raw row).
  std::vector<float> lp(kVocab);
  LogSoftmax(rows.data(), kVocab, lp.data());
  EXPECT_FLOAT_EQ(v.accepted[0].logprob, lp[5]);
}

TEST(VerifyDraftTest, ADraftTheFilterRefusesIsRejected) {
  const std::vector<float> rows = RowsWithArgmax({5, 5});
  std::unique_ptr<Sampler> s = MakeSampler(0.0f, 1);
  std::vector<int32_t> seen;
  s->SetFilter(
      std::make_unique<testing_filter::FixedFilter>(kVocab, std::vector<int32_t>{1, 2}, &seen));
  VerifiedDraft v = VerifyDraft(*s, rows.data(), kVocab, std::vector<int32_t>{5});
  EXPECT_TRUE(v.accepted.empty());
  EXPECT_TRUE(v.next.token == 1 || v.next.token == 2) << v.next.token;
  EXPECT_EQ(seen, std::vector<int32_t>{v.next.token});
}

// The speculative-sampling rule with a deterministic draft d: accepted with
// probability p(d), else a token of p with d removed and renormalised. Over
// 20,000 seeds, the acceptance rate within 4.5 standard deviations of p(d)
// and the rejected tokens' counts against the renormalised rest by a
// chi-square test at p = 1e-5 (the seeds are fixed: the test is exact
// arithmetic, it cannot flake).
TEST(VerifyDraftTest, SampledVerificationKeepsTheTargetDistribution) {
  const std::vector<float> row = {0.3f, 1.2f, -0.5f, 0.9f, 0.0f, -1.0f};
  std::vector<float> rows = row;
  rows.insert(rows.end(), row.begin(), row.end());  // the row after the draft
  std::vector<double> p(kVocab);
  double z = 0;
  for (int t = 0; t < kVocab; ++t) z += std::exp(row[t]);
  for (int t = 0; t < kVocab; ++t) p[t] = std::exp(row[t]) / z;
  constexpr int kRuns = 20000;
  for (int32_t draft : {1, 4}) {
    SCOPED_TRACE(testing::Message() << "draft " << draft);
    int accepted = 0;
    std::vector<int> rejected(kVocab, 0);
    for (int seed = 0; seed < kRuns; ++seed) {
      std::unique_ptr<Sampler> s = MakeSampler(1.0f, 1000003ull * seed + 17);
      VerifiedDraft v = VerifyDraft(*s, rows.data(), kVocab, std::vector<int32_t>{draft});
      if (!v.accepted.empty()) {
        ++accepted;
      } else {
        ASSERT_NE(v.next.token, draft);
        ++rejected[v.next.token];
      }
    }
    const double pd = p[draft];
    const double sigma = std::sqrt(pd * (1 - pd) / kRuns);
    EXPECT_NEAR(static_cast<double>(accepted) / kRuns, pd, 4.5 * sigma);
    const int n = kRuns - accepted;
    double chi2 = 0;
    for (int t = 0; t < kVocab; ++t) {
      if (t == draft) continue;
      const double want = n * p[t] / (1 - pd);
      chi2 += (rejected[t] - want) * (rejected[t] - want) / want;
    }
    EXPECT_LT(chi2, 25.7) << "chi-square with 4 degrees of freedom";  // p = 1e-5
  }
}

// Verification draws each position as a step without a draft would: a
// seeded sampler gives the same tokens whatever was drafted.
TEST(VerifyDraftTest, SeededDrawsAreThoseOfARunWithoutADraft) {
  std::vector<float> rows;
  for (int r = 0; r < 5; ++r) {
    for (int t = 0; t < kVocab; ++t) rows.push_back(0.4f * ((r * 7 + t * 3) % 5));
  }
  std::unique_ptr<Sampler> plain = MakeSampler(1.0f, 42);
  std::vector<int32_t> want;
  for (int r = 0; r < 5; ++r) want.push_back(plain->Sample(rows.data() + r * kVocab, nullptr));
  for (const std::vector<int32_t>& draft :
       {std::vector<int32_t>{want[0], want[1], want[2], want[3]},
        std::vector<int32_t>{want[0], (want[1] + 1) % kVocab, 0, 0}}) {
    std::unique_ptr<Sampler> s = MakeSampler(1.0f, 42);
    VerifiedDraft v = VerifyDraft(*s, rows.data(), kVocab, draft);
    std::vector<int32_t> got = TokensOf(v.accepted);
    got.push_back(v.next.token);
    EXPECT_EQ(got, std::vector<int32_t>(want.begin(), want.begin() + got.size()));
  }
}

// An engine drawing on a device verifies on the host only the items whose
// drafted chunk's draws depend on the tokens before them, item by item: a
// seeded request beside a penalised one keeps the device's draws, which
// are not the host sampler's (the CUDA engine's seeded tokens with
// speculation on and off differed when one penalised draft sent the whole
// step to the host).
TEST(VerifyDraftTest, OnlyHistoryDependentDraftsAreVerifiedOnTheHost) {
  SamplingParams greedy;
  greedy.max_tokens = 100;
  SamplingParams seeded = greedy;
  seeded.temperature = 1.0f;
  seeded.seed = 77;
  SamplingParams penalised = greedy;
  penalised.frequency_penalty = 1.5f;
  SamplingParams biased = greedy;
  biased.logit_bias = {{2, 1.0f}};
  SamplingParams held = greedy;
  held.min_tokens = 2;
  std::vector<std::unique_ptr<Sampler>> samplers;
  for (const SamplingParams& p : {greedy, seeded, penalised, biased, held, greedy}) {
    samplers.push_back(*Sampler::Create(p, kVocab));
  }
  std::vector<int32_t> seen;
  samplers[5]->SetFilter(
      std::make_unique<testing_filter::FixedFilter>(kVocab, std::vector<int32_t>{1, 2}, &seen));
  auto drafted = [](Sampler* sampler, int draft) {
    StepItem item{1, {3, 4, 5}, LogitsMode::kNone, sampler};
    item.draft_tokens = draft;
    return item;
  };
  std::vector<bool> host;
  for (const auto& s : samplers) host.push_back(VerifiedOnHost(drafted(s.get(), 2)));
  EXPECT_EQ(host, (std::vector<bool>{false, false, true, true, true, true}));
  // Without a draft every item draws on the device, and without a sampler
  // nothing is drawn.
  for (const auto& s : samplers) EXPECT_FALSE(VerifiedOnHost(drafted(s.get(), 0)));
  EXPECT_FALSE(VerifiedOnHost(drafted(nullptr, 2)));
  // Once min_tokens are drawn, the draws no longer depend on the history.
  samplers[4]->Record(3);
  samplers[4]->Record(4);
  EXPECT_FALSE(VerifiedOnHost(drafted(samplers[4].get(), 2)));
}

// ---- the engine's side ----

// A CPU engine of the tiny synthetic model of `seed`, blocks of 4 tokens
// (null, and a test failure, when it cannot be made).
std::unique_ptr<CpuEngine> TinyEngine(uint64_t seed) {
  absl::StatusOr<ModelWeights> w = MakeSyntheticWeights(ModelConfig::Tiny(), seed, ShardSpec{});
  EXPECT_TRUE(w.ok()) << w.status();
  if (!w.ok()) return nullptr;
  CpuEngineOptions eo;
  eo.kv_block_size = 4;
  eo.kv_num_blocks = 256;
  absl::StatusOr<std::unique_ptr<CpuEngine>> engine = CpuEngine::Create(*std::move(w), eo, nullptr);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *std::move(engine) : nullptr;
}

// A drafted chunk grows the sequence only by its real tokens; the next step
// commits the accepted ones; what is not the start of the last draft, or a
// chunk of nothing but draft, is refused; an engine that does not verify
// drafts refuses them.
TEST(DraftedStepTest, TheSequenceKeepsOnlyWhatVerificationAccepted) {
  const ModelConfig c = ModelConfig::Tiny();
  std::unique_ptr<CpuEngine> engine = TinyEngine(3);
  ASSERT_NE(engine, nullptr);
  const int64_t seq = engine->NewSequence();
  ASSERT_TRUE(engine->Step({StepItem{seq, {5, 6, 7}, LogitsMode::kNone}}).ok());
  StepItem drafted{seq, {8, 9, 10, 11}, LogitsMode::kNone, nullptr, 3};
  absl::StatusOr<StepOutput> out = engine->Step({drafted});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*engine->SequenceLength(seq), 4);
  const int64_t free_before = engine->KvFreeBlocks();

  StepItem wrong{seq, {3}, LogitsMode::kNone};
  wrong.accepted_draft = {9, 11};
  absl::StatusOr<StepOutput> refused = engine->Step({wrong});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("not the start of its last step's draft"),
            std::string::npos)
      << refused.status();
  StepItem all_draft{seq, {3}, LogitsMode::kNone, nullptr, 1};
  EXPECT_FALSE(engine->Step({all_draft}).ok());
  // Longer than the sliding layers keep (Tiny: a window of 16).
  StepItem too_long{seq, std::vector<int32_t>(16, 3), LogitsMode::kNone, nullptr, 15};
  absl::StatusOr<StepOutput> long_refused = engine->Step({too_long});
  ASSERT_FALSE(long_refused.ok());
  EXPECT_NE(long_refused.status().message().find("sliding window of 16"), std::string::npos)
      << long_refused.status();
  EXPECT_EQ(*engine->SequenceLength(seq), 4);  // nothing changed

  StepItem accepted{seq, {3}, LogitsMode::kNone};
  accepted.accepted_draft = {9, 10};
  ASSERT_TRUE(engine->Step({accepted}).ok());
  EXPECT_EQ(*engine->SequenceLength(seq), 7);
  EXPECT_EQ(engine->KvFreeBlocks(), free_before);  // the draft's blocks were reused
  // The draft is gone once a step ran without accepting it.
  StepItem late{seq, {4}, LogitsMode::kNone};
  late.accepted_draft = {11};
  EXPECT_FALSE(engine->Step({late}).ok());

  std::unordered_set<int64_t> seen;
  absl::Status no_verifier = CheckStepItem(drafted, true, c.vocab_size, &seen);
  EXPECT_EQ(no_verifier.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(no_verifier.message().find("does not verify drafts"), std::string::npos);
  ASSERT_TRUE(engine->FreeSequence(seq).ok());
  EXPECT_EQ(engine->KvFreeBlocks(), engine->KvTotalBlocks());
}

// The same token whether the logits of a position come from a drafted
// chunk or a step of its own: greedy verification is exact on this engine.
TEST(DraftedStepTest, VerifiedRowsAreTheRowsOfSingleSteps) {
  const ModelConfig c = ModelConfig::Tiny();
  std::unique_ptr<CpuEngine> engine = TinyEngine(4);
  ASSERT_NE(engine, nullptr);
  const std::vector<int32_t> prompt = {11, 22, 33, 44, 55};
  const std::vector<int32_t> draft = {66, 77, 88};
  // One token at a time.
  const int64_t one = engine->NewSequence();
  ASSERT_TRUE(engine->Step({StepItem{one, prompt, LogitsMode::kNone}}).ok());
  std::vector<float> want;
  std::vector<int32_t> feed = {99};
  feed.insert(feed.end(), draft.begin(), draft.end());
  for (int32_t t : feed) {
    absl::StatusOr<StepOutput> o = engine->Step({StepItem{one, {t}, LogitsMode::kLast}});
    ASSERT_TRUE(o.ok()) << o.status();
    want.insert(want.end(), o->logits[0].begin(), o->logits[0].end());
  }
  // The same positions as one drafted chunk.
  const int64_t chunk = engine->NewSequence();
  ASSERT_TRUE(engine->Step({StepItem{chunk, prompt, LogitsMode::kNone}}).ok());
  absl::StatusOr<StepOutput> o =
      engine->Step({StepItem{chunk, feed, LogitsMode::kLast, nullptr, 3}});
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_EQ(o->logits[0].size(), want.size());
  for (size_t r = 0; r < feed.size(); ++r) {
    EXPECT_EQ(Argmax(o->logits[0].data() + r * c.vocab_size, c.vocab_size),
              Argmax(want.data() + r * c.vocab_size, c.vocab_size))
        << "row " << r;
  }
}

// ---- the serving loop on CPU engines ----

ServeOptions Speculating(int tokens, SpeculativeCounts* counts = nullptr,
                         SpeculativeMethod method = SpeculativeMethod::kNgram) {
  ServeOptions o;
  o.max_batch_tokens = 32;
  o.speculative.method = method;
  o.speculative.num_tokens = tokens;
  o.counts = counts;
  return o;
}

// Without speculation: no drafter and no grammar-forced drafts.
ServeOptions Plain() {
  ServeOptions o;
  o.max_batch_tokens = 32;
  o.grammar_drafts = false;
  return o;
}

Updates Serve(const std::vector<cluster::SubmitSequence>& submits, int world,
              const ServeOptions& options, const ModelWeights* weights = nullptr) {
  return OnLocalRanks(world, [&](int rank, comm::Communicator* comm) {
    return resume_testing::ServeCpuRank(submits, world, rank, comm, options, weights);
  });
}

// Per request id: its tokens, and the last update (its finish).
std::map<uint64_t, std::vector<int32_t>> TokensById(const Updates& updates) {
  std::map<uint64_t, std::vector<int32_t>> by_id;
  for (const cluster::SequenceUpdate& u : updates) {
    EXPECT_NE(u.finish_reason(), common::ERROR) << u.error();
    auto& tokens = by_id[u.request_id()];
    tokens.insert(tokens.end(), u.token_ids().begin(), u.token_ids().end());
  }
  return by_id;
}

// A prompt that repeats itself, and a logit bias that keeps the output to
// its tokens (a random model's output over a large vocabulary hardly ever
// repeats on its own): prompt lookup finds what to draft, and the model's
// own logits choose among them.
cluster::SubmitSequence Repetitive(uint64_t id, uint32_t max_tokens, int32_t base = 1000) {
  cluster::SubmitSequence s = Request(max_tokens);
  s.set_request_id(id);
  s.clear_prompt_ids();
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 9; ++i) s.add_prompt_ids(base + 37 * i);
  }
  for (int i = 0; i < 9; ++i) (*s.mutable_sampling()->mutable_logit_bias())[base + 37 * i] = 50.0f;
  return s;
}

void ExpectSameWithAndWithout(const std::vector<cluster::SubmitSequence>& submits, int world,
                              const ModelWeights* weights = nullptr,
                              SpeculativeCounts* counts = nullptr,
                              SpeculativeMethod method = SpeculativeMethod::kNgram) {
  const auto want = TokensById(Serve(submits, world, Plain(), weights));
  ASSERT_EQ(want.size(), submits.size());
  for (int k : {1, 4}) {
    SCOPED_TRACE(testing::Message() << k << " speculative tokens");
    SpeculativeCounts got_counts;
    EXPECT_EQ(TokensById(Serve(submits, world, Speculating(k, &got_counts, method), weights)),
              want);
    EXPECT_GT(got_counts.drafted, 0u);
    EXPECT_LE(got_counts.accepted, got_counts.drafted);
    if (counts != nullptr) *counts = got_counts;
  }
}

class SpeculativeServeTest : public ::testing::TestWithParam<int> {};  // ranks

TEST_P(SpeculativeServeTest, GreedyTokensAreThoseWithoutSpeculation) {
  ExpectSameWithAndWithout({Repetitive(1, 24), Repetitive(2, 17, 3000)}, GetParam());
}

TEST_P(SpeculativeServeTest, SeededAndPenalisedRequestsAreThoseWithoutSpeculation) {
  ExpectSameWithAndWithout(
      {resume_testing::Seeded(Repetitive(1, 20), 77),
       resume_testing::Penalised(Repetitive(2, 20, 2000)),
       resume_testing::Seeded(resume_testing::Penalised(Repetitive(3, 16)), 5)},
      GetParam());
}

// Suffix decoding: the request's own prompt and output are searched (the
// recent outputs are empty in a fresh scheduler's memory).
TEST_P(SpeculativeServeTest, SuffixDecodingGivesTheTokensWithoutSpeculation) {
  ExpectSameWithAndWithout({Repetitive(1, 24), resume_testing::Seeded(Repetitive(2, 17, 3000), 9)},
                           GetParam(), nullptr, nullptr, SpeculativeMethod::kSuffix);
}

// An EAGLE3 head of random weights for the test model (synthetic:eagle3's,
// embedding with the target's), loaded once.
std::shared_ptr<const Eagle3Head> TestHead() {
  static const std::shared_ptr<const Eagle3Head> head = [] {
    const std::string dir = ::testing::TempDir() + "/flotilla_speculative_test_eagle3";
    EXPECT_TRUE(WriteSyntheticEagle3Head(dir, TestModel(), 7).ok());
    absl::StatusOr<std::unique_ptr<Eagle3Head>> loaded = LoadEagle3Head(dir, TestModel());
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    if (!loaded.ok()) return std::shared_ptr<const Eagle3Head>();
    const ModelWeights& w = resume_testing::WeightsOf(1, 0);
    EXPECT_TRUE((*loaded)->UseTargetEmbedding(w.embed, w.keepalive).ok());
    return std::shared_ptr<const Eagle3Head>(*std::move(loaded));
  }();
  return head;
}

// EAGLE3: the leader's engine returns the head's layers' states, the head
// drafts on the host, verification keeps the tokens of a run without
// speculation (greedy, seeded, penalised).
TEST_P(SpeculativeServeTest, Eagle3GivesTheTokensWithoutSpeculation) {
  const std::vector<cluster::SubmitSequence> submits = {
      Repetitive(1, 20), resume_testing::Seeded(Repetitive(2, 17, 3000), 9),
      resume_testing::Penalised(Repetitive(3, 16, 2000))};
  const auto want = TokensById(Serve(submits, GetParam(), Plain()));
  ASSERT_EQ(want.size(), submits.size());
  for (int k : {1, 4}) {
    SCOPED_TRACE(testing::Message() << k << " speculative tokens");
    DraftMemory memory;
    memory.eagle3 = TestHead();
    ASSERT_NE(memory.eagle3, nullptr);
    SpeculativeCounts counts;
    ServeOptions options = Speculating(k, &counts, SpeculativeMethod::kEagle3);
    options.draft_memory = &memory;
    EXPECT_EQ(TokensById(Serve(submits, GetParam(), options)), want);
    EXPECT_GT(counts.drafted, 0u);
    EXPECT_GT(counts.verify_steps, 0u);
    EXPECT_LE(counts.accepted, counts.drafted);
  }
}

// Without a head, a request choosing eagle3 is refused, saying what to start
// the worker with.
TEST(SpeculativeEagle3Test, WithoutAHeadTheRequestIsRefused) {
  cluster::SubmitSequence s = Repetitive(1, 8);
  s.mutable_sampling()->mutable_speculative()->set_method("eagle3");
  const Updates got = Serve({s}, 1, Plain());
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got.back().finish_reason(), common::ERROR);
  EXPECT_EQ(got.back().error_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(got.back().error().find("--speculative-model"), std::string::npos)
      << got.back().error();
}

INSTANTIATE_TEST_SUITE_P(Ranks, SpeculativeServeTest, ::testing::Values(1, 2),
                         [](const auto& info) {
                           return info.param == 1 ? "OneRank" : "TensorParallel2";
                         });

// The text of the final message of a constrained turn's tokens.
std::string FinalText(const std::vector<int32_t>& tokens) {
  constexpr int32_t kMessage = 200008;  // <|message|>
  auto vocabulary = resume_testing::Vocabulary()();
  EXPECT_TRUE(vocabulary.ok()) << vocabulary.status();
  if (!vocabulary.ok()) return "";
  auto from = std::find(tokens.rbegin(), tokens.rend(), kMessage).base();
  std::string text;
  for (auto it = from; it != tokens.end(); ++it) text += vocabulary->index->vocab().bytes[*it];
  return text;
}

TEST(SpeculativeStructuredTest, JsonOutputStaysValid) {
  // Biases that lead the random model through a short JSON body and its
  // end (the grammar decides which of them may come where); the body
  // repeats its punctuation, so prompt lookup drafts inside it, and many
  // drafts are tokens the grammar refuses at that point.
  std::vector<cluster::SubmitSequence> submits;
  const std::vector<std::pair<std::string, float>> biases = {{"{", 60}, {"\"", 70}, {":", 60},
                                                             {"}", 60}, {",", 55},  {"name", 50},
                                                             {"n", 50}, {"1", 50},  {"a", 40}};
  for (uint64_t id = 1; id <= 2; ++id) {
    cluster::SubmitSequence s = resume_testing::Constrained(
        resume_testing::Seeded(Repetitive(id, 48, 1000 + 100 * id), id));
    s.mutable_sampling()->set_temperature(0.7f);
    auto& bias = *s.mutable_sampling()->mutable_logit_bias();
    for (const auto& [text, b] : biases) {
      const int32_t token = resume_testing::TokenOf(text);
      ASSERT_GE(token, 0) << text;
      bias[token] = b;
    }
    bias[200002] = 60;  // <|return|>, once the grammar allows it
    submits.push_back(s);
  }
  SpeculativeCounts counts;
  const auto want = TokensById(Serve(submits, 1, Plain()));
  const Updates got = Serve(submits, 1, Speculating(4, &counts));
  EXPECT_EQ(TokensById(got), want);
  EXPECT_GT(counts.drafted, 0u);
  int finished = 0;
  for (const cluster::SequenceUpdate& u : got) {
    if (u.finish_reason() != common::STOP) continue;
    ++finished;
    const std::string text = FinalText(want.at(u.request_id()));
    const nlohmann::json body = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(body.is_discarded()) << "not JSON: " << text;
    EXPECT_TRUE(body.contains("name") && body.contains("n")) << text;
  }
  EXPECT_GT(finished, 0) << "no request finished its JSON";
  std::cout << "drafted " << counts.drafted << ", accepted " << counts.accepted << "\n";
}

TEST(SpeculativeKvTest, BlocksComeBackAfterManyRequests) {
  // 1,000 short requests queued at once on one engine (as many running as
  // the KV blocks allow); ServeCpuRank checks that every block is free at the end.
  std::vector<cluster::SubmitSequence> submits;
  for (uint64_t id = 1; id <= 1000; ++id) {
    cluster::SubmitSequence s = Repetitive(id, 6, 10 + static_cast<int32_t>(id % 50) * 13);
    s.mutable_prompt_ids()->Truncate(10 + id % 9);
    submits.push_back(s);
  }
  ModelConfig c = ModelConfig::Tiny();
  absl::StatusOr<ModelWeights> w = MakeSyntheticWeights(c, 3, ShardSpec{});
  ASSERT_TRUE(w.ok()) << w.status();
  ServeOptions o = Speculating(3);
  SpeculativeCounts counts;
  o.counts = &counts;
  o.max_sequences = 250;  // the queue holds 4 x this
  o.max_batch_tokens = 64;
  o.max_steps = 100000;
  for (auto& s : submits) s.mutable_sampling()->set_ignore_eos(true);
  const auto got = TokensById(Serve(submits, 1, o, &*w));
  ASSERT_EQ(got.size(), submits.size());
  for (const auto& [id, tokens] : got) EXPECT_EQ(tokens.size(), 6u) << id;
  EXPECT_GT(counts.verify_steps, 0u);
}

// Asked for more drafted tokens than a sliding window of 16 keeps, the
// scheduler drafts at most 14 (the engine would refuse more), and the
// tokens are still those of a run without speculation.
TEST(SpeculativeKvTest, DraftsStayWithinTheSlidingWindow) {
  absl::StatusOr<ModelWeights> w = MakeSyntheticWeights(ModelConfig::Tiny(), 3, ShardSpec{});
  ASSERT_TRUE(w.ok()) << w.status();
  cluster::SubmitSequence s = Repetitive(1, 40, 10);
  s.mutable_sampling()->set_ignore_eos(true);
  SpeculativeCounts counts;
  const auto want = TokensById(Serve({s}, 1, Plain(), &*w));
  EXPECT_EQ(TokensById(Serve({s}, 1, Speculating(16, &counts), &*w)), want);
  EXPECT_GT(counts.drafted, 0u);
}

// ---- drafters that remember: suffix decoding's recent outputs, replay ----

// A prompt of distinct tokens (nothing in it repeats, so only what an earlier
// request produced can be drafted).
cluster::SubmitSequence Plainly(uint64_t id, uint32_t max_tokens, int32_t base) {
  cluster::SubmitSequence s = Request(max_tokens);
  s.set_request_id(id);
  s.clear_prompt_ids();
  for (int i = 0; i < 12; ++i) s.add_prompt_ids(base + 31 * i);
  s.mutable_sampling()->set_ignore_eos(true);
  return s;
}

// Replay: a first pass records the outputs (speculation off: a worker that
// allows replay records every deterministic request), a second drafts them
// with errors; its tokens are the first pass's, drafts are accepted up to
// the first wrong one, and the acceptance length is about what the error
// rate gives.
TEST(SpeculativeReplayTest, ReplaysRecordedOutputsWithTheChosenErrors) {
  DraftMemory memory;
  std::vector<cluster::SubmitSequence> submits = {
      Plainly(1, 40, 100), resume_testing::Seeded(Plainly(2, 40, 5000), 3), Plainly(3, 40, 9000)};
  ServeOptions record = Plain();
  record.speculative.allow_replay = true;
  record.draft_memory = &memory;
  const auto want = TokensById(Serve(submits, 1, record));
  EXPECT_EQ(memory.recordings.size(), submits.size());
  for (double rate : {0.0, 0.3}) {
    SCOPED_TRACE(rate);
    SpeculativeCounts counts;
    ServeOptions replay = Speculating(3, &counts, SpeculativeMethod::kReplay);
    replay.speculative.allow_replay = true;
    replay.speculative.replay_error_rate = rate;
    replay.draft_memory = &memory;
    EXPECT_EQ(TokensById(Serve(submits, 1, replay)), want);
    ASSERT_GT(counts.verify_steps, 0u);
    const double length = 1.0 + static_cast<double>(counts.accepted) / counts.verify_steps;
    if (rate == 0.0) {
      EXPECT_EQ(counts.accepted, counts.drafted) << "every recorded token is the model's";
    } else {
      EXPECT_NEAR(length, ExpectedReplayAcceptanceLength(rate, 3), 0.5);
    }
  }
}

// A request of the same prompt as a finished one drafts its output from the
// recent outputs (suffix decoding's global index), with the same tokens.
TEST(SpeculativeSuffixTest, RecentOutputsAreDrafted) {
  DraftMemory memory;
  const std::vector<cluster::SubmitSequence> first = {Plainly(1, 30, 700)};
  SpeculativeCounts counts;
  ServeOptions suffix = Speculating(4, &counts, SpeculativeMethod::kSuffix);
  suffix.draft_memory = &memory;
  const auto want = TokensById(Serve(first, 1, Plain()));
  EXPECT_EQ(TokensById(Serve(first, 1, suffix)), want);
  EXPECT_GT(memory.recent_outputs.tokens(), 0);
  counts = {};
  cluster::SubmitSequence again = Plainly(2, 30, 700);
  const auto got = TokensById(Serve({again}, 1, suffix));
  EXPECT_EQ(got.at(2), want.at(1));
  EXPECT_GT(counts.accepted, counts.drafted / 2) << "the recent output is the model's own";
}

// Past --speculative-max-batch decoding sequences nothing is drafted; at or
// under it drafting goes on; the tokens are the same either way.
TEST(SpeculativeMaxBatchTest, LargeBatchesDraftNothing) {
  // The three prompts are prefilled in one step and, ending only at their
  // length, decode together to the end.
  std::vector<cluster::SubmitSequence> submits = {Repetitive(1, 20), Repetitive(2, 20, 3000),
                                                  Repetitive(3, 20, 5000)};
  for (cluster::SubmitSequence& s : submits) s.mutable_sampling()->set_ignore_eos(true);
  ServeOptions plain = Plain();
  plain.max_batch_tokens = 128;
  const auto want = TokensById(Serve(submits, 1, plain));
  for (int64_t max_batch : {2, 3}) {
    SCOPED_TRACE(max_batch);
    SpeculativeCounts counts;
    ServeOptions o = Speculating(3, &counts);
    o.max_batch_tokens = 128;
    o.speculative_max_batch = max_batch;
    EXPECT_EQ(TokensById(Serve(submits, 1, o)), want);
    if (max_batch == 2) {
      EXPECT_EQ(counts.drafted, 0u);
    } else {
      EXPECT_GT(counts.drafted, 0u);
    }
  }
}

// The governor drafts where its measured steps say drafting pays and stops
// where they say it does not, the tokens unchanged either way. Steps are timed
// by a simulated clock: a plain decode step costs 1 ms; a drafted one 1 ms
// plus `per_drafted_us` for each drafted token.
TEST(SpeculationGovernorServeTest, DraftsOnlyWhereTheMeasuredStepsSayItPays) {
  std::vector<cluster::SubmitSequence> submits = {Repetitive(1, 80), Repetitive(2, 80, 3000)};
  for (cluster::SubmitSequence& s : submits) s.mutable_sampling()->set_ignore_eos(true);
  ServeOptions plain = Plain();
  plain.max_batch_tokens = 128;
  const auto want = TokensById(Serve(submits, 1, plain));
  struct Run {
    int64_t per_drafted_us;
    int drafted_steps = 0, decode_steps = 0;
    int drafted_steps_of_two = 0;  // with both requests decoding
  };
  for (Run run : {Run{0}, Run{5000}}) {
    SCOPED_TRACE(run.per_drafted_us);
    SpeculativeCounts counts;
    ServeOptions o = Speculating(3, &counts);
    o.max_batch_tokens = 128;
    o.speculative_governor = true;
    o.step_micros = [&run](const cluster::StepPlan& plan) {
      int64_t drafted = 0;
      for (const cluster::PlanItem& item : plan.items()) drafted += item.draft_tokens();
      ++run.decode_steps;
      if (drafted > 0) ++run.drafted_steps;
      if (drafted > 0 && plan.items_size() == 2) ++run.drafted_steps_of_two;
      return 1000 + run.per_drafted_us * drafted;
    };
    EXPECT_EQ(TokensById(Serve(submits, 1, o)), want);
    if (run.per_drafted_us == 0) {
      // Free drafts: after its few plain measurements the bucket drafts.
      EXPECT_GE(run.drafted_steps, run.decode_steps / 2) << run.decode_steps;
      EXPECT_GT(counts.accepted, 0u);
    } else {
      // Drafts that cost five steps each: at the batch of 2 the first
      // measured drafted steps (each of the 3 draft lengths in kMinSamples
      // steps and kMinSequences sequences) and the exploring ones are all
      // there is.
      const int64_t measured = std::max<int64_t>(SpeculationGovernor::kMinSamples,
                                                 SpeculationGovernor::kMinSequences / 2);
      const int64_t exploring = run.decode_steps / SpeculationGovernor::kExploreEvery + 1;
      EXPECT_GT(run.drafted_steps, 0);
      EXPECT_LE(run.drafted_steps_of_two, 3 * measured + exploring) << run.decode_steps;
      EXPECT_LT(run.drafted_steps, run.decode_steps / 2) << run.decode_steps;
    }
  }
}

// ---- the golden fixtures and the demo model ----

TEST(SpeculativeGoldenTest, GreedyTokensMatchTheFixtures) {
  const std::vector<std::string> fixtures = testing_golden::Fixtures();
  ASSERT_FALSE(fixtures.empty()) << "no fixtures under " << testing_golden::GoldenDir();
  for (const std::string& name : fixtures) {
    SCOPED_TRACE(name);
    absl::StatusOr<testing_golden::LoadedFixture> f = testing_golden::LoadFixture(name);
    ASSERT_TRUE(f.ok()) << f.status();
    std::vector<cluster::SubmitSequence> submits;
    std::vector<std::vector<int32_t>> greedy;
    for (size_t i = 0; i < f->golden["prompts"].size(); ++i) {
      cluster::SubmitSequence s;
      s.set_request_id(i + 1);
      for (int32_t t : f->golden["prompts"][i].get<std::vector<int32_t>>()) s.add_prompt_ids(t);
      greedy.push_back(f->golden["greedy"][i].get<std::vector<int32_t>>());
      s.mutable_sampling()->set_temperature(0.0f);
      s.mutable_sampling()->set_ignore_eos(true);
      s.mutable_sampling()->set_max_tokens(static_cast<uint32_t>(greedy.back().size()));
      submits.push_back(s);
    }
    for (const ServeOptions& o : {Plain(), Speculating(2), Speculating(5)}) {
      const auto got = TokensById(Serve(submits, 1, o, &f->weights));
      for (size_t i = 0; i < submits.size(); ++i) EXPECT_EQ(got.at(i + 1), greedy[i]) << i;
    }
  }
}

TEST(SpeculativeDemoTest, RepetitiveOutputAcceptsManyTokens) {
  absl::StatusOr<std::unique_ptr<ModelSource>> source = ModelSource::Open("synthetic:demo");
  ASSERT_TRUE(source.ok()) << source.status();
  absl::StatusOr<ModelWeights> w = (*source)->LoadShard(ShardSpec{});
  ASSERT_TRUE(w.ok()) << w.status();
  SpeculativeCounts counts;
  ExpectSameWithAndWithout({Repetitive(1, 48), Repetitive(2, 48, 20000)}, 1, &*w, &counts);
  std::cout << "demo model: drafted " << counts.drafted << ", accepted " << counts.accepted
            << " in " << counts.verify_steps << " verification steps\n";
  // Drafted tokens accepted per verification step of a 4-token draft.
  EXPECT_GE(static_cast<double>(counts.accepted) / counts.verify_steps, 2.0);
}

}  // namespace
}  // namespace flotilla::worker
