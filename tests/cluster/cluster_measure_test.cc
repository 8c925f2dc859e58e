// Admin MeasureEngine on sharded CPU instances (real coordinator and worker
// processes, UCX between the ranks): every rank runs the probe in lockstep,
// the call answers with rank 0's figures, and serving goes on with the same
// tokens, also for a request streaming while the ranks measure.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "proto/admin.grpc.pb.h"
#include "proto/flotilla.grpc.pb.h"
#include "tests/cluster/greedy_client.h"
#include "tests/cluster_options.h"
#include "tests/grpc_stub.h"
#include "tests/tools/bench_serve_in_process.h"
#include "tools/cli/local_cluster.h"

namespace flotilla {
namespace {
namespace fs = std::filesystem;

using cluster_test::Streamed;

// A greedy request of exactly `max_tokens` (end tokens ignored); `first`
// turns true when its first tokens arrive.
Streamed GreedyStream(const std::string& address, const std::vector<int32_t>& prompt,
                      int max_tokens, std::atomic<bool>* first = nullptr) {
  return cluster_test::GreedyGenerate(address, prompt, max_tokens,
                                      {.ignore_eos = true, .deadline_s = 180, .first = first});
}

std::vector<int32_t> Prompt(int length, int seed) {
  std::vector<int32_t> p(length);
  for (int i = 0; i < length; ++i) p[i] = (i * 7919 + seed * 104729 + 11) % 700;
  return p;
}

cluster::MeasureEngineRequest SmallMeasurement() {
  cluster::MeasureEngineRequest req;
  req.add_batch_sizes(1);
  req.add_batch_sizes(3);
  req.set_context_tokens(48);
  req.add_prefill_tokens(40);
  req.set_steps(4);
  req.set_warmup_steps(2);
  req.set_prefill_repeats(2);
  return req;
}

// Timings that could be real: positive, ordered, within the pause reported.
void ExpectPlausible(const cluster::EngineMeasurement& m) {
  ASSERT_EQ(m.decode_size(), 2);
  EXPECT_EQ(m.decode(0).batch(), 1u);
  EXPECT_EQ(m.decode(1).batch(), 3u);
  double timed_ms = 0;
  for (const cluster::DecodeTiming& d : m.decode()) {
    EXPECT_EQ(d.steps(), 4u);
    EXPECT_GE(d.context_tokens(), 48u);
    EXPECT_GT(d.step_ms_min(), 0);
    EXPECT_LE(d.step_ms_min(), d.step_ms_p50());
    EXPECT_LE(d.step_ms_p50(), d.step_ms_max());
    timed_ms += d.step_ms_mean() * d.steps();
  }
  ASSERT_EQ(m.prefill_size(), 1);
  EXPECT_EQ(m.prefill(0).prompt_tokens(), 40u);
  EXPECT_GT(m.prefill(0).ms_min(), 0);
  EXPECT_LE(m.prefill(0).ms_min(), m.prefill(0).ms_p50());
  timed_ms += m.prefill(0).ms_min() * m.prefill(0).repeats();
  EXPECT_LE(timed_ms, m.wall_ms());
  EXPECT_EQ(m.engine(), "cpu");
  EXPECT_EQ(m.rank(), 0u);
}

// A local cluster of `workers` CPU workers in TP groups of `tp` on the
// sharded golden model, logging under a directory named by `tag`.
cli::LocalClusterOptions ShardedOptions(int workers, int tp, const std::string& tag) {
  return testing_util::TestClusterOptions("tests/data/golden/tiny_e16_sharded", workers, tp,
                                          "measure-" + tag + "-tp" + std::to_string(tp));
}

class ClusterMeasureSharded : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(ClusterMeasureSharded, EveryRankMeasuresInLockstepAndServingGoesOn) {
  const auto [workers, tp] = GetParam();
  cli::LocalClusterOptions o = ShardedOptions(workers, tp, "test");
  o.comm_timeout_ms = 3000;
  o.heartbeat_timeout_ms = 2000;
  auto cluster = cli::LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string addr = (*cluster)->address();
  const std::vector<int32_t> prompt = Prompt(24, 1);
  const Streamed before = GreedyStream(addr, prompt, 12);
  ASSERT_TRUE(before.status.ok()) << before.status.error_message();

