// `flotilla bench serve --workload prefix-tenants` against a real CPU
// cluster: the prefix cache serves most of every prompt, and the flags it
// cannot run with are refused.
#include <gtest/gtest.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cluster_options.h"
#include "tests/tools/bench_serve_in_process.h"
#include "tools/cli/bench_command.h"
#include "tools/cli/local_cluster.h"

namespace flotilla::cli {
namespace {

// bench serve's prefix-tenants workload (`load`: its shape and length) on
// `cluster`, the prefix cache read from its /metrics: the run's line.
nlohmann::json PrefixTenantsLoad(const LocalCluster& cluster, const std::string& load) {
  return BenchServeLine("--coordinator " + cluster.address() + " --metrics-url http://" +
                        cluster.http_address() + "/metrics --workload prefix-tenants " + load +
                        " --engine-compare off");
}

TEST(PrefixTenantsBench, MostOfEveryPromptComesFromThePrefixCache) {
  auto cluster =
      LocalCluster::Start(testing_util::TestClusterOptions("", 1, 0, "prefix-tenants-test"));
  ASSERT_TRUE(cluster.ok()) << cluster.status();

  const nlohmann::json j =
      PrefixTenantsLoad(**cluster,
                        "--tenants 4 --system-tokens 160 --user-tokens 8-16 --tenant-turns 3"
                        " --output-tokens 4 --concurrency 4 --duration 2 --seed 3");
  ASSERT_FALSE(j.empty());
  std::cerr << j.dump() << "\n";  // the figures, for the log
  SCOPED_TRACE(j.dump());
  EXPECT_EQ(j["requests_failed"].get<int>(), 0);
  const int answered = j["requests_ok"].get<int>();
  ASSERT_GT(answered, 8);
  EXPECT_EQ(j["ttft_ms"]["n"].get<int>(), answered);
  EXPECT_GT(j["ttft_ms"]["p90"].get<double>(), 0);
  const nlohmann::json& tenants = j["prefix_tenants"];
  EXPECT_EQ(tenants["tenants"].get<int>(), 4);
  EXPECT_EQ(tenants["per_turn"].size(), 3u);
  EXPECT_GT(tenants["per_turn"][1]["requests"].get<int>(), 0);  // follow-ups were sent
  const double shared = tenants["shared_ratio"].get<double>();
  EXPECT_GT(shared, 0.8);
  const nlohmann::json& cache = j["prefix_cache"];
  ASSERT_TRUE(cache["complete"].get<bool>());
  // Never above the shared share. Below it by at most: each tenant's system
  // prompt computed by each of the 4 streams that may ask for it at once,
  // and per request its last partial block and last token (blocks of at
  // most 16 tokens on CPU workers); however few requests a slow machine ran.
  const double hit = cache["hit_ratio"].get<double>();
  EXPECT_LE(hit, shared + 1e-9);
  const int64_t shared_tokens = tenants["shared_prompt_tokens"].get<int64_t>();
  const int64_t misses_allowed = (4 + 4) * (160 + 16) + int64_t{answered} * 32;
  EXPECT_GE(cache["hit_tokens"].get<int64_t>(), shared_tokens - misses_allowed);
  EXPECT_GT(cache["hit_tokens"].get<int64_t>(), 0);
}

// The prefix-cache hit ratio of one prefix-tenants load on `instances`
// instances of one CPU worker each, `kv_blocks` per worker, under `router`.
double HitRatio(int instances, int kv_blocks, const std::string& router) {
  LocalClusterOptions o = testing_util::TestClusterOptions("", instances);
  o.instances = instances;
  o.router = router;
  o.coordinator_args = {"--kv-blocks", std::to_string(kv_blocks)};
  auto cluster = LocalCluster::Start(o);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  if (!cluster.ok()) return -1;
  const nlohmann::json j =
      PrefixTenantsLoad(**cluster,
                        "--tenants 12 --system-tokens 256 --user-tokens 8-16 --tenant-turns 2"
                        " --output-tokens 2 --concurrency 4 --duration 10 --seed 5");
  if (j.empty()) return -1;
  std::cerr << instances << " instance(s), " << router << ": " << j.dump() << "\n";
  EXPECT_EQ(j["requests_failed"].get<int>(), 0);
  return j["prefix_cache"]["hit_ratio"].get<double>();
}

// Two instances, each with half the KV of one: routed by their caches, the
// tenants' system prompts split between them and the hit ratio stays near
// one instance's with all the KV; sent in turn, each instance needs every
// tenant and evicts them.
TEST(PrefixTenantsBench, CacheAwareRoutingKeepsOneInstancesHitRatio) {
  // 12 tenants x 16 token blocks of 16 tokens, each token block cached in
  // about 2 KV blocks on CPU workers (one per full-attention layer of the
  // tiny model; its sliding layers keep the last one or two): about 400 KV
  // blocks for all the system prompts, so one worker of 400 blocks evicts
  // some and one of 200 about as much when it holds half the tenants.
  const double single = HitRatio(1, 400, "cache-aware");
  const double aware = HitRatio(2, 200, "cache-aware");
  const double round_robin = HitRatio(2, 200, "round-robin");
  // The target: 0.9x one instance. Measured on 2 CPU cores
  // (coordinator/instances_notes.md) 0.95-1.00x since the router places
  // tenants by their working sets against the KV, and 0.32-0.41 above
  // round-robin.
  EXPECT_GE(aware, 0.9 * single) << "single " << single << ", cache-aware " << aware;
  EXPECT_GT(aware, round_robin + 0.15)
      << "cache-aware " << aware << ", round-robin " << round_robin;
}

TEST(PrefixTenantsBench, RefusesTheFlagsItCannotRunWith) {
  bool ok = true;
  EXPECT_TRUE(BenchServe("--workload prefix-tenants --rate 5", &ok).empty());
  EXPECT_FALSE(ok);
  EXPECT_TRUE(BenchServe("--workload prefix-tenants --multi-turn 2", &ok).empty());
  EXPECT_FALSE(ok);
  EXPECT_TRUE(BenchServe("--workload nonsense", &ok).empty());
  EXPECT_FALSE(ok);
  EXPECT_TRUE(BenchServe("--workload prefix-tenants --user-tokens 9-3", &ok).empty());
  EXPECT_FALSE(ok);
}

}  // namespace
}  // namespace flotilla::cli
