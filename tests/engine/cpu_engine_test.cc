#include "worker/engine/cpu_engine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <thread>
#include <vector>

#include "comm/local/local_communicator.h"
#include "common/model_spec.h"
#include "tests/engine/chunked_prefill.h"
#include "tests/engine/reference_model.h"
#include "tests/engine/small_cpu_engine.h"
#include "worker/engine/generate.h"
#include "worker/model/synthetic_shard.h"
#include "worker/model/synthetic_tensors.h"
#include "worker/model/synthetic_weights.h"
#include "worker/parallel/host_context.h"

namespace flotilla {
namespace {

// Tiny config with a window short enough that the test prompts cross it.
ModelConfig TestConfig() {
  ModelConfig c = ModelConfig::Tiny();
  c.sliding_window = 8;
  return c;
}

std::vector<int32_t> Tokens(int n, int seed, int vocab = 1024) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 7919 + seed * 104729 + 13) % vocab;
  return t;
}

std::unique_ptr<CpuEngine> MakeEngine(kernels::cpu::ThreadPool* pool, int64_t blocks = 512,
                                      ModelConfig c = TestConfig(), uint64_t seed = 1) {
  return testing_util::SmallCpuEngine(c, blocks, seed, pool);
}

// Logits of every position of `tokens`, in one prefill on a fresh sequence.
std::vector<float> Prefill(CpuEngine& e, const std::vector<int32_t>& tokens) {
  int64_t s = e.NewSequence();
  auto out = e.Step({StepItem{s, tokens, LogitsMode::kAll}});
  EXPECT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(e.FreeSequence(s).ok());
  return out->logits[0];
}

// The logits of positions [from, to) of `all` (rows of `vocab`); `to` -1:
// through the last position.
std::vector<float> Positions(const std::vector<float>& all, int64_t vocab, int64_t from,
                             int64_t to = -1) {
  return std::vector<float>(all.begin() + from * vocab,
                            to < 0 ? all.end() : all.begin() + to * vocab);
}

void ExpectNear(const std::vector<float>& a, const std::vector<float>& b, double tol) {
  ASSERT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - b[i]));
  EXPECT_LE(worst, tol);
}

TEST(CpuEngine, MatchesThePlainReferenceForward) {
  kernels::cpu::ThreadPool pool(2);
  auto e = MakeEngine(&pool);
  auto w = *MakeSyntheticWeights(TestConfig(), 1);
  std::vector<int32_t> tokens = Tokens(20, 1);
  std::vector<float> got = Prefill(*e, tokens);
  auto want = testing::ReferenceForward(w, tokens);
  const int64_t V = TestConfig().vocab_size;
  double worst = 0, scale = 0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    for (int64_t v = 0; v < V; ++v) {
      worst = std::max(worst, std::abs(got[t * V + v] - want[t][v]));
      scale = std::max(scale, std::abs(want[t][v]));
    }
  }
  EXPECT_GT(scale, 0.5);  // the logits are not trivially small
  EXPECT_LE(worst, 1e-4) << "logit scale " << scale;
}

TEST(CpuEngine, DecodingWithTheCacheEqualsRecomputing) {
  kernels::cpu::ThreadPool pool(2);
  auto e = MakeEngine(&pool);
  const int64_t V = TestConfig().vocab_size;
  std::vector<int32_t> tokens = Tokens(30, 2);
  std::vector<float> full = Prefill(*e, tokens);
  int64_t s = e->NewSequence();
  std::vector<float> got;
  auto first = e->Step({StepItem{s, {tokens.begin(), tokens.begin() + 5}, LogitsMode::kAll}});
  ASSERT_TRUE(first.ok()) << first.status();
  got = first->logits[0];
  for (size_t i = 5; i < tokens.size(); ++i) {
    auto out = e->Step({StepItem{s, {tokens[i]}, LogitsMode::kLast}});
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->logits[0].size(), static_cast<size_t>(V));
    got.insert(got.end(), out->logits[0].begin(), out->logits[0].end());
  }
  ExpectNear(got, full, 1e-4);
  EXPECT_EQ(*e->SequenceLength(s), 30);
}

