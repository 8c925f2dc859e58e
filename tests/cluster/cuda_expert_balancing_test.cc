// Expert balancing on CUDA workers: four sharded GPU workers (EP 4, sharing
// one GPU through CUDA IPC on a one-GPU machine) serving a tiny checkpoint
// whose router biases make experts 0 and 1 (both on rank 0) hot. The ranks'
// device counters show the skew, `flotillactl rebalance` loads replicas into
// the ranks' spare GPU slots and every rank switches at one step boundary;
// the next window is balanced, no request fails, and greedy tokens of fixed
// prompts are the same before and after. Prints the largest gap between two
// tokens of any stream during the switch, against the step time before.
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>

#include "kernels/cuda/device.h"
#include "tests/cluster/balancing_util.h"
#include "tests/cluster_options.h"
#include "tools/checkpoint/synthetic_checkpoint.h"

namespace flotilla {
namespace {
namespace fs = std::filesystem;
using balancing_test::Ctl;
using balancing_test::Generate;
using balancing_test::Load;
using balancing_test::MeasuredLoad;

std::string EnvOr(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

TEST(CudaExpertBalancing, HotSwapAndSwitchOnGpuWorkers) {
  if (kernels::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device: GPU workers need one";
  const std::string bin = EnvOr("FLOTILLA_BIN_DIR", FLOTILLA_BIN_DIR);
  const std::string dir =
      (fs::temp_directory_path() / ("flotilla-cuda-hot-" + std::to_string(getpid()))).string();
  SyntheticCheckpointOptions co;
  co.hot_experts = {0, 1};
  co.hot_bias = 8;
  ASSERT_TRUE(WriteSyntheticCheckpoint(ModelConfig::Tiny(), co, dir).ok());

  cli::LocalClusterOptions o = testing_util::TestClusterOptions(dir, 4, 1);
  o.device = "cuda";
  o.http_listen = "";
  o.bin_dir = bin;
  o.log_dir = dir + "-logs";
  o.gpu_memory_utilization = 0.85;
  o.ready_timeout = absl::Seconds(300);
  o.coordinator_args = {"--max-sequences",     "16", "--max-batch-tokens", "512",
                        "--redundant-experts", "2",  "--expert-window",    "2"};
  auto cluster = cli::LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status() << " (logs in " << o.log_dir << ")";
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4}, {500, 17, 900, 3, 3, 71}};
  std::vector<std::vector<int32_t>> before;
  for (const auto& p : prompts) before.push_back(Generate((*cluster)->address(), p, 16).tokens);

  Load load((*cluster)->address(), 8);
  nlohmann::json skewed = MeasuredLoad(bin, **cluster, 2, 2000);
  ASSERT_TRUE(skewed.is_object());
  std::cout << "before: " << skewed["imbalance"] << " imbalance, " << skewed["total_tokens"]
            << " expert rows in " << skewed["window_seconds"] << " s" << std::endl;
  EXPECT_GT(skewed["imbalance"].get<double>(), 1.6) << skewed.dump();
  const double gap_before = load.largest_gap_s();

  nlohmann::json r = Ctl(bin, **cluster, "rebalance");
  std::cout << "rebalance: " << r.dump() << std::endl;
  EXPECT_TRUE(r["applied"].get<bool>()) << r.dump();
  EXPECT_EQ(r["version_after"], 2);
  EXPECT_LT(r["imbalance_after"].get<double>(), 1.25);

  nlohmann::json balanced = MeasuredLoad(bin, **cluster, 2, 2000);
  ASSERT_TRUE(balanced.is_object());
  std::cout << "after: " << balanced["imbalance"] << " imbalance (worst layer "
            << balanced["max_layer_imbalance"] << ")" << std::endl;
  EXPECT_EQ(balanced["map_version"], 2);
  EXPECT_LT(balanced["imbalance"].get<double>(), 1.25) << balanced.dump();
  load.Stop();
  EXPECT_TRUE(load.failures().empty()) << load.failures().front();
  std::cout << "largest gap between tokens: " << load.largest_gap_s() * 1000 << " ms (before the "
            << "switch: " << gap_before * 1000 << " ms)" << std::endl;
  EXPECT_LT(load.largest_gap_s(), std::max(1.0, 5 * gap_before));
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(Generate((*cluster)->address(), prompts[i], 16).tokens, before[i]) << "prompt " << i;
  }
  (*cluster)->Stop();
  const std::vector<int64_t> steps = balancing_test::SwitchSteps(o.log_dir, 4, 2);
  EXPECT_GE(steps[0], 0);
  for (int64_t s : steps) EXPECT_EQ(s, steps[0]) << "switch steps differ";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace flotilla
