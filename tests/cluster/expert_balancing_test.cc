// Expert balancing end to end: a 4-worker EP-4 CPU cluster serving a tiny
// checkpoint whose router biases make experts 0 and 1 (both on rank 0) hot
// in every layer, under steady concurrent streams. flotillactl shows the
// skew, a rebalance (on request, or automatic) replicates the hot experts
// into spare slots, the next window measures the new balance, no request
// fails or stalls, and greedy tokens are the same before and after.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>

#include "tests/cluster/balancing_util.h"
#include "tests/cluster_options.h"
#include "tools/checkpoint/synthetic_checkpoint.h"

namespace flotilla {
namespace {
namespace fs = std::filesystem;
using balancing_test::Generate;
using balancing_test::Load;
using balancing_test::Stream;

nlohmann::json Ctl(const cli::LocalCluster& cluster, const std::string& args) {
  return balancing_test::Ctl(FLOTILLA_BIN_DIR, cluster, args);
}
nlohmann::json MeasuredLoad(const cli::LocalCluster& cluster, int window, uint64_t min_rows) {
  return balancing_test::MeasuredLoad(FLOTILLA_BIN_DIR, cluster, window, min_rows);
}

const std::vector<std::vector<int32_t>> kFixedPrompts = {{1, 2, 3, 4}, {500, 17, 900, 3, 3, 71}};

std::vector<std::vector<int32_t>> FixedTokens(const cli::LocalCluster& cluster) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& p : kFixedPrompts) {
    Stream s = Generate(cluster.address(), p, 16);
    EXPECT_TRUE(s.status.ok()) << s.status.error_message();
    out.push_back(s.tokens);
  }
  return out;
}