TEST(CpuEngine, ChunkedPrefillEqualsOneShot) {
  kernels::cpu::ThreadPool pool(3);
  auto e = MakeEngine(&pool);
  std::vector<int32_t> tokens = Tokens(29, 3);
  std::vector<float> full = Prefill(*e, tokens);
  for (int chunk : {1, 3, 7, 16}) {
    int64_t s = e->NewSequence();
    auto got = testing_util::PrefillInChunks(*e, s, tokens, chunk);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectNear(got->logits, full, 1e-4);
    ASSERT_TRUE(e->FreeSequence(s).ok());
  }
}

TEST(CpuEngine, BatchingEqualsOneAtATime) {
  kernels::cpu::ThreadPool pool(2);
  auto e = MakeEngine(&pool);
  const int64_t V = TestConfig().vocab_size;
  std::vector<int32_t> a = Tokens(17, 4), b = Tokens(11, 5), c = Tokens(23, 6);
  std::vector<float> fa = Prefill(*e, a), fb = Prefill(*e, b), fc = Prefill(*e, c);
  int64_t sa = e->NewSequence(), sb = e->NewSequence(), sc = e->NewSequence();
  // Step 1: a prefills 16, b prefills 10, c prefills 9 (of its 23).
  auto o1 = e->Step({StepItem{sa, {a.begin(), a.begin() + 16}, LogitsMode::kLast},
                     StepItem{sb, {b.begin(), b.begin() + 10}, LogitsMode::kAll},
                     StepItem{sc, {c.begin(), c.begin() + 9}, LogitsMode::kNone}});
  ASSERT_TRUE(o1.ok()) << o1.status();
  EXPECT_TRUE(o1->logits[2].empty());
  ExpectNear(o1->logits[0], Positions(fa, V, 15, 16), 1e-4);
  ExpectNear(o1->logits[1], Positions(fb, V, 0, 10), 1e-4);
  // Step 2: a and b decode one token each while c prefills the rest.
  auto o2 = e->Step({StepItem{sc, {c.begin() + 9, c.end()}, LogitsMode::kAll},
                     StepItem{sa, {a[16]}, LogitsMode::kLast},
                     StepItem{sb, {b[10]}, LogitsMode::kLast}});
  ASSERT_TRUE(o2.ok()) << o2.status();
  ExpectNear(o2->logits[0], Positions(fc, V, 9), 1e-4);
  ExpectNear(o2->logits[1], Positions(fa, V, 16), 1e-4);
  ExpectNear(o2->logits[2], Positions(fb, V, 10), 1e-4);
}

TEST(CpuEngine, ForkedSequencesContinueIndependently) {
  kernels::cpu::ThreadPool pool(2);
  auto e = MakeEngine(&pool);
  const int64_t V = TestConfig().vocab_size;
  std::vector<int32_t> prefix = Tokens(13, 7);
  int64_t s = e->NewSequence();
  ASSERT_TRUE(e->Step({StepItem{s, prefix, LogitsMode::kNone}}).ok());
  int64_t f = *e->ForkSequence(s);
  std::vector<int32_t> ta = prefix, tb = prefix;
  ta.insert(ta.end(), {5, 6, 7});
  tb.insert(tb.end(), {9, 10, 11});
  auto out = e->Step({StepItem{s, {5, 6, 7}, LogitsMode::kAll}, StepItem{f, {9, 10, 11}, LogitsMode::kAll}});
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<float> fa = Prefill(*e, ta), fb = Prefill(*e, tb);
  ExpectNear(out->logits[0], Positions(fa, V, 13), 1e-4);
  ExpectNear(out->logits[1], Positions(fb, V, 13), 1e-4);
}

