// What the request-migration tests share (resume_test.cc on CPU engines,
// speculative_test.cc's serving runs too,
// resume_cuda_test.cc on the GPU engine): the model, the leader's serving
// loop of WorkerRuntime (Scheduler plans, StepExecutor exchanges and runs,
// Scheduler completes) over any engine, the test requests, and the check
// that a request resumed after k of its tokens streams exactly the tokens
// k.. of an undisturbed run.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "comm/local/local_communicator.h"
#include "common/expert_map.h"
#include "common/parallel_config.h"
#include "proto/cluster.pb.h"
#include "worker/constraint_filter.h"
#include "worker/engine/cpu_engine.h"
#include "worker/engine/engine.h"
#include "worker/model/synthetic_weights.h"
#include "worker/parallel/host_context.h"
#include "worker/parallel/parallel_context.h"
#include "worker/scheduler.h"
#include "worker/step_executor.h"

namespace flotilla::worker::resume_testing {

using Updates = std::vector<cluster::SequenceUpdate>;
// Runs a request to its end on a fresh instance; the leader's updates for it.
using ServeFn = std::function<Updates(const cluster::SubmitSequence&)>;

// A tiny model with the o200k vocabulary and end tokens, so structured
// outputs work.
// Runs `serve(rank, comm)` on `world` ranks, each in a thread over
// comm/local (one rank: in this thread, no communicator), and returns rank
// 0's updates (the leader's).
inline Updates OnLocalRanks(int world,
                            const std::function<Updates(int, comm::Communicator*)>& serve) {
  if (world == 1) return serve(0, nullptr);
  auto rendezvous = *comm::LocalRendezvous::Create(world);
  Updates leader;
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      auto comm = comm::LocalCommunicator::Create(rendezvous, r, {absl::Seconds(30)});
      ASSERT_TRUE(comm.ok()) << comm.status();
      Updates got = serve(r, comm->get());
      if (r == 0) leader = std::move(got);
    });
  }
  for (std::thread& t : ranks) t.join();
  return leader;
}

inline ModelConfig TestModel() {
  ModelConfig c = ModelConfig::Tiny();
  c.vocab_size = 201088;
  c.eos_token_ids = {200002, 200012};
  c.pad_token_id = 199999;
  return c;
}

inline ExpertMap MapFor(int world) {
  const ModelConfig c = TestModel();
  return *ExpertMap::Contiguous(c.num_hidden_layers, c.num_local_experts, world);
}

// The host context of `comm`'s rank in a tensor-parallel CPU instance of
// `world` ranks of model `c`; null without a communicator (one rank needs
// none) or when it cannot be made (the test then fails).
inline std::unique_ptr<parallel::ParallelContext> HostContextFor(const ModelConfig& c, int world,
                                                                 comm::Communicator* comm) {
  if (comm == nullptr) return nullptr;
  parallel::ContextOptions po;
  po.hidden = c.hidden_size;
  po.top_k = c.num_experts_per_tok;
  po.max_tokens_per_step = 64;
  auto made = parallel::CreateHostContext(*ParallelConfig::Create(world, world, c), MapFor(world),
                                          comm, po);
  EXPECT_TRUE(made.ok()) << made.status();
  if (!made.ok()) return nullptr;
  return *std::move(made);
}

// The weights of rank `rank` of a tensor-parallel instance of `world`, made once.
inline ModelWeights WeightsOf(int world, int rank) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, ModelWeights> made;
  std::lock_guard<std::mutex> lock(mu);
  auto it = made.find({world, rank});
  if (it != made.end()) return it->second;
  ShardSpec spec;
  spec.tp_rank = rank;
  spec.tp_size = world;
  spec.experts = MapFor(world).ExpertsOnRank(0, rank);
  absl::StatusOr<ModelWeights> w = MakeSyntheticWeights(TestModel(), 5, spec);
  EXPECT_TRUE(w.ok()) << w.status();
  return made.emplace(std::make_pair(world, rank), *std::move(w)).first->second;
}

inline VocabularyProvider Vocabulary() {
  static const VocabularyProvider provider = LazyO200kVocabulary(TestModel().vocab_size);
  return provider;
}

// How ServeOnRank's leader schedules (speculative_test.cc varies it).
struct ServeOptions {
  int64_t max_batch_tokens = 8;  // a resumed context is prefilled in chunks
  int64_t max_sequences = 4;
  SpeculativeConfig speculative;      // the worker's default
  int64_t speculative_max_batch = 0;  // SchedulerLimits'
  bool speculative_governor = false;  // SchedulerLimits'
  bool grammar_drafts = true;         // SchedulerLimits'
  // Not null: the leader's steps are timed by a simulated clock that each
  // step advances by what this returns for its plan (microseconds).
  std::function<int64_t(const cluster::StepPlan&)> step_micros;
  DraftMemory* draft_memory = nullptr;  // not null: shared with other runs (replay, suffix)
  SpeculativeCounts* counts = nullptr;  // not null: the leader's counts at the end
  int max_steps = 1000;
};