  // Requests decoding in every DP group while the ranks measure.
  const std::vector<int32_t> long_prompt = Prompt(32, 2);
  constexpr int kLongTokens = 600;
  std::vector<Streamed> during(2);
  std::atomic<bool> first[2] = {false, false};
  std::vector<std::thread> streams;
  for (int i = 0; i < 2; ++i) {
    streams.emplace_back(
        [&, i] { during[i] = GreedyStream(addr, long_prompt, kLongTokens, &first[i]); });
  }
  const absl::Time start = absl::Now();
  while (!(first[0] && first[1]) && absl::Now() - start < absl::Seconds(60)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  auto admin = testing_util::PlainStub<admin::Admin>(addr);
  cluster::EngineMeasurement m;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  const grpc::Status st = admin->MeasureEngine(&ctx, SmallMeasurement(), &m);
  for (std::thread& t : streams) t.join();
  ASSERT_TRUE(st.ok()) << st.error_code() << " " << st.error_message();
  ExpectPlausible(m);
  EXPECT_EQ(m.world_size(), static_cast<uint32_t>(workers));
  EXPECT_EQ(m.tp_size(), static_cast<uint32_t>(tp));
  EXPECT_EQ(m.dp_groups(), static_cast<uint32_t>(workers / tp));
  EXPECT_GE(m.running_sequences(), 1u) << "the stream was not running on the leader";

  // The streams were paused, not broken: whole, with the tokens of the same
  // request served alone; and a request after the measurement gets the
  // tokens it got before.
  const Streamed alone = GreedyStream(addr, long_prompt, kLongTokens);
  ASSERT_TRUE(alone.status.ok()) << alone.status.error_message();
  ASSERT_EQ(alone.tokens.size(), static_cast<size_t>(kLongTokens));
  for (const Streamed& s : during) {
    ASSERT_TRUE(s.status.ok()) << s.status.error_message();
    EXPECT_EQ(s.tokens, alone.tokens);
  }
  const Streamed after = GreedyStream(addr, prompt, 12);
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.tokens, before.tokens);