TEST(CpuEngine, GenerateGreedyFollowsArgmaxOfRecomputedLogits) {
  kernels::cpu::ThreadPool pool(2);
  auto e = MakeEngine(&pool);
  const int64_t V = TestConfig().vocab_size;
  GenerateOptions o;
  o.sampling.temperature = 0;
  o.sampling.max_tokens = 12;
  o.sampling.stop_token_ids = std::vector<int>{};
  o.prefill_chunk = 5;
  std::vector<int32_t> prompt = Tokens(9, 8);
  auto r = Generate(*e, prompt, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->finish_reason, "length");
  ASSERT_EQ(r->tokens.size(), 12u);
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), r->tokens.begin(), r->tokens.end() - 1);
  std::vector<float> full = Prefill(*e, all);
  for (size_t i = 0; i < r->tokens.size(); ++i) {
    EXPECT_EQ(r->tokens[i], Argmax(&full[(prompt.size() - 1 + i) * V], V)) << i;
  }
  EXPECT_EQ(e->kv_cache().free_blocks(), e->kv_cache().num_blocks());  // sequence freed
  // Stopping on a token: make the 4th greedy token a stop token.
  o.sampling.stop_token_ids = std::vector<int>{r->tokens[3]};
  o.sampling.logprobs = true;
  auto r2 = Generate(*e, prompt, o);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2->finish_reason, "stop");
  EXPECT_EQ(r2->stop_token, r->tokens[3]);
  EXPECT_EQ(r2->tokens, std::vector<int32_t>(r->tokens.begin(), r->tokens.begin() + 3));
  EXPECT_EQ(r2->completion_tokens, 4);
  EXPECT_EQ(r2->logprobs.size(), 4u);
}

// A "-chain" preset (common/model_spec.h): greedy and sampled outputs alike
// follow SyntheticChainNext from the prompt's last token, whatever the
// prompt; the plain preset of the same seed does not.
TEST(CpuEngine, AChainPresetsOutputsFollowTheChain) {
  kernels::cpu::ThreadPool pool(2);
  for (const char* model : {"synthetic:tiny-chain:3", "synthetic:tiny:3"}) {
    absl::StatusOr<SyntheticModelSpec> spec = ParseSyntheticModel(model);
    ASSERT_TRUE(spec.ok()) << spec.status();
    const ModelConfig& c = spec->config;
    absl::StatusOr<ModelWeights> weights = MakeSyntheticShard(c, spec->weights(), ShardSpec{});
    ASSERT_TRUE(weights.ok()) << weights.status();
    CpuEngineOptions o;
    o.kv_block_size = 4;
    o.kv_num_blocks = 256;
    absl::StatusOr<std::unique_ptr<CpuEngine>> e = CpuEngine::Create(std::move(*weights), o, &pool);
    ASSERT_TRUE(e.ok()) << e.status();
    int off_chain = 0;
    for (float temperature : {0.0f, 1.0f}) {
      for (int seed = 1; seed <= 3; ++seed) {
        GenerateOptions g;
        g.sampling.temperature = temperature;
        g.sampling.seed = 7 + seed;
        g.sampling.max_tokens = 40;
        g.sampling.stop_token_ids = std::vector<int>{};
        const std::vector<int32_t> prompt = Tokens(20 + seed, seed, SyntheticChainTokens(c));
        absl::StatusOr<GenerationResult> r = Generate(**e, prompt, g);
        ASSERT_TRUE(r.ok()) << r.status();
        ASSERT_EQ(r->tokens.size(), 40u);
        int32_t previous = prompt.back();
        for (int32_t token : r->tokens) {
          if (token != SyntheticChainNext(c, previous)) ++off_chain;
          previous = token;
        }
      }
    }
    if (spec->chain) {
      EXPECT_EQ(off_chain, 0) << model;
    } else {
      EXPECT_GT(off_chain, 200) << model;
    }
  }
}

TEST(CpuEngine, SeededSamplingIsReproducible) {
  kernels::cpu::ThreadPool pool(2);
  auto e = MakeEngine(&pool);
  GenerateOptions o;
  o.sampling.temperature = 1.5f;
  o.sampling.seed = 1234;
  o.sampling.max_tokens = 16;
  o.sampling.stop_token_ids = std::vector<int>{};
  auto a = Generate(*e, Tokens(5, 9), o);
  auto b = Generate(*e, Tokens(5, 9), o);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->tokens, b->tokens);
  o.sampling.seed = 4321;
  auto c = Generate(*e, Tokens(5, 9), o);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(a->tokens, c->tokens);
}

