// The distributed runtime end to end: a coordinator and W worker processes
// (UCX between them) must give exactly the tokens of the single-process
// engine, and survive a worker killed with SIGKILL.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "common/tokenizer/streaming_detokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "kernels/cpu/thread_pool.h"
#include "proto/admin.grpc.pb.h"
#include "proto/flotilla.grpc.pb.h"
#include "tests/cluster/cluster_status.h"
#include "tests/cluster/greedy_client.h"
#include "tests/cluster_options.h"
#include "tests/grpc_stub.h"
#include "tests/tools/bench_serve_in_process.h"
#include "tools/cli/local_cluster.h"
#include "tools/sdk/client.h"
#include "worker/engine/cpu_engine.h"
#include "worker/engine/generate.h"
#include "worker/model/checkpoint.h"
#include "worker/model/load_weights.h"

namespace flotilla {
namespace {
namespace fs = std::filesystem;

using Reply = cluster_test::Streamed;

Reply Generate(const std::string& address, const std::vector<int32_t>& prompt, int max_tokens,
               bool logits) {
  return cluster_test::GreedyGenerate(address, prompt, max_tokens, {.prompt_logits = logits});
}

// The instance at `address` is READY and answers a request of 4 tokens.
void ExpectServing(const std::string& address) {
  const admin::ClusterStatus status = testing_util::ClusterStatusAt(address);
  EXPECT_EQ(status.state(), admin::READY) << status.message();
  Reply after = Generate(address, {1, 2, 3}, 4, false);
  EXPECT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.tokens.size(), 4u);
}

std::vector<std::string> GoldenDirs() {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator("tests/data/golden")) {
    if (fs::exists(e.path() / "golden.json")) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// `model` empty: the built-in model. `moe`: the coordinator's --moe-parallel
// (empty: its default).
cli::LocalClusterOptions Options(const std::string& model, int workers, int tp,
                                 const std::string& moe = "") {
  cli::LocalClusterOptions o = testing_util::TestClusterOptions(model, workers, tp, "cluster-test");
  o.comm_timeout_ms = 3000;
  o.heartbeat_timeout_ms = 2000;
  o.moe_parallel = moe;
  return o;
}

struct Expected {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<GenerationResult> results;
};

Expected SingleProcess(const std::string& dir) {
  std::ifstream in(dir + "/golden.json");
  nlohmann::json g = nlohmann::json::parse(in);
  Expected e;
  std::shared_ptr<const Checkpoint> ck(*Checkpoint::Open(dir));
  kernels::cpu::ThreadPool pool(1);
  for (const auto& p : g["prompts"]) {
    std::vector<int32_t> prompt = p.get<std::vector<int32_t>>();
    CpuEngineOptions eo;
    eo.kv_num_blocks = CpuEngine::KvBlocksFor(ck->config(), ck->config().num_key_value_heads, 16,
                                              1, prompt.size() + 24);
    auto engine = *CpuEngine::Create(*LoadWeights(ck, ShardSpec{}), eo, &pool);
    GenerateOptions go;
    go.sampling.temperature = 0;
    go.sampling.max_tokens = 24;
    go.return_prompt_logits = true;
    e.prompts.push_back(prompt);
    e.results.push_back(*flotilla::Generate(*engine, prompt, go));
  }
  return e;
}

// The single process's greedy tokens for `prompt` (no prefix cache), the
// reference the cluster tests compare a cluster's answer with.
std::vector<int32_t> SingleProcessGreedy(const std::shared_ptr<const Checkpoint>& ck,
                                         const std::vector<int32_t>& prompt, int max_tokens) {
  kernels::cpu::ThreadPool pool(1);
  CpuEngineOptions eo;
  eo.prefix_cache = false;
  eo.kv_num_blocks = CpuEngine::KvBlocksFor(ck->config(), ck->config().num_key_value_heads, 16, 1,
                                            prompt.size() + max_tokens, false);
  auto engine = *CpuEngine::Create(*LoadWeights(ck, ShardSpec{}), eo, &pool);
  GenerateOptions go;
  go.sampling.temperature = 0;
  go.sampling.max_tokens = max_tokens;
  return flotilla::Generate(*engine, prompt, go)->tokens;
}

// Every golden fixture's prompts at once through a cluster of `workers`
// ranks of TP `tp`: the single process's greedy tokens and prompt logits.
void ExpectSameAsOneProcess(int workers, int tp, const std::string& moe) {
  for (const std::string& dir : GoldenDirs()) {
    SCOPED_TRACE(dir);
    Expected want = SingleProcess(dir);
    auto cluster = cli::LocalCluster::Start(Options(dir, workers, tp, moe));
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    {
      // The instance runs the MoE layout asked for.
      auto admin = testing_util::PlainStub<admin::Admin>((*cluster)->address());
      grpc::ClientContext ctx;
      admin::PlacementInfo placement;
      ASSERT_TRUE(admin->GetPlacement(&ctx, admin::GetPlacementRequest(), &placement).ok());
      EXPECT_EQ(placement.moe_layout(), moe == "tp" ? ::flotilla::cluster::MOE_LAYOUT_TP
                                                    : ::flotilla::cluster::MOE_LAYOUT_EP);
      EXPECT_EQ(placement.ep_size(), moe == "tp" ? 1u : static_cast<uint32_t>(workers));
      if (moe == "tp") {
        // No whole experts to move: balancing says so instead of planning.
        grpc::ClientContext rctx;
        admin::RebalanceResult result;
        const grpc::Status refused = admin->Rebalance(&rctx, admin::RebalanceRequest(), &result);
        EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
        EXPECT_NE(refused.error_message().find("tensor-parallel MoE layout"), std::string::npos)
            << refused.error_message();
      }
    }
    // All prompts at once: they batch together across the DP groups.
    std::vector<Reply> got(want.prompts.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < want.prompts.size(); ++i) {
      threads.emplace_back([&, i] {
        got[i] = Generate((*cluster)->address(), want.prompts[i], 24, true);
      });
    }
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < want.prompts.size(); ++i) {
      ASSERT_TRUE(got[i].status.ok()) << got[i].status.error_message();
      EXPECT_EQ(got[i].tokens, want.results[i].tokens) << "prompt " << i;
      ASSERT_EQ(got[i].prompt_logits.size(), want.results[i].prompt_logits.size());
      float worst = 0;
      for (size_t j = 0; j < got[i].prompt_logits.size(); ++j) {
        worst = std::max(worst, std::abs(got[i].prompt_logits[j] - want.results[i].prompt_logits[j]));
      }
      EXPECT_LE(worst, 1e-4f) << "prompt " << i;
    }
  }
}

class ClusterEquivalence : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(ClusterEquivalence, SameTokensAndLogitsAsOneProcess) {
  const auto [workers, tp] = GetParam();
  ExpectSameAsOneProcess(workers, tp, "ep");
}

INSTANTIATE_TEST_SUITE_P(Layouts, ClusterEquivalence,
                         ::testing::Values(std::pair{1, 1}, std::pair{2, 1}, std::pair{2, 2},
                                           std::pair{4, 1}, std::pair{4, 2}),
                         testing_util::LayoutName);

// The tensor-parallel MoE layout (every rank a slice of every expert, one
// all-reduce per MoE layer): one TP group, and two groups each holding every
// expert.
class ClusterEquivalenceMoeTp : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(ClusterEquivalenceMoeTp, SameTokensAndLogitsAsOneProcess) {
  const auto [workers, tp] = GetParam();
  ExpectSameAsOneProcess(workers, tp, "tp");
}

INSTANTIATE_TEST_SUITE_P(Layouts, ClusterEquivalenceMoeTp,
                         ::testing::Values(std::pair{2, 2}, std::pair{4, 2}),
                         testing_util::LayoutName);

// The prefix cache end to end: a second request repeating the first one's
// conversation (prompt and answer) plus 64 new tokens is served from the
// workers' prefix caches (every rank of a TP group shares the same blocks),
// with the tokens of one process without a cache; the heartbeats report the
// hits and /metrics shows them.
class ClusterPrefixCache : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(ClusterPrefixCache, SecondTurnIsServedFromTheCacheWithTheSameTokens) {
  const auto [workers, tp] = GetParam();
  const std::string dir = GoldenDirs().front();
  std::shared_ptr<const Checkpoint> ck(*Checkpoint::Open(dir));
  const int vocab = ck->config().vocab_size;
  std::vector<int32_t> first(200);
  for (int i = 0; i < 200; ++i) first[i] = (i * 7919 + 17) % vocab;
  auto cluster = cli::LocalCluster::Start(Options(dir, workers, tp));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const Reply one = Generate((*cluster)->address(), first, 8, false);
  ASSERT_TRUE(one.status.ok()) << one.status.error_message();
  std::vector<int32_t> second = first;
  second.insert(second.end(), one.tokens.begin(), one.tokens.end());
  for (int i = 0; i < 64; ++i) second.push_back((i * 104729 + 5) % vocab);
  const Reply two = Generate((*cluster)->address(), second, 8, false);
  ASSERT_TRUE(two.status.ok()) << two.status.error_message();