// One rank's serving loop until the instance is idle: the leader (rank 0)
// plans `submits`, every rank exchanges and steps. The leader's updates.
inline Updates ServeOnRank(Engine& engine, comm::Communicator* comm,
                           parallel::ParallelContext* context, int world, int rank,
                           const std::vector<cluster::SubmitSequence>& submits,
                           const ServeOptions& options = {}) {
  const ParallelConfig parallel = *ParallelConfig::Create(world, world, engine.config());
  StepExecutor executor(&engine, comm, context, parallel, rank, MapFor(world).version());
  std::unique_ptr<Scheduler> scheduler;
  cluster::TokenBatch out;
  int64_t now_us = 0;  // the simulated step clock (options.step_micros)
  if (executor.leader()) {
    const SchedulerLimits limits{.max_batch_tokens = options.max_batch_tokens,
                                 .max_sequences = options.max_sequences,
                                 .max_model_len = 0,
                                 .prefill = {},
                                 .speculative = options.speculative,
                                 .speculative_max_batch = options.speculative_max_batch,
                                 .speculative_governor = options.speculative_governor,
                                 .grammar_drafts = options.grammar_drafts};
    scheduler = std::make_unique<Scheduler>(
        &engine, limits, [] { return uint64_t{1000}; },
        engine.config().vocab_size == TestModel().vocab_size ? Vocabulary() : nullptr,
        options.draft_memory);
    if (options.step_micros) scheduler->set_step_clock([&now_us] { return now_us; });
    for (const cluster::SubmitSequence& submit : submits) scheduler->Enqueue(submit, &out);
  }
  StepExecutor::SamplerLookup sampler_for;
  if (scheduler) sampler_for = [&](const cluster::PlanItem& i) { return scheduler->SamplerFor(i); };
  for (int step = 0; step < options.max_steps; ++step) {
    cluster::StepPlan mine;
    if (scheduler) mine = scheduler->Plan(&out);
    absl::StatusOr<StepExecutor::Exchanged> exchanged = executor.Exchange(mine);
    EXPECT_TRUE(exchanged.ok()) << exchanged.status();
    if (!exchanged.ok() || !exchanged->any_work) break;
    absl::StatusOr<std::optional<StepOutput>> result = executor.Run(exchanged->plan, sampler_for);
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) break;
    if (options.step_micros) now_us += options.step_micros(exchanged->plan);
    if (scheduler && result->has_value()) scheduler->Complete(exchanged->plan, **result, &out);
  }
  if (scheduler && options.counts != nullptr) *options.counts = scheduler->speculative_counts();
  return {out.updates().begin(), out.updates().end()};
}

inline Updates ServeOnRank(Engine& engine, comm::Communicator* comm,
                           parallel::ParallelContext* context, int world, int rank,
                           const cluster::SubmitSequence& submit) {
  return ServeOnRank(engine, comm, context, world, rank,
                     std::vector<cluster::SubmitSequence>{submit});
}

// Rank `rank` of a fresh CPU instance of `world` ranks of `weights` (null:
// the tiny test model's shards) serving `submits`, with KV for
// `kv_positions` positions of 4 sequences; every KV block is back at the end.
inline Updates ServeCpuRank(const std::vector<cluster::SubmitSequence>& submits, int world,
                            int rank, comm::Communicator* comm, const ServeOptions& options,
                            const ModelWeights* weights = nullptr, int64_t kv_positions = 256) {
  const ModelConfig c = weights ? weights->config : TestModel();
  std::unique_ptr<parallel::ParallelContext> context = HostContextFor(c, world, comm);
  if (comm != nullptr && context == nullptr) return {};
  CpuEngineOptions eo;
  eo.kv_block_size = 4;
  eo.kv_num_blocks = CpuEngine::KvBlocksFor(c, c.num_key_value_heads, 4, 4, kv_positions);
  absl::StatusOr<std::unique_ptr<CpuEngine>> engine =
      CpuEngine::Create(weights ? *weights : WeightsOf(world, rank), eo, nullptr, context.get());
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  if (options.draft_memory != nullptr && options.draft_memory->eagle3 != nullptr) {
    EXPECT_TRUE((*engine)->SetHiddenCapture(options.draft_memory->eagle3->config.aux_layers).ok());
  }
  Updates got = ServeOnRank(**engine, comm, context.get(), world, rank, submits, options);
  // Every KV block is back (cached prefixes count as free: evictable).
  EXPECT_EQ((*engine)->KvFreeBlocks(), (*engine)->KvTotalBlocks());
  return got;
}

inline std::vector<int32_t> TokensOf(const Updates& updates) {
  std::vector<int32_t> tokens;
  for (const cluster::SequenceUpdate& u : updates) {
    tokens.insert(tokens.end(), u.token_ids().begin(), u.token_ids().end());
  }
  return tokens;
}

// A greedy request of `max_tokens`.
inline cluster::SubmitSequence Request(uint32_t max_tokens) {
  cluster::SubmitSequence s;
  s.set_request_id(7);
  for (int i = 0; i < 11; ++i) s.add_prompt_ids(1000 + 37 * i);
  s.mutable_sampling()->set_max_tokens(max_tokens);
  s.mutable_sampling()->set_temperature(0.0f);
  return s;
}