TEST(CpuEngine, BadInputsAreInvalidArgumentsThatChangeNothing) {
  auto e = MakeEngine(nullptr, 64);
  int64_t s = e->NewSequence();
  ASSERT_TRUE(e->Step({StepItem{s, {1, 2, 3}, LogitsMode::kNone}}).ok());
  auto expect = [&](const std::vector<StepItem>& items, absl::StatusCode code, const std::string& words) {
    auto out = e->Step(items);
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.status().code(), code) << out.status();
    EXPECT_NE(std::string(out.status().message()).find(words), std::string::npos) << out.status();
    EXPECT_EQ(*e->SequenceLength(s), 3);
  };
  expect({StepItem{s, {5, 1024}, LogitsMode::kLast}}, absl::StatusCode::kInvalidArgument,
         "token id 1024 at index 1");
  expect({StepItem{s, {-1}, LogitsMode::kLast}}, absl::StatusCode::kInvalidArgument, "out of range");
  expect({StepItem{s, {}, LogitsMode::kLast}}, absl::StatusCode::kInvalidArgument, "no tokens");
  expect({StepItem{999, {1}, LogitsMode::kLast}}, absl::StatusCode::kInvalidArgument, "unknown sequence 999");
  expect({StepItem{s, {1}, LogitsMode::kLast}, StepItem{s, {2}, LogitsMode::kLast}},
         absl::StatusCode::kInvalidArgument, "twice");
  expect({}, absl::StatusCode::kInvalidArgument, "no sequences");
  StepItem grouped{s, {1}, LogitsMode::kLast};
  grouped.group_logits = true;  // the CPU engine is no rank of a device TP group
  expect({grouped}, absl::StatusCode::kInvalidArgument, "group logits");
  // Longer than the KV cache can ever hold (64 blocks of 4 tokens).
  expect({StepItem{s, std::vector<int32_t>(200, 1), LogitsMode::kLast}},
         absl::StatusCode::kInvalidArgument, "more than the KV cache can hold");
  // Momentarily out of blocks: another sequence holds most of them.
  int64_t other = e->NewSequence();
  ASSERT_TRUE(e->Step({StepItem{other, std::vector<int32_t>(80, 1), LogitsMode::kNone}}).ok());
  expect({StepItem{s, std::vector<int32_t>(40, 1), LogitsMode::kLast}},
         absl::StatusCode::kResourceExhausted, "out of blocks");
  ASSERT_TRUE(e->FreeSequence(other).ok());
  EXPECT_TRUE(e->Step({StepItem{s, std::vector<int32_t>(40, 1), LogitsMode::kLast}}).ok());
  EXPECT_EQ(e->FreeSequence(12345).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CpuEngine, GroupLogitsRulesNameWhatIsWrong) {
  auto item = [](int64_t seq, bool group) {
    StepItem it{seq, {1}, LogitsMode::kNone};
    it.group_logits = group;
    return it;
  };
  EXPECT_TRUE(CheckGroupLogits({item(1, false), item(2, false)}, false).ok());
  EXPECT_TRUE(CheckGroupLogits({item(1, true), item(2, true)}, true).ok());
  auto refused = [](const std::vector<StepItem>& items, bool splits, const std::string& words) {
    const absl::Status st = CheckGroupLogits(items, splits);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(std::string(st.message()).find(words), std::string::npos) << st;
  };
  refused({item(1, true)}, false, "not a rank of a tensor-parallel group");
  refused({item(1, true), item(2, false)}, true, "must mark every item");
  std::vector<StepItem> many;
  for (int i = 0; i <= kMaxGroupLogitRows; ++i) many.push_back(item(i, true));
  refused(many, true, "more than");
  StepItem all = item(1, true);
  all.logits = LogitsMode::kAll;
  refused({all}, true, "last position's alone");
  StepItem drafted = item(1, true);
  drafted.tokens = {1, 2};
  drafted.draft_tokens = 1;
  refused({drafted}, true, "last position's alone");
}