  EXPECT_EQ(one.tokens, SingleProcessGreedy(ck, first, 8));
  EXPECT_EQ(two.tokens, SingleProcessGreedy(ck, second, 8));

  // The second prompt's hits: the first request's prompt and the answer
  // tokens it computed (all but the last sampled, unless that was a stop
  // token, which is not returned), in whole blocks.
  const size_t computed = first.size() + one.tokens.size() - (one.finish == common::LENGTH ? 1 : 0);
  const uint64_t want_hits = computed / 16 * 16;
  uint64_t queries = 0, hits = 0;
  for (int attempt = 0; attempt < 100 && hits < want_hits; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    queries = hits = 0;
    const admin::ClusterStatus status = testing_util::ClusterStatusAt((*cluster)->address());
    for (const admin::WorkerStatus& w : status.workers()) {
      queries += w.load().prefix_cache_queries_tokens();
      hits += w.load().prefix_cache_hits_tokens();
    }
  }
  EXPECT_EQ(hits, want_hits);
  EXPECT_EQ(queries, first.size() + second.size());
  httplib::Client http("http://" + (*cluster)->http_address());
  auto metrics = http.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_TRUE(std::regex_search(
      metrics->body, std::regex("\nflotilla_prefix_cache_hits_tokens_total\\{[^}]*\\} " +
                                std::to_string(hits) + "\n")))
      << metrics->body;
  EXPECT_TRUE(std::regex_search(
      metrics->body, std::regex("\nflotilla_prefix_cache_queries_tokens_total\\{[^}]*\\} " +
                                std::to_string(queries) + "\n")))
      << metrics->body;
}

INSTANTIATE_TEST_SUITE_P(Layouts, ClusterPrefixCache,
                         ::testing::Values(std::pair{1, 1}, std::pair{2, 2}),
                         testing_util::LayoutName);

// --idle-prefill-tokens end to end: with a step budget of 16 tokens, a
// 300-token prompt on an idle instance runs in one step (the workers' engines
// and, sharded, their host exchanges sized for it) and gives the single
// process's greedy tokens.
class ClusterIdlePrefill : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(ClusterIdlePrefill, ALongPromptInOneIdleStepGivesTheSameTokens) {
  const auto [workers, tp] = GetParam();
  const std::string dir = GoldenDirs().front();
  std::shared_ptr<const Checkpoint> ck(*Checkpoint::Open(dir));
  const int vocab = ck->config().vocab_size;
  std::vector<int32_t> prompt(300);
  for (int i = 0; i < 300; ++i) prompt[i] = (i * 7919 + 29) % vocab;
  cli::LocalClusterOptions o = Options(dir, workers, tp);
  o.coordinator_args = {"--max-batch-tokens", "16", "--idle-prefill-tokens", "512"};
  auto cluster = cli::LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const Reply got = Generate((*cluster)->address(), prompt, 8, false);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();