  // A measurement the KV cache cannot hold is refused by every rank alike,
  // and the instance keeps serving.
  cluster::MeasureEngineRequest too_big = SmallMeasurement();
  too_big.clear_batch_sizes();
  too_big.add_batch_sizes(64);
  too_big.set_context_tokens(100000);
  grpc::ClientContext refused_ctx;
  const grpc::Status refused = admin->MeasureEngine(&refused_ctx, too_big, &m);
  EXPECT_TRUE(refused.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ||
              refused.error_code() == grpc::StatusCode::INVALID_ARGUMENT)
      << refused.error_code() << " " << refused.error_message();
  EXPECT_EQ(GreedyStream(addr, prompt, 12).tokens, before.tokens);
  EXPECT_TRUE((*cluster)->CheckAlive().ok()) << (*cluster)->CheckAlive();
}

// `bench serve` prints the engine's figure of a sharded instance per DP
// group and for the whole instance.
TEST_P(ClusterMeasureSharded, BenchServeComparesPerDpGroupAndForTheInstance) {
  const auto [workers, tp] = GetParam();
  const cli::LocalClusterOptions o = ShardedOptions(workers, tp, "bench");
  auto cluster = cli::LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const nlohmann::json j =
      cli::BenchServeLine("--coordinator " + (*cluster)->address() +
                          " --concurrency 4 --duration 1 --prompt-tokens 24 --output-tokens 8"
                          " --engine-compare on --engine-steps 4");
  ASSERT_FALSE(j.empty());
  EXPECT_EQ(j["requests_failed"].get<int>(), 0) << j.dump();
  ASSERT_TRUE(j.contains("engine_compare")) << j.dump();
  const nlohmann::json& c = j["engine_compare"];
  const int groups = workers / tp;
  EXPECT_EQ(c["dp_groups"].get<int>(), groups);
  EXPECT_EQ(c["batch"].get<int>(), 4 / groups);  // a group's share of the concurrency
  EXPECT_GT(c["engine_step_ms"].get<double>(), 0);
  const double instance = c["engine_output_tokens_per_s"].get<double>();
  EXPECT_GT(instance, 0);
  EXPECT_NEAR(c["engine_output_tokens_per_s_per_dp_group"].get<double>() * groups, instance,
              1e-6 * instance);
  EXPECT_EQ(j["engine"]["world_size"].get<int>(), workers);
  EXPECT_TRUE((*cluster)->CheckAlive().ok());
}

INSTANTIATE_TEST_SUITE_P(Layouts, ClusterMeasureSharded,
                         ::testing::Values(std::pair{2, 2}, std::pair{2, 1}),
                         testing_util::LayoutName);

// A rank killed mid-probe: the call ends UNAVAILABLE (never waits out its
// deadline), the paused requests end with a clear status, and the instance
// serves and measures again once the worker is back.
TEST(ClusterMeasureFailure, ARankKilledMidProbeEndsTheCallAndStrandsNoRequest) {
  cli::LocalClusterOptions o = ShardedOptions(2, 1, "kill");
  o.comm_timeout_ms = 3000;
  o.heartbeat_timeout_ms = 2000;
  auto cluster = cli::LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string addr = (*cluster)->address();

  std::atomic<bool> first = false;
  Streamed paused;
  std::thread stream([&] { paused = GreedyStream(addr, Prompt(32, 3), 3000, &first); });
  while (!first) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  // Far more prefill steps than can run before the kill.
  cluster::MeasureEngineRequest long_probe;
  for (int i = 0; i < 16; ++i) long_probe.add_prefill_tokens(2000 + i);
  long_probe.set_prefill_repeats(64);
  auto admin = testing_util::PlainStub<admin::Admin>(addr);
  grpc::Status measured;
  std::thread measure([&] {
    cluster::EngineMeasurement m;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    measured = admin->MeasureEngine(&ctx, long_probe, &m);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ASSERT_TRUE((*cluster)->KillWorker(1).ok());
  measure.join();
  stream.join();
  EXPECT_EQ(measured.error_code(), grpc::StatusCode::UNAVAILABLE) << measured.error_message();
  EXPECT_NE(measured.error_message().find("worker-1"), std::string::npos)
      << measured.error_message();
  EXPECT_EQ(paused.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << paused.status.error_message();

  ASSERT_TRUE((*cluster)->RestartWorker(1).ok());
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  admin::ClusterStatus status;
  while (std::chrono::steady_clock::now() < until) {
    grpc::ClientContext ctx;
    status.Clear();
    (void)admin->GetStatus(&ctx, admin::GetStatusRequest(), &status);
    if (status.state() == admin::READY) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // A survivor that died with its peer (as UCX's single-copy transport once
  // made it) leaves the instance waiting for it: say so.
  ASSERT_EQ(status.state(), admin::READY) << status.message() << "; " << (*cluster)->CheckAlive();
  const Streamed after = GreedyStream(addr, Prompt(24, 1), 8);
  EXPECT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.tokens.size(), 8u);
  cluster::EngineMeasurement m;
  grpc::ClientContext ctx;
  const grpc::Status again = admin->MeasureEngine(&ctx, SmallMeasurement(), &m);
  ASSERT_TRUE(again.ok()) << again.error_message();
  ExpectPlausible(m);
  EXPECT_TRUE((*cluster)->CheckAlive().ok()) << (*cluster)->CheckAlive();
}

}  // namespace
}  // namespace flotilla