TEST(CpuEngine, PromptLongerThanTheContextIsRejected) {
  ModelConfig c = TestConfig();
  c.max_position_embeddings = 16;
  auto e = MakeEngine(nullptr, 512, c);
  GenerateOptions o;
  auto r = Generate(*e, Tokens(17, 1), o);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(r.status().message()).find("longer than the context"), std::string::npos)
      << r.status();
  int64_t s = e->NewSequence();
  auto out = e->Step({StepItem{s, Tokens(17, 1), LogitsMode::kLast}});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(out.status().message()).find("max_position_embeddings 16"), std::string::npos);
  // Generation that reaches the context ends with "length".
  o.sampling.temperature = 0;
  o.sampling.max_tokens = 100;
  o.sampling.stop_token_ids = std::vector<int>{};
  auto g = Generate(*e, Tokens(10, 1), o);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->finish_reason, "length");
  EXPECT_EQ(g->tokens.size(), 7u);  // positions 10..15 fed back, the 7th sampled at position 15
  EXPECT_FALSE(Generate(*e, {}, o).ok());
}

TEST(CpuEngine, CreateRejectsIncompleteWeights) {
  ShardSpec half;
  half.experts = {0, 1, 2, 3};
  auto w = MakeSyntheticWeights(TestConfig(), 1, half);
  ASSERT_TRUE(w.ok());
  CpuEngineOptions o;
  o.kv_num_blocks = 16;
  auto e = CpuEngine::Create(*w, o, nullptr);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(e.status().message()).find("expert 4 is not held"), std::string::npos)
      << e.status();
  auto full = *MakeSyntheticWeights(TestConfig(), 1);
  full.layers[2].attn.wk.rows = 5;
  e = CpuEngine::Create(full, o, nullptr);
  EXPECT_NE(std::string(e.status().message()).find("model.layers.2.self_attn.k_proj.weight"),
            std::string::npos)
      << e.status();
  full = *MakeSyntheticWeights(TestConfig(), 1);
  o.kv_num_blocks = 0;
  EXPECT_FALSE(CpuEngine::Create(full, o, nullptr).ok());
}

// Two ranks in two threads joined by a host context over a local
// communicator. Rank 0 holds the even experts at slots in reverse order
// (its weights keep them ascending, so slot and weight order differ) and a
// replica of expert 3; rank 1 the odd ones.
ExpertMap TwoRankMap(int layers) {
  std::vector<std::vector<ExpertLocation>> layer(8);
  for (int e = 0; e < 8; ++e) {
    layer[e] = {e % 2 == 0 ? ExpertLocation{0, 3 - e / 2} : ExpertLocation{1, e / 2}};
  }
  layer[3].push_back({0, 4});
  return *ExpertMap::Create(1, 2, std::vector(layers, layer));
}

// Runs steps[r] on rank r, one prompt per step on a fresh sequence (an empty
// prompt: the rank joins the step with no tokens); returns each step's logits.
// With the tensor-parallel MoE layout each rank loads every expert (the
// engine keeps its TP rank's slices).
std::vector<std::vector<std::vector<float>>> RunTwoRanks(
    int tp, const std::vector<std::vector<std::vector<int32_t>>>& steps,
    MoeLayout moe = MoeLayout::kExpertParallel) {
  const ModelConfig c = TestConfig();
  auto config = ParallelConfig::Create(2, tp, c, moe);
  EXPECT_TRUE(config.ok()) << config.status();
  auto rendezvous = *comm::LocalRendezvous::Create(2);
  std::vector<std::vector<std::vector<float>>> got(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      auto comm = comm::LocalCommunicator::Create(rendezvous, r, {absl::Seconds(10)});
      ASSERT_TRUE(comm.ok()) << comm.status();
      parallel::ContextOptions po;
      po.hidden = c.hidden_size;
      po.top_k = c.num_experts_per_tok;
      po.max_tokens_per_step = 64;
      auto context =
          parallel::CreateHostContext(*config, TwoRankMap(c.num_hidden_layers), comm->get(), po);
      ASSERT_TRUE(context.ok()) << context.status();
      ShardSpec spec;
      spec.tp_rank = config->tp_rank_of(r);
      spec.tp_size = tp;
      if (!config->moe_tp()) {
        spec.experts = r == 0 ? std::vector<int>{0, 2, 3, 4, 6} : std::vector<int>{1, 3, 5, 7};
      }
      CpuEngineOptions o;
      o.kv_block_size = 4;
      o.kv_num_blocks = 256;
      auto e = CpuEngine::Create(*MakeSyntheticWeights(c, 1, spec), o, nullptr, context->get());
      ASSERT_TRUE(e.ok()) << e.status();
      for (const std::vector<int32_t>& prompt : steps[r]) {
        std::vector<StepItem> items;
        if (!prompt.empty()) items.push_back({(*e)->NewSequence(), prompt, LogitsMode::kAll});
        auto out = (*e)->Step(items);
        ASSERT_TRUE(out.ok()) << out.status();
        got[r].push_back(prompt.empty() ? std::vector<float>() : out->logits[0]);
      }
    });
  }
  for (auto& t : ranks) t.join();
  return got;
}