  EXPECT_EQ(got.tokens, SingleProcessGreedy(ck, prompt, 8));
}

INSTANTIATE_TEST_SUITE_P(Layouts, ClusterIdlePrefill,
                         ::testing::Values(std::pair{1, 1}, std::pair{2, 1}, std::pair{2, 2}),
                         testing_util::LayoutName);

TEST(ClusterFailure, KilledWorkerIsNoticedRequestsFailClearlyAndItRejoins) {
  // The built-in model: its end tokens are 2 of 201088 ids, so a long
  // greedy request keeps running until the kill.
  auto cluster = cli::LocalCluster::Start(Options("", 2, 1));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string addr = (*cluster)->address();
  ASSERT_TRUE(Generate(addr, {1, 2, 3}, 4, false).status.ok());

  // A long request in flight while worker-1 is killed.
  Reply inflight;
  std::atomic<bool> first{false};
  std::thread t([&] {  // within the 4096-token context
    inflight = cluster_test::GreedyGenerate(addr, {5, 6, 7}, 4000, {.first = &first});
  });
  while (!first.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));  // it runs
  const auto killed = std::chrono::steady_clock::now();
  ASSERT_TRUE((*cluster)->KillWorker(1).ok());
  t.join();
  const double noticed_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  EXPECT_EQ(inflight.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << inflight.status.error_message();
  EXPECT_NE(inflight.status.error_message().find("worker-1"), std::string::npos)
      << inflight.status.error_message();
  // The session stream closes at the kill; heartbeats (1 s) are only the
  // backstop. Generous for a loaded machine (label slow).
  EXPECT_LT(noticed_s, 5.0);
  RecordProperty("noticed_ms", static_cast<int>(noticed_s * 1000));
  std::cout << "in-flight request ended " << noticed_s * 1000 << " ms after the kill\n";

  // New requests are refused with a clear status while the instance is incomplete.
  Reply refused = Generate(addr, {1, 2, 3}, 4, false);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(refused.status.error_message().find("worker-1"), std::string::npos)
      << refused.status.error_message();
  EXPECT_EQ(testing_util::ClusterStatusAt(addr).state(), admin::DEGRADED);

  // The restarted worker rejoins, reloads its shards, and service resumes.
  ASSERT_TRUE((*cluster)->RestartWorker(1).ok());
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (testing_util::ClusterStatusAt(addr).state() != admin::READY &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ExpectServing(addr);
}

TEST(ClusterText, TextPromptsAreTokenizedAndTokensComeBackAsText) {
  auto cluster = cli::LocalCluster::Start(Options("", 1, 1));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto stub = testing_util::PlainStub<v1::Flotilla>((*cluster)->address());
  v1::GenerateRequest req;
  req.set_text("hello world");
  req.mutable_sampling()->set_temperature(0);
  req.mutable_sampling()->set_max_tokens(6);
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse resp;
  std::vector<tokenizer::TokenId> ids;
  std::string text;
  uint32_t prompt_tokens = 0;
  while (reader->Read(&resp)) {
    for (int32_t t : resp.token_ids()) ids.push_back(static_cast<tokenizer::TokenId>(t));
    text += resp.text();
    if (resp.has_usage()) prompt_tokens = resp.usage().prompt_tokens();
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(prompt_tokens, 2u);  // "hello world" is [24912, 2375] in o200k
  auto tok = tokenizer::Tokenizer::Create(tokenizer::Tokenizer::DefaultRanksPath());
  ASSERT_TRUE(tok.ok()) << tok.status();
  tokenizer::StreamingDetokenizer detok(tok->get(),
                                        tokenizer::StreamingDetokenizer::InvalidBytes::kReplace);
  std::string want;
  for (tokenizer::TokenId id : ids) want += *detok.Append(id);
  EXPECT_EQ(ids.size(), 6u);
  EXPECT_EQ(text, want);

  grpc::ClientContext bad_ctx;
  v1::GenerateRequest bad;
  bad.set_text("");  // (invalid UTF-8 cannot even be sent: protobuf rejects it in the client)
  auto bad_reader = stub->Generate(&bad_ctx, bad);
  while (bad_reader->Read(&resp)) {
  }
  grpc::Status st = bad_reader->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("empty"), std::string::npos) << st.error_message();
}

TEST(ClusterExpertMap, NewMapIsValidatedAndEveryRankSwitchesAtOneStep) {
  const std::string dir = GoldenDirs().front();
  cli::LocalClusterOptions o = Options(dir, 2, 1);
  o.log_dir += "-map";
  auto cluster = cli::LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string addr = (*cluster)->address();
  Reply before = Generate(addr, {1, 2, 3, 4}, 8, false);
  ASSERT_TRUE(before.status.ok());

  auto admin = testing_util::PlainStub<admin::Admin>(addr);
  cluster::ExpertMap cur;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin->GetExpertMap(&ctx, admin::GetExpertMapRequest(), &cur).ok());
  }
  // Expert 0 of layer 0 moved to slot 99 of a rank with no such slot: refused.
  cluster::ExpertMap bad = cur;
  bad.set_version(cur.version() + 1);
  auto* rep = bad.mutable_layers(0)->mutable_experts(0)->mutable_replicas(0);
  rep->set_rank(1 - rep->rank());
  rep->set_slot(99);
  {
    grpc::ClientContext ctx;
    cluster::ExpertMap out;
    grpc::Status st = admin->SetExpertMap(&ctx, bad, &out);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(st.error_message().find("expert slots"), std::string::npos) << st.error_message();
  }
  // The next version with every expert where it is held: accepted and used.
  cluster::ExpertMap next = cur;
  next.set_version(cur.version() + 1);
  {
    grpc::ClientContext ctx;
    cluster::ExpertMap out;
    ASSERT_TRUE(admin->SetExpertMap(&ctx, next, &out).ok());
  }
  Reply after = Generate(addr, {1, 2, 3, 4}, 8, false);
  ASSERT_TRUE(after.status.ok());
  EXPECT_EQ(after.tokens, before.tokens);
  (*cluster)->Stop();
  for (int i = 0; i < 2; ++i) {
    std::ifstream log(o.log_dir + "/worker-" + std::to_string(i) + ".log");
    std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("switched to expert map version 2"), std::string::npos) << text;
  }
}