class ExpertBalancing : public ::testing::TestWithParam<bool> {
 protected:
  static void SetUpTestSuite() {
    dir_ =
        (fs::temp_directory_path() / ("flotilla-hot-experts-" + std::to_string(getpid()))).string();
    SyntheticCheckpointOptions o;
    o.hot_experts = {0, 1};
    o.hot_bias = 8;
    ASSERT_TRUE(WriteSyntheticCheckpoint(ModelConfig::Tiny(), o, dir_).ok());
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  absl::StatusOr<std::unique_ptr<cli::LocalCluster>> Start(bool automatic) {
    cli::LocalClusterOptions o = testing_util::TestClusterOptions(dir_, 4, 1);
    o.comm_timeout_ms = 5000;
    o.log_dir = dir_ + "-logs-" + (automatic ? "auto" : "manual");
    log_dir_ = o.log_dir;
    o.coordinator_args = {"--redundant-experts", "2", "--expert-window", "2"};
    if (automatic) {
      o.coordinator_args.insert(o.coordinator_args.end(),
                                // Long enough that the skew is measured before the first
                                // automatic rebalance even on a loaded 2-core machine. The
                                // threshold sits under the skew (~2.0) but above a window
                                // diluted by uneven counter reports: a CI run once
                                // rebalanced on a window that read 1.43 and planned for
                                // that, leaving 1.43 where the test measures after the
                                // first switch (a later interval would have gone on).
                                {"--rebalance-interval", "10", "--rebalance-min-imbalance", "1.6"});
    }
    return cli::LocalCluster::Start(o);
  }
  static std::string dir_;
  std::string log_dir_;
};
std::string ExpertBalancing::dir_;

TEST_P(ExpertBalancing, ReplicasBalanceTheHotExpertsWithoutLosingARequest) {
  const bool automatic = GetParam();
  auto cluster = Start(automatic);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const auto before_tokens = FixedTokens(**cluster);

  Load load((*cluster)->address(), 6);
  // The skew: rank 0 runs every token's two hot experts, the others share the rest.
  nlohmann::json skewed = MeasuredLoad(**cluster, 2, 2000);
  ASSERT_TRUE(skewed.is_object());
  EXPECT_EQ(skewed["map_version"], 1);
  EXPECT_NEAR(skewed["imbalance"].get<double>(), 2.0, 0.3) << skewed.dump();
  std::cout << "skewed: imbalance " << skewed["imbalance"] << " (worst layer "
            << skewed["max_layer_imbalance"] << "), " << skewed["total_tokens"] << " rows in "
            << skewed["window_seconds"] << " s" << std::endl;
  const double gap_before = load.largest_gap_s();

  uint64_t version = 1;
  if (automatic) {
    for (int i = 0; i < 300 && version == 1; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      version = Ctl(**cluster, "status")["expert_map_version"].get<uint64_t>();
    }
    EXPECT_EQ(version, 2u) << "the automatic rebalance did not happen";
  } else {
    nlohmann::json dry = Ctl(**cluster, "rebalance --dry-run");
    EXPECT_FALSE(dry["applied"].get<bool>());
    EXPECT_EQ(dry["version_after"], 1);
    nlohmann::json r = Ctl(**cluster, "rebalance");
    ASSERT_TRUE(r.is_object());
    std::cout << "rebalance: " << r.dump() << std::endl;
    for (const char* key : {"version_before", "version_after", "imbalance_before",
                            "imbalance_after", "bytes_moved", "duration_ms"}) {
      EXPECT_TRUE(r.contains(key)) << key << " missing: " << r.dump();
    }
    EXPECT_TRUE(r["applied"].get<bool>()) << r.dump();
    EXPECT_EQ(r["version_before"], 1);
    EXPECT_EQ(r["version_after"], 2);
    EXPECT_NEAR(r["imbalance_before"].get<double>(), 2.0, 0.3);
    EXPECT_LT(r["imbalance_after"].get<double>(), 1.25);
    EXPECT_GT(r["bytes_moved"].get<uint64_t>(), 0u);
    version = 2;
  }
  // The next window, under the new map, measured by the ranks themselves.
  nlohmann::json balanced = MeasuredLoad(**cluster, 2, 2000);
  ASSERT_TRUE(balanced.is_object());
  EXPECT_EQ(balanced["map_version"].get<uint64_t>(), version);
  EXPECT_LT(balanced["imbalance"].get<double>(), 1.25) << balanced.dump();
  std::cout << "balanced: imbalance " << balanced["imbalance"] << " (worst layer "
            << balanced["max_layer_imbalance"] << "), " << balanced["total_tokens"] << " rows in "
            << balanced["window_seconds"] << " s" << std::endl;
  EXPECT_LT(balanced["max_layer_imbalance"].get<double>(), 1.35) << balanced.dump();

  const int before_stop = load.done();
  load.Stop();
  EXPECT_GT(load.done(), before_stop);
  EXPECT_TRUE(load.failures().empty()) << load.failures().front();
  // No stream waited much longer than it did before the switch (a CPU step
  // of this model is milliseconds; generous: 1 s or 5x the earlier worst).
  std::cout << "largest gap between two tokens of a stream: " << load.largest_gap_s() * 1000
            << " ms (before the switch " << gap_before * 1000 << " ms), " << load.done()
            << " requests" << std::endl;
  EXPECT_LT(load.largest_gap_s(), std::max(1.0, 5 * gap_before));
  EXPECT_EQ(FixedTokens(**cluster), before_tokens);
  (*cluster)->Stop();
  // Every rank switched at the same step boundary.
  const std::vector<int64_t> steps = balancing_test::SwitchSteps(log_dir_, 4, version);
  EXPECT_GE(steps[0], 0);
  for (int64_t s : steps) EXPECT_EQ(s, steps[0]) << "switch steps differ";
}

INSTANTIATE_TEST_SUITE_P(OnRequestAndAutomatic, ExpertBalancing, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Automatic" : "OnRequest"; });

TEST(ExpertBalancingAdmin, DrainStopsAdmissionToTheGroupAndSetExpertMapChecksSlots) {
  cli::LocalClusterOptions o = testing_util::TestClusterOptions("synthetic:tiny", 2, 1, "drain");
  o.coordinator_args = {"--redundant-experts", "1"};
  auto cluster = cli::LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  nlohmann::json d = Ctl(**cluster, "drain worker-0");
  EXPECT_TRUE(d["drained"].get<bool>());
  nlohmann::json status = Ctl(**cluster, "status");
  ASSERT_EQ(status["drained_groups"].size(), 1u);
  for (int i = 0; i < 4; ++i)
    EXPECT_TRUE(Generate((*cluster)->address(), {1, 2, 3}, 4).status.ok());
  status = Ctl(**cluster, "status");
  for (const auto& w : status["workers"]) {
    if (w["worker_id"] == "worker-0") {
      EXPECT_TRUE(w["drained"].get<bool>());
    }
  }
  Ctl(**cluster, "drain worker-1");
  Stream refused = Generate((*cluster)->address(), {1, 2, 3}, 4);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(refused.status.error_message().find("drained"), std::string::npos);
  Ctl(**cluster, "undrain worker-1");
  EXPECT_TRUE(Generate((*cluster)->address(), {1, 2, 3}, 4).status.ok());
  auto [rc, out] = testing_util::RunCommandWithStderr(std::string(FLOTILLA_BIN_DIR) +
                                                      "/flotillactl --coordinator " +
                                                      (*cluster)->address() + " drain nobody");
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("no worker 'nobody'"), std::string::npos) << out;

  // A slot past the rank's slots (4 experts + 1 spare = 5) is refused.
  nlohmann::json map = Ctl(**cluster, "get-expert-map");
  map["version"] = std::to_string(std::stoull(map["version"].get<std::string>()) + 1);
  map["layers"][0]["experts"][0]["replicas"].push_back({{"rank", 1}, {"slot", 9}});
  const std::string file = o.log_dir + "/map.json";
  std::ofstream(file) << map.dump();
  auto [bad_rc, bad] = testing_util::RunCommandWithStderr(
      std::string(FLOTILLA_BIN_DIR) + "/flotillactl --coordinator " + (*cluster)->address() +
      " set-expert-map " + file);
  EXPECT_EQ(bad_rc, 1);
  EXPECT_NE(bad.find("slot 9 of rank 1, which has 5 expert slots"), std::string::npos) << bad;
  // In the spare slot: accepted; rank 1 loads expert 0 and both switch.
  map["layers"][0]["experts"][0]["replicas"].back()["slot"] = 4;
  std::ofstream(file) << map.dump();
  auto [ok_rc, ok] = testing_util::RunCommandWithStderr(
      std::string(FLOTILLA_BIN_DIR) + "/flotillactl --coordinator " + (*cluster)->address() +
      " set-expert-map " + file);
  EXPECT_EQ(ok_rc, 0) << ok;
  EXPECT_EQ(Ctl(**cluster, "status")["expert_map_version"], 2);

  // --watch refreshes (here twice); /metrics shows the map and the balance.
  auto [watch_rc, watched] =
      testing_util::RunCommand(std::string(FLOTILLA_BIN_DIR) + "/flotillactl --coordinator " +
                               (*cluster)->address() + " --json experts --watch 0.2 --count 2");
  EXPECT_EQ(watch_rc, 0);
  EXPECT_EQ(std::count(watched.begin(), watched.end(), '\n'), 2) << watched;
  httplib::Client http("http://" + (*cluster)->http_address());
  auto metrics = http.Get("/metrics");
  ASSERT_TRUE(metrics);
  // Labelled with the model like every series of /metrics.
  EXPECT_TRUE(std::regex_search(metrics->body,
                                std::regex("\nflotilla_expert_map_version\\{model_name=\"[^\"]+\"\\} 2\n")))
      << metrics->body;
  EXPECT_TRUE(std::regex_search(
      metrics->body, std::regex("\nflotilla_expert_layer_imbalance\\{model_name=\"[^\"]+\",layer=\"0\"\\}")))
      << metrics->body;
  EXPECT_TRUE(std::regex_search(
      metrics->body, std::regex("\nflotilla_expert_rank_tokens\\{model_name=\"[^\"]+\",rank=\"1\"\\}")))
      << metrics->body;
  EXPECT_TRUE(Generate((*cluster)->address(), {1, 2, 3}, 4).status.ok());
  (*cluster)->Stop();
}

}  // namespace
}  // namespace flotilla