TEST(CpuEngine, TensorParallelPairThroughAHostContextEqualsOneRank) {
  auto single = MakeEngine(nullptr);
  std::vector<int32_t> tokens = Tokens(15, 10);
  std::vector<float> want = Prefill(*single, tokens);
  auto got = RunTwoRanks(2, {{tokens}, {tokens}});
  ASSERT_EQ(got[0].size(), 1u);
  ASSERT_EQ(got[1].size(), 1u);
  // The o_proj partials are summed over two ranks: close, not the same bits.
  ExpectNear(got[0][0], want, 1e-4);
  ExpectNear(got[1][0], want, 1e-4);
}

TEST(CpuEngine, TensorParallelMoePairEqualsOneRank) {
  auto single = MakeEngine(nullptr);
  std::vector<int32_t> a = Tokens(15, 10), b = Tokens(6, 4);
  std::vector<float> want_a = Prefill(*single, a), want_b = Prefill(*single, b);
  // Each rank runs half of every expert's intermediate columns; the pair's
  // partial outputs (and o_proj's) are summed by the TP all-reduce.
  auto got = RunTwoRanks(2, {{a, b}, {a, b}}, MoeLayout::kTensorParallel);
  ASSERT_EQ(got[0].size(), 2u);
  ASSERT_EQ(got[1].size(), 2u);
  ExpectNear(got[0][0], want_a, 1e-4);
  ExpectNear(got[0][1], want_b, 1e-4);
  // Both ranks of the group hold the same bits.
  EXPECT_EQ(got[0][0], got[1][0]);
  EXPECT_EQ(got[0][1], got[1][1]);
}

TEST(CpuEngine, ExpertParallelRanksGiveTheSameBitsAsOneRank) {
  auto single = MakeEngine(nullptr);
  std::vector<int32_t> a = Tokens(15, 3), b = Tokens(6, 4);
  std::vector<float> want_a = Prefill(*single, a), want_b = Prefill(*single, b);
  // Step 1: both ranks have tokens; step 2: rank 1 has none.
  auto got = RunTwoRanks(1, {{a, b}, {b, {}}});
  ASSERT_EQ(got[0].size(), 2u);
  ASSERT_EQ(got[1].size(), 2u);
  EXPECT_EQ(got[0][0], want_a);
  EXPECT_EQ(got[1][0], want_b);
  EXPECT_EQ(got[0][1], want_b);
}

TEST(CpuEngine, AContextWhoseMapPlacesAnExpertTheWeightsLackIsRefused) {
  const ModelConfig c = TestConfig();
  auto rendezvous = *comm::LocalRendezvous::Create(2);
  auto comm = *comm::LocalCommunicator::Create(rendezvous, 0);
  parallel::ContextOptions po;
  po.hidden = c.hidden_size;
  po.top_k = c.num_experts_per_tok;
  auto context = *parallel::CreateHostContext(*ParallelConfig::Create(2, 1, c),
                                              TwoRankMap(c.num_hidden_layers), comm.get(), po);
  ShardSpec spec;
  spec.experts = {0, 2, 4, 6};  // not the replica of expert 3
  CpuEngineOptions o;
  o.kv_num_blocks = 16;
  auto e = CpuEngine::Create(*MakeSyntheticWeights(c, 1, spec), o, nullptr, context.get());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(e.status().message()).find("expert 3"), std::string::npos) << e.status();
}

}  // namespace
}  // namespace flotilla