TEST(ClientSdk, StreamsCancelsAndRetriesUnavailableBeforeTheFirstToken) {
  auto cluster = cli::LocalCluster::Start(Options("", 2, 2));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string addr = (*cluster)->address();
  client::ClientOptions co;
  co.address = addr;
  co.max_attempts = 40;
  co.retry_backoff = absl::Milliseconds(100);
  auto c = client::Client::Create(co);
  ASSERT_TRUE(c.ok());

  // Blocking call.
  v1::GenerateRequest req;
  req.set_text("The quick brown fox");
  req.mutable_sampling()->set_temperature(0);
  req.mutable_sampling()->set_max_tokens(5);
  auto res = (*c)->Generate(req);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(res->token_ids.size(), 5u);
  EXPECT_EQ(res->finish_reason, common::LENGTH);

  // Cancel mid-stream: the stream ends CANCELLED and the leader frees the sequence.
  v1::GenerateRequest long_req = req;
  long_req.mutable_sampling()->set_max_tokens(4000);  // within the 4096-token context
  client::CancelHandle cancel;
  int chunks = 0;
  absl::Status st = (*c)->GenerateStream(long_req, [&](const v1::GenerateResponse&) {
    if (++chunks == 3) cancel.Cancel();
  }, &cancel);
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled) << st;
  auto admin = testing_util::PlainStub<admin::Admin>(addr);
  bool freed = false;
  for (int i = 0; i < 100 && !freed; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    grpc::ClientContext ctx;
    admin::ClusterStatus s;
    ASSERT_TRUE(admin->GetStatus(&ctx, admin::GetStatusRequest(), &s).ok());
    freed = true;
    for (const auto& w : s.workers()) freed &= w.load().running_sequences() == 0;
  }
  EXPECT_TRUE(freed) << "the cancelled sequence was not freed";

  // UNAVAILABLE before the first token is retried: kill a worker, start the
  // call, bring the worker back; the call succeeds once the instance is whole.
  // The worker is restarted from this thread, not a short-lived one: children
  // get PR_SET_PDEATHSIG, which fires when the thread that forked them ends.
  ASSERT_TRUE((*cluster)->KillWorker(1).ok());
  while (testing_util::ClusterStatusAt(addr).state() ==
         admin::READY) {  // until the coordinator saw the kill
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  absl::StatusOr<client::GenerateResult> retried = absl::UnknownError("not called");
  std::thread call([&] { retried = (*c)->Generate(req); });
  // Room for refused attempts before the worker is back; the call must succeed
  // whether it was refused once or many times.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const absl::Status restarted = (*cluster)->RestartWorker(1);
  call.join();
  ASSERT_TRUE(restarted.ok()) << restarted;
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_EQ(retried->token_ids, res->token_ids);
}