inline cluster::SubmitSequence Seeded(cluster::SubmitSequence s, uint64_t seed) {
  s.mutable_sampling()->set_temperature(1.0f);
  s.mutable_sampling()->set_top_p(0.9f);
  s.mutable_sampling()->set_seed(seed);
  return s;
}

inline cluster::SubmitSequence Penalised(cluster::SubmitSequence s) {
  common::SamplingParams* p = s.mutable_sampling();
  p->set_frequency_penalty(1.5f);
  p->set_presence_penalty(0.5f);
  p->set_repetition_penalty(1.6f);
  p->set_min_tokens(12);
  return s;
}

// The final message is JSON of a small schema.
inline cluster::SubmitSequence Constrained(cluster::SubmitSequence s) {
  cluster::OutputConstraint* c = s.mutable_constraint();
  c->set_json_final(true);
  c->set_final_schema_json(
      R"({"type":"object","properties":{"name":{"type":"string"},"n":{"type":"integer"}},)"
      R"("required":["name","n"]})");
  return s;
}

// The id of the ordinary token whose bytes are `text` (-1: none).
inline int32_t TokenOf(const std::string& text) {
  absl::StatusOr<ConstraintVocabulary> vocabulary = Vocabulary()();
  EXPECT_TRUE(vocabulary.ok()) << vocabulary.status();
  if (!vocabulary.ok()) return -1;
  const std::vector<std::string>& bytes = vocabulary->index->vocab().bytes;
  auto it = std::find(bytes.begin(), bytes.end(), text);
  return it == bytes.end() ? -1 : static_cast<int32_t>(it - bytes.begin());
}

// Constrained with a reasoning budget of `budget` tokens, and a logit bias
// that makes the turn open an analysis message (and fill it) first.
inline cluster::SubmitSequence Reasoning(cluster::SubmitSequence s, uint32_t budget) {
  s = Constrained(std::move(s));
  s.mutable_constraint()->set_reasoning_budget(budget);
  (*s.mutable_sampling()->mutable_logit_bias())[TokenOf("analysis")] = 100.0f;
  return s;
}

inline cluster::SubmitSequence ResumedAfter(cluster::SubmitSequence s,
                                            const std::vector<int32_t>& tokens, size_t k) {
  s.mutable_resume()->mutable_output_ids()->Add(tokens.begin(), tokens.begin() + k);
  return s;
}

// Serves `submit` undisturbed, then resumed after k tokens for each k, and
// checks that each continuation is the rest of the undisturbed run, with the
// same finish and counts.
inline void ExpectResumedRunsContinueExactly(const ServeFn& serve,
                                             const cluster::SubmitSequence& submit,
                                             const std::vector<size_t>& ks) {
  const Updates whole = serve(submit);
  ASSERT_FALSE(whole.empty());
  const cluster::SequenceUpdate& end = whole.back();
  ASSERT_NE(end.finish_reason(), common::ERROR) << end.error();
  const std::vector<int32_t> tokens = TokensOf(whole);
  for (size_t k : ks) {
    ASSERT_LT(k, tokens.size()) << "the undisturbed run stopped early";
    SCOPED_TRACE(testing::Message() << "resumed after " << k << " of " << tokens.size());
    const Updates rest = serve(ResumedAfter(submit, tokens, k));
    ASSERT_FALSE(rest.empty());
    // The first update carries the first new token, not the resumed ones.
    ASSERT_GT(rest.front().token_ids_size(), 0) << rest.front().error();
    EXPECT_EQ(rest.front().token_ids(0), tokens[k]);
    EXPECT_EQ(rest.front().completion_tokens(), k + 1);
    EXPECT_EQ(TokensOf(rest), std::vector<int32_t>(tokens.begin() + k, tokens.end()));
    EXPECT_EQ(rest.back().finish_reason(), end.finish_reason());
    EXPECT_EQ(rest.back().completion_tokens(), end.completion_tokens());
    EXPECT_EQ(rest.back().prompt_tokens(), static_cast<uint32_t>(submit.prompt_ids_size()));
  }
}

// max_tokens counts the resumed output: resumed one token short of it, a
// request draws that token and ends with LENGTH.
inline void ExpectMaxTokensCountsTheResumedOutput(const ServeFn& serve) {
  const cluster::SubmitSequence s = Request(12);
  const Updates whole = serve(s);
  const std::vector<int32_t> tokens = TokensOf(whole);
  ASSERT_EQ(tokens.size(), 12u);
  ASSERT_EQ(whole.back().finish_reason(), common::LENGTH);
  const Updates rest = serve(ResumedAfter(s, tokens, 11));
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(TokensOf(rest), std::vector<int32_t>{tokens[11]});
  EXPECT_EQ(rest[0].finish_reason(), common::LENGTH);
  EXPECT_EQ(rest[0].completion_tokens(), 12u);
}

}  // namespace flotilla::worker::resume_testing