std::vector<int32_t> LongPrompt(int n) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = (i * 7919 + 13) % 200000;
  return p;
}

TEST(ClusterPromptLogits, ALongPromptsLogitsStreamInBoundedMessagesAndTheWorkerStaysUp) {
  cli::LocalClusterOptions o = Options("", 1, 1);
  o.log_dir += "-logits";
  // The worker sends a prompt's logits ahead of the reader; an answer of 322 MB
  // needs a client-buffer bound above the default 64 MiB, which sheds it on a
  // loaded machine (coordinator/flow_control_notes.md).
  o.coordinator_args = {"--max-client-buffer-bytes", "1073741824"};
  auto cluster = cli::LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string addr = (*cluster)->address();
  const size_t vocab = 201088;  // 400 rows are 322 MB, over the 256 MiB gRPC limit in one message

  // The test's channel keeps gRPC's default 4 MiB receive limit: every
  // message of the stream must fit it.
  const std::vector<int32_t> prompt = LongPrompt(400);
  Reply big = Generate(addr, prompt, 2, true);
  ASSERT_TRUE(big.status.ok()) << big.status.error_message();
  EXPECT_EQ(big.tokens.size(), 2u);
  ASSERT_EQ(big.prompt_logits.size(), prompt.size() * vocab);
  EXPECT_LE(big.largest_message, size_t{4} << 20);
  // Rows come in prompt order: a prefix's logits are the first rows.
  Reply prefix = Generate(addr, {prompt.begin(), prompt.begin() + 3}, 1, true);
  ASSERT_TRUE(prefix.status.ok()) << prefix.status.error_message();
  ASSERT_EQ(prefix.prompt_logits.size(), 3 * vocab);
  float worst = 0;
  for (size_t j = 0; j < prefix.prompt_logits.size(); ++j) {
    worst = std::max(worst, std::abs(prefix.prompt_logits[j] - big.prompt_logits[j]));
  }
  EXPECT_LE(worst, 1e-4f);

  // Past the documented cap (1 GiB of logits): refused before any work.
  Reply refused = Generate(addr, LongPrompt(1400), 1, true);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.status.error_message().find("prompt_logits"), std::string::npos)
      << refused.status.error_message();

  // The worker stayed up, the instance is still serving.
  EXPECT_TRUE((*cluster)->CheckAlive().ok()) << (*cluster)->CheckAlive();
  ExpectServing(addr);
}

TEST(ClusterMeasureEngine, TheWorkerTimesItsEngineAndBenchServeComparesInOneLine) {
  cli::LocalClusterOptions o = Options("", 1, 1);
  o.log_dir += "-measure";
  auto cluster = cli::LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string addr = (*cluster)->address();

  auto admin = testing_util::PlainStub<admin::Admin>(addr);
  cluster::MeasureEngineRequest req;
  req.add_batch_sizes(1);
  req.add_batch_sizes(4);
  req.set_context_tokens(64);
  req.add_prefill_tokens(100);
  req.set_steps(4);
  cluster::EngineMeasurement m;
  {
    grpc::ClientContext ctx;
    grpc::Status st = admin->MeasureEngine(&ctx, req, &m);
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  ASSERT_EQ(m.decode_size(), 2);
  EXPECT_EQ(m.decode(1).batch(), 4u);
  EXPECT_GT(m.decode(1).step_ms_p50(), 0);
  ASSERT_EQ(m.prefill_size(), 1);
  EXPECT_GT(m.prefill(0).ms_p50(), 0);
  EXPECT_EQ(m.engine(), "cpu");
  // More than the KV cache holds: refused, and serving goes on.
  req.set_context_tokens(4000);
  req.clear_batch_sizes();
  req.add_batch_sizes(64);
  {
    grpc::ClientContext ctx;
    grpc::Status st = admin->MeasureEngine(&ctx, req, &m);
    EXPECT_TRUE(st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ||
                st.error_code() == grpc::StatusCode::INVALID_ARGUMENT)
        << st.error_code() << " " << st.error_message();
  }

  const nlohmann::json j =
      cli::BenchServeLine("--coordinator " + addr +
                          " --concurrency 2 --duration 1.5 --prompt-tokens 40 --output-tokens 6"
                          " --engine-compare on --engine-steps 4");
  ASSERT_FALSE(j.empty());
  EXPECT_GT(j["requests_ok"].get<int>(), 0) << j.dump();
  EXPECT_EQ(j["requests_failed"].get<int>(), 0) << j.dump();
  EXPECT_EQ(j["output_tokens"].get<int>(), 6 * j["requests_ok"].get<int>()) << j.dump();
  ASSERT_TRUE(j.contains("engine_compare")) << j.dump();
  const nlohmann::json& c = j["engine_compare"];
  EXPECT_EQ(c["batch"].get<int>(), 2);
  EXPECT_EQ(c["prompt_tokens"].get<int>(), 40);
  EXPECT_GT(c["engine_step_ms"].get<double>(), 0);
  EXPECT_GT(c["itl_over_engine_step"].get<double>(), 0);
  EXPECT_GT(c["engine_output_tokens_per_s"].get<double>(), 0);
  EXPECT_GT(c["served_over_engine"].get<double>(), 0);
  EXPECT_TRUE((*cluster)->CheckAlive().ok());
}

TEST(ClusterBenchMultiTurn, LaterTurnsRepeatTheLastAndHitThePrefixCache) {
  cli::LocalClusterOptions o = Options("", 1, 1);
  o.log_dir += "-multi-turn";
  auto cluster = cli::LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_FALSE((*cluster)->http_address().empty());

  const nlohmann::json j = cli::BenchServeLine(
      "--coordinator " + (*cluster)->address() +
      " --concurrency 2 --duration 3 --prompt-tokens 64 --output-tokens 4"
      " --multi-turn 3 --turn-tokens 32 --engine-compare off --metrics-url http://" +
      (*cluster)->http_address() + "/metrics");
  ASSERT_FALSE(j.empty());
  EXPECT_EQ(j["requests_failed"].get<int>(), 0) << j.dump();
  const nlohmann::json& turns = j["multi_turn"]["per_turn"];
  ASSERT_EQ(turns.size(), 3u) << j.dump();
  for (int t = 0; t < 3; ++t) {
    SCOPED_TRACE(t + 1);
    EXPECT_EQ(turns[t]["turn"].get<int>(), t + 1);
    ASSERT_GT(turns[t]["requests"].get<int>(), 0) << j.dump();
    // 64 tokens, then each turn adds the last one's 4 output tokens and 32 new ones.
    EXPECT_DOUBLE_EQ(turns[t]["mean_prompt_tokens"].get<double>(), 64 + 36 * t);
    EXPECT_DOUBLE_EQ(turns[t]["mean_shared_tokens"].get<double>(), t == 0 ? 0 : 64 + 36 * t - 32);
    EXPECT_GT(turns[t]["ttft_ms_p50"].get<double>(), 0);
  }
  const nlohmann::json& p = j["prefix_cache"];
  ASSERT_TRUE(p.contains("hit_tokens")) << j.dump();
  EXPECT_TRUE(p["complete"].get<bool>()) << j.dump();
  EXPECT_GT(p["hit_tokens"].get<int64_t>(), 0) << j.dump();
  EXPECT_LE(p["hit_tokens"].get<int64_t>(), j["multi_turn"]["shared_prompt_tokens"].get<int64_t>());
  EXPECT_EQ(p["prefill_tokens_computed"].get<int64_t>(),
            p["queried_tokens"].get<int64_t>() - p["hit_tokens"].get<int64_t>());
  EXPECT_TRUE((*cluster)->CheckAlive().ok());
}

// A step that computes and sends the largest prompt logits the server allows
// takes far longer than the ranks' wait for a silent peer (250 ms here) on a
// machine kept busy by a CPU hog; the peers allow for the step's logit rows
// (StepWaitTimeout), the leader's session sends them in parts that each count
// as a sign of life (kSessionPartBytes), so the instance is not re-formed and
// the request is answered in full.
TEST(ClusterLongSteps, LargestPromptLogitsUnderACpuHogDoNotReformTheInstance) {
  cli::LocalClusterOptions o = Options("", 2, 2);
  o.comm_timeout_ms = 250;
  o.coordinator_args = {"--max-prompt-logits-mb", "128", "--max-client-buffer-bytes", "1073741824"};
  auto c = cli::LocalCluster::Start(o);
  ASSERT_TRUE(c.ok()) << c.status();
  const admin::ClusterStatus before = testing_util::ClusterStatusAt((*c)->address());
  ASSERT_EQ(before.state(), admin::READY);
  const int64_t vocab = 201088;  // the built-in model's o200k vocabulary
  const int rows = static_cast<int>((int64_t{128} << 20) / (vocab * 4));
  std::vector<int32_t> prompt;
  for (int i = 0; i < rows; ++i) prompt.push_back(1000 + (i * 7919) % 90000);

  std::atomic<bool> stop{false};
  std::vector<std::thread> hog;
  for (int i = 0; i < 4; ++i) {
    hog.emplace_back([&stop] {
      volatile uint64_t x = 0;
      while (!stop.load(std::memory_order_relaxed)) x = x + 1;
    });
  }
  const Reply r = Generate((*c)->address(), prompt, 2, /*logits=*/true);
  stop = true;
  for (std::thread& t : hog) t.join();

  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.prompt_logits.size(), static_cast<size_t>(rows) * vocab);
  EXPECT_EQ(r.tokens.size(), 2u);
  const admin::ClusterStatus after = testing_util::ClusterStatusAt((*c)->address());
  EXPECT_EQ(after.state(), admin::READY);
  EXPECT_EQ(after.generation(), before.generation()) << "the instance was re-formed";
}

}  // namespace
}  // namespace flotilla
